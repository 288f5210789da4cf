"""Progress: what running ranks report as they go, and the watchers it is pushed to.

Every rank of a running job reports iterations done, of how many, and payload bytes
sent so far (``job_progress``, rate limited on the rank); the job sums them
(:meth:`~.records.Job.report_progress`) and wakes its watchers. A watcher (``watch``)
gets a ``progress`` event (:meth:`~.records.Job.snapshot`: queued and what it waits for,
running and how far) whenever the job changed, at most every ``WATCH_INTERVAL``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from ..rpc import Session
from .jobs import JobState
from .records import Job

WATCH_INTERVAL = 0.25  # a watcher gets at most one progress event per this many seconds


def own_rank(jobs: Mapping[int, Job], daemon: str | None, params: dict[str, Any]) -> tuple[Job, int] | None:
    """The running job and rank a report (``params``: job_id, rank) is about, or None when
    it is about no running job; ValueError when that rank is not the reporting ``daemon``'s."""
    job = jobs.get(params.get("job_id"))  # type: ignore[arg-type]
    rank = params.get("rank")
    if job is None or job.state != JobState.RUNNING or not isinstance(rank, int):
        return None
    if job.members.get(rank) != daemon:
        raise ValueError(f"rank {rank} of job {job.id} is not this daemon")
    return job, rank


def progress(jobs: Mapping[int, Job], daemon: str | None, params: dict[str, Any]) -> None:
    """A rank's progress in its running job: iteration, of, bytes_sent (non-negative ints)."""
    numbers = [params.get(k, 0) for k in ("iteration", "of", "bytes_sent")]
    mine = own_rank(jobs, daemon, params)
    if mine is None:
        return
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
        raise ValueError("iteration, of and bytes_sent must be non-negative integers")
    mine[0].report_progress(mine[1], *numbers)


async def watch(session: Session, job: Job) -> None:
    """Push ``progress`` events to ``session`` as ``job`` changes, until it ends."""
    job.watchers.add(session)
    try:
        await _push_progress(session, job)
    finally:
        job.watchers.discard(session)


async def _push_progress(session: Session, job: Job) -> None:
    loop = asyncio.get_running_loop()
    last: dict[str, Any] | None = None
    while not job.done.is_set():
        updated = job.updated
        event = job.snapshot()
        if {**event, "elapsed_s": None} != last:
            await session.push("progress", event)
            last = {**event, "elapsed_s": None}
        pause = loop.time() + WATCH_INTERVAL
        await updated.wait()
        if not job.done.is_set():
            await asyncio.sleep(max(pause - loop.time(), 0))


def forget(jobs: Iterable[Job], session: Session) -> None:
    """``session`` closed: it watches nothing any more."""
    for job in jobs:
        job.watchers.discard(session)
