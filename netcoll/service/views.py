"""Read-only JSON views of a coordinator, served on its HTTP port
(:mod:`netcoll.service.http`) beside ``/metrics``:

``/jobs``
    ``{"submitted", "finished": {state: count}, "running": row or null,
    "queued": [rows, oldest first], "recent": [rows, newest first]}``; a row is
    :func:`job_row`: ``id``, ``op``, ``state``, ``size`` (bytes per rank, null
    when unknown), ``dtype``, ``world_size`` (the ranks it ran on, else the
    ranks it asked for), ``ranks`` (``rank``, ``address``), ``epoch``, the
    ``submitted_at`` / ``started_at`` / ``finished_at`` Unix times,
    ``queued_s`` and ``ran_s`` (seconds), ``time_s`` (per iteration, the
    slowest rank's), ``busbw``, ``verified``, ``error`` and ``waiting``.
``/status``
    what ``netcoll status --json`` shows (the ``cluster`` RPC:
    :meth:`~netcoll.service.scheduler.JobService.cluster`: ``epoch``,
    ``members`` with rank, address, epoch, state and current job, ``queued``,
    ``current_job``, recent ``jobs``, and the arrival ``board`` of the
    operations some rank is stuck in), plus ``board_text`` (the board as
    ``netcoll status`` prints it: :func:`netcoll.rendezvous.board.lines`) and
    ``groups`` (the embedded groups and their members, as the rendezvous
    ``status`` RPC gives them).

Both are bounded: at most :data:`MAX_JOBS` recent and :data:`MAX_JOBS` queued
jobs, :data:`MAX_ITEMS` items in any other list (a list cut short has a
sibling ``<key>_omitted`` count), :data:`MAX_TEXT` characters in a string, and
:data:`MAX_BODY` bytes in all (lists and strings are cut further until the
document fits). Strings from members and clients are JSON-encoded, never
interpreted. Nothing here changes state: no job data (arrays), no tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..rendezvous.board import lines
from .jobs import JobState

if TYPE_CHECKING:
    from .records import Job
    from .scheduler import JobService

MAX_JOBS = 100
MAX_ITEMS = 256
MAX_TEXT = 2000
MAX_BODY = 1 << 20
JSON_TYPE = "application/json"

__all__ = ["JSON_TYPE", "MAX_BODY", "bounded", "coordinator_views", "job_row", "jobs_view", "render", "status_view"]


def coordinator_views(svc: JobService) -> dict[str, Callable[[], Any]]:
    """The paths a coordinator's HTTP port serves as JSON (``HttpServer(views=...)``)."""
    return {"/jobs": lambda: jobs_view(svc), "/status": lambda: status_view(svc)}


def job_row(job: Job) -> dict[str, Any]:
    """One job as ``/jobs`` lists it (from its record, the one source of a job's fields)."""
    rec = job.record()
    spec = rec.get("spec") or {}
    start, end, submitted = rec.get("started_at"), rec.get("finished_at"), rec.get("submitted_at")
    waited_until = start if start is not None else (end if end is not None else time.time())
    return {
        "id": rec.get("id"),
        "op": rec.get("op"),
        "state": rec.get("state"),
        "size": job_size(job),
        "dtype": spec.get("dtype"),
        "world_size": rec.get("world_size") or spec.get("world_size"),
        "ranks": [{"rank": r.get("rank"), "address": r.get("address")} for r in rec.get("ranks") or []],
        "epoch": rec.get("epoch"),
        "submitted_at": submitted,
        "started_at": start,
        "finished_at": end,
        "queued_s": None if submitted is None else round(max(waited_until - submitted, 0.0), 3),
        "ran_s": None if start is None else round(max((end or time.time()) - start, 0.0), 3),
        "time_s": rec.get("time_s"),
        "busbw": rec.get("busbw"),
        "verified": rec.get("verified"),
        "error": rec.get("error"),
        "waiting": rec.get("waiting"),
    }


def job_size(job: Job) -> int | None:
    """Bytes per rank: generated data's ``size``, else the largest array sent with the
    job; None for named tensors (their size is on the ranks) and jobs without data."""
    if job.spec.size is not None:
        return int(job.spec.size)
    if job.inputs is not None and job.inputs.blobs:
        return max(len(b) for b in job.inputs.blobs)
    return None


def jobs_view(svc: JobService) -> dict[str, Any]:
    """``/jobs``: the running job, the queue (oldest first) and the last finished jobs."""
    queued = [j for j in svc.pending.values() if j.state == JobState.QUEUED]
    done = [j for j in reversed(svc.jobs.values()) if j.state.done]
    return {
        "submitted": svc.submitted,
        "finished": dict(svc.finished),
        "running": None if svc.current is None else job_row(svc.current),
        "queued": [job_row(j) for j in queued[:MAX_JOBS]],
        "queued_omitted": max(len(queued) - MAX_JOBS, 0),
        "recent": [job_row(j) for j in done[:MAX_JOBS]],
    }


def status_view(svc: JobService) -> dict[str, Any]:
    """``/status``: what ``netcoll status --json`` shows, the board as text, and the embedded groups."""
    doc = svc.cluster()
    doc["board_text"] = lines(doc.get("board") or [])
    doc["groups"] = svc.coord.status().get("groups", [])
    return doc


def bounded(value: Any, items: int = MAX_ITEMS, text: int = MAX_TEXT) -> Any:
    """``value`` with every list cut to ``items`` (a dict's cut list gets a
    ``<key>_omitted`` count beside it) and every string value to ``text`` characters."""
    if isinstance(value, str):
        return value if len(value) <= text else value[:text] + "..."
    if isinstance(value, (list, tuple)):
        return [bounded(v, items, text) for v in value[:items]]
    if isinstance(value, dict):  # (their keys are this module's and the records' own: kept)
        out: dict[str, Any] = {}
        for key, v in value.items():
            out[str(key)] = bounded(v, items, text)
            if isinstance(v, (list, tuple)) and len(v) > items:
                out[f"{key}_omitted"] = len(v) - items
        return out
    return value


def render(doc: Any, limit: int = MAX_BODY) -> str:
    """``doc`` as JSON of at most ``limit`` bytes: bounded, then cut further while too long."""
    items, text = MAX_ITEMS, MAX_TEXT
    while True:
        body = json.dumps(bounded(doc, items, text), default=str) + "\n"
        if len(body) <= limit or (items <= 1 and text <= 16):
            return body
        items, text = max(items // 4, 1), max(text // 4, 16)
