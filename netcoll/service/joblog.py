"""The coordinator's log line for each step of a job: submitted, started, ended.

One INFO line each, on the logger ``netcoll.jobs``. As text::

    job 9 submitted: all_reduce, 64 MiB float32 per rank, world size 4; 1 queued
    job 9 started: all_reduce, 64 MiB float32 per rank, on 4 ranks (epoch 3), after 0.012s queued
    job 9 failed after 3.2s: all_reduce, 64 MiB float32 per rank, on 4 ranks: rank 2: ...

With ``NETCOLL_LOG_FORMAT=json`` the same line also carries its fields
(:data:`netcoll.logs.DATA`): ``event`` (``job_submitted``, ``job_started``,
``job_ended``), ``job`` (the id, as on the ranks' lines of that job), ``op``,
``size`` (bytes per rank, or null), ``dtype``, ``world_size``, and by event
``queued`` (jobs in the queue), ``epoch``, ``ranks`` (addresses, by rank),
``queued_s``, ``state``, ``duration_s`` (from its start, or from its submit
when it never started), ``time_s``, ``busbw`` and ``error``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ..escape import escape
from ..logs import DATA
from ..sizes import format_size
from .views import MAX_TEXT, job_size

if TYPE_CHECKING:
    from .records import Job

log = logging.getLogger("netcoll.jobs")

__all__ = ["ended", "started", "submitted"]


def _fields(job: Job, event: str) -> dict[str, Any]:
    return {
        "event": event,
        "job": job.id,
        "op": job.spec.op,
        "size": job_size(job),
        "dtype": job.spec.dtype,
        "world_size": job.world_size or job.spec.world_size,
    }


def _what(job: Job) -> str:
    """``all_reduce, 64 MiB float32 per rank`` (or the named tensor, or just the op)."""
    size = job_size(job)
    if size is not None:
        return f"{escape(job.spec.op, 40)}, {format_size(size)} {escape(job.spec.dtype, 20)} per rank"
    if job.spec.input:
        return f"{escape(job.spec.op, 40)} of named tensor {escape(job.spec.input, 80)}"
    return escape(job.spec.op, 40)


def submitted(job: Job, queued: int) -> None:
    """A job was accepted into the queue (``queued``: jobs queued now, itself included)."""
    if not log.isEnabledFor(logging.INFO):
        return
    want = job.spec.world_size
    size = f"world size {want}" if want else "every ready rank"
    data = {**_fields(job, "job_submitted"), "queued": queued}
    log.info("job %d submitted: %s, %s; %d queued", job.id, _what(job), size, queued, extra={DATA: data})


def started(job: Job) -> None:
    """A job was sent to its ranks."""
    if not log.isEnabledFor(logging.INFO):
        return
    waited = (job.started_at or time.time()) - job.submitted_at
    data = {
        **_fields(job, "job_started"),
        "epoch": job.epoch,
        "ranks": [job.addresses.get(r) for r in range(job.world_size)],
        "queued_s": round(waited, 3),
    }
    log.info(
        "job %d started: %s, on %d ranks (epoch %s), after %.3fs queued",
        job.id,
        _what(job),
        job.world_size,
        job.epoch,
        waited,
        extra={DATA: data},
    )


def ended(job: Job) -> None:
    """A job ended: succeeded, failed or cancelled (with its error)."""
    if not log.isEnabledFor(logging.INFO):
        return
    since = job.started_at if job.started_at is not None else job.submitted_at
    seconds = max((job.finished_at or time.time()) - since, 0.0)
    error = None if job.error is None else escape(job.error, MAX_TEXT)
    data = {
        **_fields(job, "job_ended"),
        "state": job.state.value,
        "duration_s": round(seconds, 3),
        "time_s": job.time_s,
        "busbw": job.busbw,
        "error": error,
    }
    ranks = f", on {job.world_size} ranks" if job.world_size else " (never started)"
    log.info(
        "job %d %s after %.3fs: %s%s%s",
        job.id,
        job.state.value,
        seconds,
        _what(job),
        ranks,
        "" if error is None else f": {error}",
        extra={DATA: data},
    )
