"""A job's outcome: the ranks' reports accepted, then judged into one final state; no sockets.

A job ends ``succeeded`` with its time per call (the slowest rank's, per call, averaged)
and bandwidths, or ``failed`` / ``cancelled`` with a reason naming the ranks involved:
those lost, the failed ranks' reports merged into one error (:mod:`.failures`), those
that never reported (and which of them the coordinator sees alive but not progressing),
or the ranks whose result did not verify.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .failures import job_error
from .jobs import JobSpec, JobState
from .records import Job, slowest_per_call
from .watchers import own_rank


def accept(jobs: Mapping[int, Job], daemon: str | None, params: dict[str, Any], payload: memoryview) -> bool:
    """Keep a rank's final report (and its result arrays); False when no running job wants it."""
    mine = own_rank(jobs, daemon, params)
    if mine is None:
        return False
    job, rank = mine
    job.reports[rank] = dict(params)
    if payload.nbytes:
        job.payloads[rank] = bytes(payload)
    job.changed.set()
    return True


def conclude(job: Job, cancelled_for_loss: bool, unresponsive: Callable[[list[int]], list[str]]) -> None:
    """Finish ``job`` from its reports. ``cancelled_for_loss``: the others were cancelled
    because a rank was lost (their errors follow from it); ``unresponsive(ranks)`` names
    those of ``ranks`` seen alive but not progressing."""
    spec, n = job.spec, job.world_size
    failures = {r: rep for r, rep in job.reports.items() if not rep.get("ok")}
    missing = [r for r in range(n) if r not in job.reports]
    if job.cancel_requested:
        job.finish(JobState.CANCELLED, "cancelled while running")
        return
    if job.lost or failures or missing:
        if cancelled_for_loss:
            failures = {}
        parts = [job.lost[r] for r in sorted(job.lost)]
        parts += job_error(failures, spec.deadline)  # once, with the wait chain when ranks timed out
        quiet = [r for r in missing if r not in job.lost]
        if quiet:
            parts.append(f"ranks {quiet} never reported within the deadline")
            parts += unresponsive(quiet)
        job.finish(JobState.FAILED, "; ".join(parts))
        return
    times = slowest_per_call((rep.get("timings") or () for rep in job.reports.values()), spec.iters)
    job.time_s = sum(times) / len(times) if times else None
    nbytes = job.reports[0].get("nbytes", 0)
    if job.time_s:
        job.algbw, job.busbw = bandwidth(spec, nbytes, job.time_s, n)
    verified = [rep.get("verified") for rep in job.reports.values()]
    job.verified = None if any(v is None for v in verified) else all(verified)
    if job.verified is False:
        bad = [r for r, rep in sorted(job.reports.items()) if rep.get("verified") is False]
        job.finish(
            JobState.FAILED,
            f"result did not verify on ranks {bad} ({sum(job.reports[r].get('wrong', 0) for r in bad)} wrong elements)",
        )
        return
    job.finish(JobState.SUCCEEDED, None)


def bandwidth(spec: JobSpec, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s: the registry's nccl-tests factor; 1 for buffer jobs."""
    coll = spec.collective
    if coll is not None:
        return coll.bandwidth(nbytes, seconds, world)
    alg = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return alg, alg
