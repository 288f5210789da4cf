"""The job queue and its history: which job runs next, and what is kept; no sockets.

Jobs run one at a time, so every rank runs them in the same order: the next job is
the oldest queued job that can run now (:meth:`JobQueue.pick`). A job that needs more
ranks than are ready waits (its record says for what: "waiting for 2 more ranks (has 2
of 4)") without holding up later jobs that can run; among runnable jobs the order is
FIFO. A job's deadline counts from when the queue first considered it; one still
waiting for ranks then fails with a reason. Ranks are assigned by
:func:`~.records.rank_daemons` (unchanged membership keeps its order).

History is bounded (:meth:`JobQueue.trim`): the last ``history`` finished jobs, and
result arrays of the last ``max_result_jobs`` within ``max_result_bytes``.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any

from ..limits import DEFAULT, Limits
from . import admission
from .jobs import JobSpec, JobState
from .records import Daemon, Inputs, Job, rank_daemons

HISTORY = 1000  # finished jobs kept (in memory and in the journal)
IDLE_POLL = 1.0  # with nothing runnable, look again at least this often
#: what a status row leaves out of a job's record: per-rank detail that grows with ranks and calls
_DETAIL = ("timings", "model")
Picked = tuple[Job, list[Daemon]]  # a job to run and its members, by rank


class JobQueue:
    """Every job the service knows by id (queued, running, and the recent finished ones)."""

    def __init__(self, history: int = HISTORY, limits: Limits = DEFAULT) -> None:
        self.history = history
        self.limits = limits
        self.jobs: collections.OrderedDict[int, Job] = collections.OrderedDict()
        #: queued jobs, oldest first (the runner runs the first that can run now)
        self.pending: collections.OrderedDict[int, Job] = collections.OrderedDict()
        self.submitting = 0  # submits being journaled (they count against max_queued_jobs)
        self.ids = itertools.count(1)
        self.submitted = 0
        #: jobs ended so far, by final state (for metrics; unlike ``jobs``, never trimmed)
        self.finished: collections.Counter[str] = collections.Counter()

    def queued(self) -> int:
        """How many jobs wait to run."""
        return sum(j.state == JobState.QUEUED for j in self.pending.values())

    def admit(self, spec: JobSpec, inputs: Inputs | None, ready: int) -> None:
        """Refuse (ValueError) a submit over a limit (:mod:`.admission`), ``ready`` daemons ready."""
        admission.admit(spec, inputs, ready=ready, queued=len(self.pending) + self.submitting, limits=self.limits)

    def add(self, job: Job) -> None:
        """Queue a submitted job."""
        self.submitted += 1
        self.jobs[job.id] = job
        self.pending[job.id] = job

    def get(self, params: dict[str, Any]) -> Job:
        """The job ``params["id"]`` names (KeyError when unknown or trimmed)."""
        jid = params.get("id")
        job = self.jobs.get(jid) if isinstance(jid, int) else None
        if job is None:
            raise KeyError(f"no job {jid!r} (unknown, or dropped from the bounded history)")
        return job

    def pick(
        self, ready: list[Daemon], previous: tuple[str, ...] | None, now: float
    ) -> tuple[Job, list[Daemon]] | None:
        """The oldest queued job that can run now, with its members by rank (``previous``:
        the last epoch's member ids); jobs before it that cannot run are marked with what
        they wait for (and fail once past their deadline)."""
        for job in list(self.pending.values()):
            if job.state != JobState.QUEUED:
                del self.pending[job.id]
                continue
            if job.clock is None:
                job.clock = now
            want = job.spec.world_size
            runnable = bool(ready) and (want is None or len(ready) >= want)
            if now >= job.clock + job.spec.deadline:
                have = ", ".join(m.describe() for m in ready) or "none"
                job.finish(
                    JobState.FAILED,
                    f"waited {job.spec.deadline:g}s for {want or 'at least 1'} rank daemon(s); ready: {have}",
                )
                del self.pending[job.id]
            elif runnable:
                del self.pending[job.id]
                chosen = rank_daemons(ready, previous)
                chosen = chosen[:want] if want else chosen
                if admission.root_fits(job, len(chosen)):
                    job.set_waiting(None)
                    return job, chosen
            elif want is None:
                job.set_waiting("waiting for a rank daemon (none is ready)")
            else:
                more = want - len(ready)
                job.set_waiting(f"waiting for {more} more rank{'s' if more != 1 else ''} (has {len(ready)} of {want})")
        return None

    def idle_wait(self, now: float) -> float:
        """How long the runner may sleep with nothing runnable: until the next waiting job's
        deadline, at most IDLE_POLL."""
        ends = [j.clock + j.spec.deadline - now for j in self.pending.values() if j.clock is not None]
        return max(min([IDLE_POLL, *ends]), 0.01)

    def trim(self) -> None:
        """Bound the history: the last ``history`` finished jobs (unfinished ones always
        stay), and result arrays of the last ``max_result_jobs`` finished jobs only, within
        ``max_result_bytes`` (:mod:`netcoll.limits`); older results expire."""
        kept, total = 0, 0
        for job in reversed(self.jobs.values()):
            if job.payloads:
                size = sum(len(p) for p in job.payloads.values())
                if kept >= self.limits.max_result_jobs or total + size > self.limits.max_result_bytes:
                    job.payloads.clear()
                    job.results_expired = True
                else:
                    kept, total = kept + 1, total + size
        done = [jid for jid, job in self.jobs.items() if job.state.done]
        for jid in done[: max(len(done) - self.history, 0)]:
            del self.jobs[jid]

    def recent(self, n: int = 20) -> list[dict[str, Any]]:
        """The last ``n`` jobs' records, without per-rank timings and model stats."""
        return [{k: v for k, v in j.record().items() if k not in _DETAIL} for j in list(self.jobs.values())[-n:]]
