"""What a process records about its collectives for operators: durations and
outcomes (read by the ``/metrics`` collectors), the slow-operation threshold,
and trace spans of the jobs that ask for a timeline.

Kept cheap on the hot path: :func:`observe` is a dict lookup, a bisect and
three additions per operation; spans are recorded only while a
:class:`Recorder` is set in :data:`TRACE` (the engine reads it once per
operation; nothing happens when it is None).

A leaf module: it imports nothing of netcoll.
"""

from __future__ import annotations

import bisect
import contextvars
import time
from typing import Any

from . import settings

#: histogram bucket upper bounds (seconds) of netcoll_collective_duration_seconds
BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
DEFAULT_SLOW_OP_S = 5.0
FOLD_EVERY = 256  # observations kept as a list before they are sorted into buckets
MAX_SPANS = 50_000  # spans one rank records for one traced job; beyond that they are counted as dropped


def slow_op_s() -> float:
    """``NETCOLL_SLOW_OP_S``: an operation longer than this is logged at WARNING (0: never)."""
    value = settings.slow_op_s()
    if value is None:
        return DEFAULT_SLOW_OP_S
    return value if value > 0 else float("inf")


class Durations:
    """Per ``(collective, fingerprint)``: bucket counts, sum and count of durations.

    :meth:`observe` only appends to a short list (the hot path); :meth:`fold` sorts
    the list into buckets every :data:`FOLD_EVERY` observations and before each read.
    The fingerprint holds the algorithm (``algorithm=ring``); the collector reads it
    out at scrape time, so nothing is parsed per operation."""

    __slots__ = ("rows", "pending")

    def __init__(self) -> None:
        #: (name, fp) -> [count per bucket (+Inf last)..., sum, count]
        self.rows: dict[tuple[str, str], list[float]] = {}
        self.pending: list[tuple[str, str, float]] = []

    def observe(self, name: str, fp: str, seconds: float) -> None:
        pending = self.pending
        pending.append((name, fp, seconds))
        if len(pending) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> dict[tuple[str, str], list[float]]:
        """Move the pending observations into :attr:`rows`; return the rows."""
        pending, self.pending = self.pending, []
        rows, find = self.rows, bisect.bisect_left
        for name, fp, seconds in pending:
            row = rows.get((name, fp))
            if row is None:
                if len(rows) >= 4096:  # many distinct shapes: fold them into one row per collective
                    fp = ""
                    row = rows.get((name, fp))
                if row is None:
                    row = rows[(name, fp)] = [0.0] * (len(BUCKETS) + 3)
            row[find(BUCKETS, seconds)] += 1
            row[-2] += seconds
            row[-1] += 1
        return rows


def algorithm_of(fp: str) -> str:
    """The ``algorithm=`` part of a call fingerprint ("" when none)."""
    at = fp.find("algorithm=")
    if at < 0:
        return ""
    rest = fp[at + len("algorithm=") :]
    end = min((i for i in (rest.find(","), rest.find(")")) if i >= 0), default=len(rest))
    return rest[:end]


#: this process's collectives: durations of those that succeeded, counts by outcome
DURATIONS = Durations()
#: (collective, reason) -> count of failed ones ("timeout", "peer_lost", ...); the succeeded
#: ones are the histogram's counts
OUTCOMES: dict[tuple[str, str], int] = {}


def count(name: str, outcome: str) -> None:
    key = (name, outcome)
    OUTCOMES[key] = OUTCOMES.get(key, 0) + 1


# -- trace spans -------------------------------------------------------------------------------
class Recorder:
    """The spans of one traced job on one rank: ``(name, tid, start, end, args)``
    with times from :func:`time.monotonic` (seconds)."""

    __slots__ = ("spans", "dropped", "limit")

    def __init__(self, limit: int = MAX_SPANS) -> None:
        self.spans: list[tuple[str, str, float, float, dict[str, Any] | None]] = []
        self.dropped = 0
        self.limit = limit

    def add(self, name: str, tid: str, start: float, end: float, args: dict[str, Any] | None = None) -> None:
        if len(self.spans) >= self.limit:
            self.dropped += 1
            return
        self.spans.append((name, tid, start, end, args))

    def export(self, offset: float = 0.0) -> dict[str, Any]:
        """The spans as plain data, times shifted by ``offset`` (to the coordinator's clock)."""
        return {
            "spans": [[n, t, s + offset, e + offset, a] for n, t, s, e, a in self.spans],
            "dropped": self.dropped,
        }


#: the recorder of the traced job running in this context (None: not tracing, the usual case)
TRACE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("netcoll_trace", default=None)

now = time.monotonic

__all__ = [
    "BUCKETS",
    "DURATIONS",
    "MAX_SPANS",
    "OUTCOMES",
    "TRACE",
    "Durations",
    "Recorder",
    "algorithm_of",
    "count",
    "now",
    "slow_op_s",
]
