"""The coordinator's job service: a thin front that routes the job RPC methods and
runs the queue, one job at a time.

The rules live beside it, one module per set: :mod:`.registry` (the rank daemons
registered, ready or draining, and the epoch they run under), :mod:`.admission` (what a
submit must meet), :mod:`.queue` (which job runs next, the bounded history),
:mod:`.recovery` (jobs back from a :class:`~netcoll.service.journal.Journal` after a
restart), :mod:`.watchers` (progress reports and the watchers they are pushed to),
:mod:`.outcome` (a job's reports judged into its final state); :mod:`.records` holds
the records themselves. What is left here is the socket work: sending each rank its
job, cancelling, and waiting for reports.

Rank daemons register (``daemon_register``) over their rendezvous connection. Jobs run
one at a time, so every rank runs them in the same order: the next job is the oldest
queued job that can run now; one still waiting for ranks at its deadline fails with a
reason. Submits are refused, with a clear error, beyond the limits of
:mod:`netcoll.limits`.

With a :class:`~netcoll.service.journal.Journal` (``--state-dir``) jobs survive a
restart; without one, everything is in memory.

Before each job the service takes the current membership; if it differs from the last
job's (a daemon joined, left, died, or the last job failed), a new *epoch*
starts: ranks are re-assigned (rank hints first, then sorted member ids, so
ranks are contiguous and stable while membership holds) and the daemons link
up afresh under a new session id. No daemon restarts.

A job ends ``succeeded`` with its results, or ``failed`` / ``cancelled`` with a
reason naming the ranks involved; history is bounded.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .. import limits as _limits
from ..rendezvous.coordinator import Coordinator
from ..rpc import Reply, Session
from . import joblog, outcome, recovery, timeline, watchers
from .jobs import JobSpec, JobState
from .journal import Journal
from .queue import HISTORY, JobQueue
from .records import Daemon, Job, split_inputs
from .registry import Registry

log = logging.getLogger("netcoll.service")

#: the job methods a client-token session may call (the rest are members' only)
CLIENT_METHODS = frozenset({"submit", "wait", "job", "cancel", "members", "cluster", "watch"})
#: the RPC methods the service adds (``_rpc_<name>``)
METHODS = ("daemon_register", "daemon_drain", "job_result", "job_progress", *sorted(CLIENT_METHODS))
REPORT_GRACE = 5.0  # after a job's deadline (or a lost rank), how long to wait for the others' reports


class JobService:
    """Adds the job RPC methods to a :class:`Coordinator`."""

    def __init__(
        self,
        coordinator: Coordinator,
        *,
        history: int = HISTORY,
        journal: Journal | None = None,
        limits: _limits.Limits | None = None,
    ) -> None:
        self.coord = coordinator
        self.history = history
        self.journal = journal
        self.limits = limits or _limits.DEFAULT
        self.registry = Registry()
        self.queue = JobQueue(history, self.limits)
        self._cancel_now: set[int] = set()  # running jobs that lost a rank: the others are cancelled
        self.current: Job | None = None
        #: set when a job may have become runnable (members changed, a job was submitted or ended)
        self._members_changed = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        if journal is not None:
            recovery.recover(self.queue, journal.load(), self._on_finish, str(journal.directory))
        for name in METHODS:
            # clients (the client token) may submit, watch, get and cancel jobs and read status;
            # daemon_register / daemon_drain / job_result / job_progress are for members only
            coordinator.register(name, getattr(self, "_rpc_" + name), clients=name in CLIENT_METHODS)
        coordinator.close_hooks.append(self._on_close)
        self.traces = timeline.serve(self)  # clock, job_trace, trace: job timelines

    # -- the state, as metrics, views and tests read it ------------------------------------
    @property
    def members(self) -> dict[str, Daemon]:
        """The registered rank daemons by member id."""
        return self.registry.members

    @property
    def jobs(self) -> dict[int, Job]:
        """Every job kept, by id (queued, running, recent finished)."""
        return self.queue.jobs

    @property
    def pending(self) -> dict[int, Job]:
        """The queued jobs, oldest first."""
        return self.queue.pending

    @property
    def submitted(self) -> int:
        return self.queue.submitted

    @property
    def finished(self) -> dict[str, int]:
        """Jobs ended so far, by final state (never trimmed)."""
        return self.queue.finished

    @property
    def epoch(self) -> int:
        return self.registry.epoch

    def ready_members(self) -> list[Daemon]:
        return self.registry.ready()

    def start(self) -> None:
        if self._runner is None:
            self._runner = asyncio.create_task(self._run_jobs(), name="netcoll-job-runner")

    async def close(self) -> None:
        """Stop the runner: the running job fails (its daemons cancel it). Queued jobs fail
        too without a journal; with one they stay queued for the next coordinator."""
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
            self._runner = None
        for job in list(self.jobs.values()):
            if job.state == JobState.RUNNING or (job.state == JobState.QUEUED and self.journal is None):
                job.finish(JobState.FAILED, "the coordinator shut down")
        if self.journal is not None:
            await self.journal.flush()

    def _on_finish(self, job: Job) -> None:
        self.queue.finished[job.state.value] += 1
        joblog.ended(job)
        self._members_changed.set()  # the scheduler looks again (ranks may be free)
        if self.journal is not None:
            self.journal.post(self.journal.write_finish, job.id, job.state.value, job.record(), self.history)

    # -- daemons -------------------------------------------------------------------------
    async def _rpc_daemon_register(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        self.registry.register(session, params)
        self._members_changed.set()
        return {"epoch": self.epoch, "members": len(self.members)}

    async def _rpc_daemon_drain(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        if self.registry.drain(session):
            self._members_changed.set()
        return {}

    async def _on_close(self, session: Session) -> None:
        watchers.forget(self.jobs.values(), session)
        member = self.registry.remove(session)
        if member is None:
            return
        job = self.current
        # A rank that has reported its part left in order (a draining daemon finishes
        # its job, reports, then goes): only one that has not is lost to the job.
        r = job.rank_of.get(member.member_id) if job is not None else None
        if job is not None and r is not None and r not in job.reports:
            verdict = session.data.get("drop_verdict", "was lost")  # "is gone": its heartbeats stopped
            reason = session.data.get("drop_reason", "connection closed")
            job.lost[r] = f"rank {r} ({member.describe()}) {verdict}: {reason}"
            # The job cannot succeed: stop the others now. A stopped rank ("is gone") breaks
            # no link, so nothing else would tell them; a dead one's links break, but a rank
            # not talking to it yet (or computing) would only find out later.
            self._cancel_now.add(job.id)
            job.changed.set()
        self._members_changed.set()

    # -- jobs ----------------------------------------------------------------------------
    async def _rpc_submit(self, session: Session, params: dict[str, Any], payload: memoryview) -> dict[str, Any]:
        spec = JobSpec.model_validate(params.get("spec") or {})
        inputs = split_inputs(spec, params.get("inputs"), payload)
        if inputs is not None and inputs.per_rank is not None and spec.world_size is None:
            spec.world_size = len(inputs.per_rank)
        self.queue.admit(spec, inputs, len(self.ready_members()))
        job = Job(next(self.queue.ids), spec, inputs)
        job.on_finish = self._on_finish
        if self.journal is not None:
            self.queue.submitting += 1
            try:
                await self.journal.call(
                    self.journal.write_submit,
                    job.id,
                    spec.model_dump(),
                    job.submitted_at,
                    None if inputs is None else {"mode": inputs.mode, "arrays": inputs.metas},
                    None if inputs is None else inputs.blobs,
                )
            except Exception as exc:
                log.exception("job %d could not be journaled", job.id)
                raise RuntimeError(f"the coordinator could not record the job in its state dir: {exc}") from None
            finally:
                self.queue.submitting -= 1
        self.queue.add(job)
        joblog.submitted(job, self.queue.queued())
        self.queue.trim()
        self._members_changed.set()
        return {"id": job.id, "state": job.state.value}

    async def _rpc_job(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        rec: dict[str, Any] = self.queue.get(params).record()
        return rec

    async def _rpc_wait(self, session: Session, params: dict[str, Any], _: memoryview) -> Reply:
        job = self.queue.get(params)
        timeout = params.get("timeout")
        try:
            async with asyncio.timeout(timeout if isinstance(timeout, (int, float)) else None):
                await job.done.wait()
        except TimeoutError:
            pass
        result, payload = job.record(with_results=True)
        return Reply(result, payload)

    async def _rpc_cancel(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        job = self.queue.get(params)
        if job.state == JobState.QUEUED:
            job.finish(JobState.CANCELLED, "cancelled before it started")
        elif job.state == JobState.RUNNING:
            job.cancel_requested = True
            job.changed.set()
        rec: dict[str, Any] = job.record()
        return rec

    async def _rpc_watch(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        """Push ``progress`` events as the job changes (:mod:`.watchers`); reply with the
        final record once it ends."""
        job = self.queue.get(params)
        await watchers.watch(session, job)
        rec: dict[str, Any] = job.record()
        return rec

    async def _rpc_job_progress(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        watchers.progress(self.jobs, self.registry.daemon(session), params)
        return {}

    async def _rpc_job_result(self, session: Session, params: dict[str, Any], payload: memoryview) -> dict[str, Any]:
        return {"accepted": outcome.accept(self.jobs, self.registry.daemon(session), params, payload)}

    async def _rpc_members(self, session: Session, params: dict[str, Any], _: memoryview) -> list[dict[str, Any]]:
        return self.registry.rows(self.current)

    async def _rpc_cluster(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        return self.cluster()

    def cluster(self) -> dict[str, Any]:
        """What ``netcoll status`` shows (the ``cluster`` RPC, and ``/status`` on the HTTP port):
        epoch, members, queue length, the running job, recent jobs and the arrival board."""
        return {
            "epoch": self.epoch,
            "members": self.registry.rows(self.current),
            "queued": self.queue.queued(),
            "current_job": None if self.current is None else self.current.id,
            "jobs": self.queue.recent(20),  # per-rank timings and model stats stay in the job's record
            "board": self.coord.board(),  # the hang explainer: who each stuck operation waits for
        }

    # -- the runner ------------------------------------------------------------------------
    async def _run_jobs(self) -> None:
        while True:
            now = asyncio.get_running_loop().time()
            picked = self.queue.pick(self.ready_members(), self.registry.epoch_members, now)
            if picked is None:
                await _wait(self._members_changed, self.queue.idle_wait(asyncio.get_running_loop().time()))
                continue
            job, members = picked
            self.current = job
            try:
                await self._run(job, members)
            except asyncio.CancelledError:
                job.finish(JobState.FAILED, "the coordinator shut down")
                raise
            except Exception as exc:  # a job failure never stops the queue
                log.exception("job %d failed inside the coordinator", job.id)
                job.finish(JobState.FAILED, f"internal error in the coordinator: {exc!r}")
            finally:
                self.current = None

    async def _run(self, job: Job, members: list[Daemon]) -> None:
        loop = asyncio.get_running_loop()
        deadline = (job.clock if job.clock is not None else loop.time()) + job.spec.deadline
        self.registry.begin(members)
        job.start(self.epoch, members)
        joblog.started(job)
        if self.journal is not None:
            self.journal.post(self.journal.write_start, job.id, job.started_at)
        peers = [[m.host, m.port] for m in members]
        for rank, m in enumerate(members):
            fields = {
                "job_id": job.id,
                "spec": job.spec.model_dump(),
                "rank": rank,
                "world_size": len(members),
                "epoch": self.epoch,
                "session": self.registry.session,
                "peers": peers,
                "deadline": max(deadline - loop.time(), 0.001),
            }
            meta, data = job.inputs.for_rank(rank, job.spec) if job.inputs else (None, None)
            if meta is not None:
                fields["input"] = meta
            try:
                await m.session.push("job", fields, data)
            except Exception as exc:  # noqa: BLE001
                job.lost[rank] = f"rank {rank} ({m.describe()}) could not be sent the job: {exc}"
        await self._collect(job, deadline)

    async def _collect(self, job: Job, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        cancel_sent = False
        hard_end = deadline + REPORT_GRACE
        while len(job.reports.keys() | job.lost.keys()) < job.world_size:
            if job.lost:  # the others fail fast (cancelled, or their links broke); give them a moment
                hard_end = min(hard_end, loop.time() + REPORT_GRACE)
            if not cancel_sent and (job.cancel_requested or job.id in self._cancel_now):
                await self._broadcast_cancel(job)  # (a lost rank: stop the others)
                cancel_sent = True
                continue  # reports may have come in meanwhile: look again before waiting
            left = hard_end - loop.time()
            if left <= 0:
                break
            await _wait(job.changed, min(left, 1.0))
        if len(job.reports) < job.world_size and not cancel_sent:
            await self._broadcast_cancel(job)
        outcome.conclude(
            job,
            job.id in self._cancel_now,
            lambda ranks: self.registry.unresponsive(job, ranks, self.coord.unresponsive),
        )
        self._cancel_now.discard(job.id)
        self.queue.trim()
        if job.state != JobState.SUCCEEDED:
            self.registry.relink()  # re-link before the next job: links may be broken

    async def _broadcast_cancel(self, job: Job) -> None:
        for mid in job.rank_of:
            member = self.members.get(mid)
            if member is not None:
                try:
                    await member.session.push("cancel", {"job_id": job.id})
                except Exception:  # noqa: BLE001
                    pass


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Clear ``event``, then wait for it to be set again, at most ``seconds``."""
    event.clear()
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass
