"""Logging for every netcoll process: text or JSON lines, UTC times, and the
context a line was logged in (rank, epoch, job, operation, sequence).

``setup(level, who, fmt)`` installs one stderr handler on the root logger.
``fmt`` is ``"text"`` (``2026-01-02T03:04:05.678Z INFO [who] logger: msg``)
or ``"json"`` (one object a line: ``ts``, ``level``, ``logger``, ``msg``,
``who``, and ``rank``, ``epoch``, ``job``, ``op``, ``seq`` when known, plus
``exc`` for an exception, and the fields a line passes as ``extra={DATA: {...}}``);
the default comes from ``NETCOLL_LOG_FORMAT``.

The job context lives in :mod:`contextvars`, so it follows asyncio tasks: the
rank daemon sets ``rank``/``epoch``/``job`` with :func:`bind` while it runs a
job, and the engine records ``op``/``seq`` (and ``rank``) for the task that
drives an operation (:data:`OPERATIONS`, one dict entry per operation and no
formatting: the fields are read only when a line is actually emitted).

A leaf module: it imports nothing of netcoll.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

from . import settings

FORMATS = ("text", "json")
ENV_FORMAT = settings.registry.LOG_FORMAT.name

#: asyncio task -> ``(op name, seq, world rank)`` of the operation the engine is driving in
#: it, kept while DEBUG is enabled (a dict entry, not a context variable: setting one per
#: operation costs allocations that showed in the small-collective latency). The engine's
#: own lines carry the operation as ``extra={"netcoll_op": ...}`` (:func:`op_extra`) at any level.
OPERATIONS: dict[object, tuple[str, int, int]] = {}


def op_extra(name: str, seq: int, rank: int, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """``extra=`` for a line about operation ``name #seq`` on world rank ``rank``;
    ``fields``: the context the operation runs in (:func:`fields`), for a line logged
    outside it (a timer's: its context is whichever task armed the timer)."""
    if fields is None:
        return {"netcoll_op": (name, seq, rank)}
    return {"netcoll_op": (name, seq, rank), "netcoll_fields": fields}


def fields() -> dict[str, Any] | None:
    """The context fields bound here (:func:`bind`), to log with later elsewhere."""
    return FIELDS.get()


#: ``rank``/``epoch``/``job`` (and other fields) bound by the service around a job
FIELDS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("netcoll_log_fields", default=None)

_CONTEXT_KEYS = ("rank", "epoch", "job", "op", "seq")


def log_format(value: str | None = None) -> str:
    """``value`` (or ``$NETCOLL_LOG_FORMAT``, else ``text``), checked."""
    fmt = (value if value is not None else settings.log_format()).strip().lower() or "text"
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r} (NETCOLL_LOG_FORMAT)")
    return fmt


@contextlib.contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (e.g. ``rank=1, epoch=3, job=7``) to every line logged in this context."""
    merged = dict(FIELDS.get() or {})
    merged.update({k: v for k, v in fields.items() if v is not None})
    token = FIELDS.set(merged)
    try:
        yield
    finally:
        FIELDS.reset(token)


def context(current: tuple[str, int, int] | None = None, bound: dict[str, Any] | None = None) -> dict[str, Any]:
    """The context fields in effect here (only those known); ``current``: the operation
    a line names itself; ``bound``: the fields it runs with, when not those here."""
    out = dict((FIELDS.get() if bound is None else bound) or {})
    if current is None and OPERATIONS:
        try:
            current = OPERATIONS.get(asyncio.current_task())
        except RuntimeError:  # no event loop in this thread
            pass
    if current is not None:
        out["op"], out["seq"] = current[0], current[1]
        out.setdefault("rank", current[2])
    return out


class ContextFilter(logging.Filter):
    """Stamps each record with ``who`` and the context fields (read at emit time)."""

    def __init__(self, who: str) -> None:
        super().__init__()
        self.who = who

    def filter(self, record: logging.LogRecord) -> bool:
        record.who = self.who
        record.netcoll = context(getattr(record, "netcoll_op", None), getattr(record, "netcoll_fields", None))
        return True


def _utc(created: float) -> str:
    ms = int(created * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{ms:03d}Z"


#: ``extra={DATA: {...}}``: fields a JSON line carries beside its message (a job's id, op,
#: size, state, ...: ``netcoll.service.joblog``); never over the fields above, and not in text
DATA = "netcoll_data"


class JsonFormatter(logging.Formatter):
    """One JSON object a line; every string JSON-encoded (control characters escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        who = getattr(record, "who", None)
        if who:
            doc["who"] = who
        fields = getattr(record, "netcoll", None)
        if fields:
            for key in _CONTEXT_KEYS:
                if key in fields:
                    doc[key] = fields[key]
        data = getattr(record, DATA, None)
        if isinstance(data, dict):
            for key, value in data.items():
                doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        return json.dumps(doc, default=str, ensure_ascii=True)


class TextFormatter(logging.Formatter):
    """``TIME(UTC) LEVEL [who] logger: message (context)``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "netcoll", None)
        where = ""
        if fields:
            where = " (" + " ".join(f"{k}={fields[k]}" for k in _CONTEXT_KEYS if k in fields) + ")"
        line = f"{_utc(record.created)} {record.levelname:<7} [{getattr(record, 'who', '-')}] {record.name}: "
        line += record.getMessage() + where
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


_handler: logging.Handler | None = None


def setup(level: int | str, who: str, fmt: str | None = None) -> ContextFilter:
    """Log to stderr at ``level`` in ``fmt`` (default ``$NETCOLL_LOG_FORMAT``, else text);
    returns the filter so the caller can update ``who`` (a rank learns its member id later)."""
    global _handler
    if isinstance(level, str):
        level = int(getattr(logging, level.upper()))
    chosen = log_format(fmt)
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    handler = logging.StreamHandler(sys.stderr)
    tag = ContextFilter(who)
    handler.addFilter(tag)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    _handler = handler
    return tag


__all__ = [
    "ENV_FORMAT",
    "FIELDS",
    "FORMATS",
    "OPERATIONS",
    "ContextFilter",
    "JsonFormatter",
    "TextFormatter",
    "bind",
    "context",
    "fields",
    "op_extra",
    "log_format",
    "setup",
]
