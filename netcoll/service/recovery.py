"""Recovery after a restart: the jobs a :class:`~.journal.Journal` kept, back in the queue.

Queued jobs come back queued, a job that was running ends ``failed`` saying the
coordinator stopped under it, finished records stay queryable, and ids continue. A
stored job that can no longer be read (its spec no longer valid, an unknown state) fails
with the reason; a finished record that cannot be read is dropped with a warning.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Callable

from .jobs import JobSpec, JobState
from .journal import Recovered, StoredJob
from .queue import JobQueue
from .records import Inputs, Job

log = logging.getLogger("netcoll.service")

CRASHED = "the coordinator stopped while this job was running (crashed or killed); it did not finish: submit it again"


def recover(queue: JobQueue, state: Recovered, on_finish: Callable[[Job], None], where: str) -> None:
    """Put the jobs of ``state`` (read from the journal at ``where``) into ``queue``."""
    queue.ids = itertools.count(state.next_id)
    for stored in state.jobs:
        job = restored(stored, on_finish)
        if job is None:
            continue
        queue.jobs[job.id] = job
        if job.state == JobState.QUEUED:
            queue.pending[job.id] = job
    counts = collections.Counter(j.state.value for j in queue.jobs.values())
    log.info(
        "journal %s: %s; next job id %d",
        where,
        ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no jobs",
        state.next_id,
    )
    queue.trim()


def restored(stored: StoredJob, on_finish: Callable[[Job], None]) -> Job | None:
    """The job ``stored`` describes (None: a finished record that cannot be read)."""
    if stored.state in ("succeeded", "failed", "cancelled"):
        try:
            return Job.restore(stored.record or {})
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("journal: the record of job %d cannot be read (%s); dropped", stored.id, exc)
            return None
    try:
        spec = JobSpec.model_validate(stored.spec)
    except ValueError as exc:
        spec, stored.problem = JobSpec.model_construct(**stored.spec), f"its spec is no longer valid: {exc}"
    inputs = None
    if stored.inputs is not None and stored.blobs is not None:
        inputs = Inputs(stored.inputs["mode"], stored.inputs["arrays"], stored.blobs)
    job = Job(stored.id, spec, inputs)
    job.submitted_at, job.started_at = stored.submitted_at, stored.started_at
    job.on_finish = on_finish
    if stored.problem is not None:
        job.finish(JobState.FAILED, f"could not be restored after a coordinator restart: {stored.problem}")
    elif stored.state == "running":
        job.finish(JobState.FAILED, CRASHED)
    elif stored.state != "queued":
        job.finish(JobState.FAILED, f"unknown state {stored.state!r} in the journal")
    return job
