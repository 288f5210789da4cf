"""Admission: the rules a submitted job must meet before it is queued, and before it
runs; no sockets.

A submit is refused, with a ``ValueError`` naming the limit and its ``NETCOLL_LIMIT_*``
variable (:mod:`netcoll.limits`), for a ``world_size`` above ``max_world_size``, a
deadline above ``max_deadline_s``, an inline array above ``max_job_bytes`` or a full
queue (``max_queued_jobs``); and for a root outside the ready ranks when the job takes
every ready daemon (with a ``world_size``, :class:`~.jobs.JobSpec` checked the root).
When a job is picked, its root must still be one of the ranks it would run on
(:func:`root_fits`): daemons may have left since.
"""

from __future__ import annotations

from ..limits import DEFAULT, Limits
from .jobs import JobSpec, JobState
from .records import Inputs, Job


def admit(spec: JobSpec, inputs: Inputs | None, *, ready: int, queued: int, limits: Limits = DEFAULT) -> None:
    """Refuse (ValueError) a job that breaks a limit, with ``ready`` daemons ready and
    ``queued`` jobs in the queue."""
    if spec.world_size is not None and spec.world_size > limits.max_world_size:
        raise ValueError(
            f"world_size {spec.world_size} exceeds the limit of {limits.max_world_size} ranks "
            "(max_world_size, NETCOLL_LIMIT_MAX_WORLD_SIZE)"
        )
    if spec.deadline > limits.max_deadline_s:
        raise ValueError(
            f"deadline {spec.deadline:g}s exceeds the limit of {limits.max_deadline_s:g}s "
            "(max_deadline_s, NETCOLL_LIMIT_MAX_DEADLINE_S)"
        )
    if inputs is not None:
        biggest = max((len(b) for b in inputs.blobs), default=0)
        if biggest > limits.max_job_bytes:
            raise ValueError(
                f"an input array of {biggest} bytes exceeds the limit of {limits.max_job_bytes} bytes per rank "
                "(max_job_bytes, NETCOLL_LIMIT_MAX_JOB_BYTES)"
            )
    admit_root(spec, ready)
    if queued >= limits.max_queued_jobs:
        raise ValueError(
            f"the queue is full: {queued} jobs queued, the limit is {limits.max_queued_jobs} "
            "(max_queued_jobs, NETCOLL_LIMIT_MAX_QUEUED_JOBS); retry when some have run"
        )


def admit_root(spec: JobSpec, ready: int) -> None:
    """A job on every ready daemon (no ``world_size``) needs its root among the ``ready``
    ones now (with a ``world_size``, JobSpec checked it): refused here, it never reaches a rank."""
    coll = spec.collective
    if coll is None or not coll.takes_root or spec.world_size is not None or spec.root < max(ready, 1):
        return
    raise ValueError(
        f"root {spec.root} is out of range: {ready} rank daemon{'s are' if ready != 1 else ' is'} ready "
        f"(valid roots are 0..{ready - 1}); to wait for more, set world_size (--world-size) above the root"
    )


def root_fits(job: Job, world: int) -> bool:
    """False (and the job failed, before any rank sees it) when its root is not one of
    the ``world`` ranks it would run on (the daemons left since it was submitted)."""
    coll = job.spec.collective
    if coll is None or not coll.takes_root or job.spec.root < world:
        return True
    ranks = f"{world} rank{'s' if world != 1 else ''}"
    job.finish(
        JobState.FAILED,
        f"root {job.spec.root} is out of range for the {ranks} ready (ranks left since it was submitted)",
    )
    return False
