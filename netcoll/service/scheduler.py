"""The coordinator's job service: daemon membership, epochs, and the job queue.

Rank daemons register (``daemon_register``) over their rendezvous connection;
the address a daemon is *seen* from is what its peers dial. Jobs run one at a
time, so every rank runs them in the same order: the next job is the oldest
queued job that can run now. A job that needs more ranks than are ready waits
(its record says for what: "waiting for 2 more ranks (has 2 of 4)") without
holding up later jobs that can run; among runnable jobs the order is FIFO. A
job's deadline counts from when the scheduler first considered it; one still
waiting for ranks then fails with a reason. Submits are refused, with a clear
error, beyond ``max_queued_jobs`` queued jobs, a ``world_size`` above
``max_world_size``, a deadline above ``max_deadline_s`` or inline arrays above
``max_job_bytes`` (:mod:`netcoll.limits`).

With a :class:`~netcoll.service.journal.Journal` (``--state-dir``) jobs survive a
restart: queued jobs come back queued, a job that was running ends ``failed``
saying the coordinator stopped under it, finished records stay queryable (the
last ``history``), and ids continue. Without one, everything is in memory.

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
import collections
import itertools
import logging
import secrets
import time
from typing import Any

from .. import limits as _limits
from ..escape import escape
from ..rendezvous.coordinator import Coordinator
from ..rendezvous.groups import is_loopback
from ..rpc import Reply, Session
from . import joblog, timeline
from .failures import job_error
from .jobs import JobSpec, JobState
from .journal import Journal, Recovered, StoredJob
from .records import Inputs, Job, Member, assign_ranks, slowest_per_call, split_inputs

log = logging.getLogger("netcoll.service")

#: the job methods a client-token session may call (the rest are members' only)
CLIENT_METHODS = frozenset({"submit", "wait", "job", "cancel", "members", "cluster", "watch"})
REPORT_GRACE = 5.0  # after a job's deadline (or a lost rank), how long to wait for the others' reports
HISTORY = 1000  # finished jobs kept (in memory and in the journal)
IDLE_POLL = 1.0  # with nothing runnable, look again at least this often
WATCH_INTERVAL = 0.25  # a watcher gets at most one progress event per this many seconds
CRASHED = "the coordinator stopped while this job was running (crashed or killed); it did not finish: submit it again"


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
        self.members: dict[str, Member] = {}
        self.jobs: collections.OrderedDict[int, Job] = collections.OrderedDict()
        #: queued jobs, oldest first (the scheduler runs the first that can run now)
        self.pending: collections.OrderedDict[int, Job] = collections.OrderedDict()
        self._submitting = 0  # submits being journaled (they count against max_queued_jobs)
        self._cancel_now: set[int] = set()  # running jobs that lost a rank: the others are cancelled
        self.current: Job | None = None
        self.epoch = 0
        self.session = ""
        self.epoch_members: tuple[str, ...] | None = None
        self._ids = itertools.count(1)
        self.submitted = 0
        #: jobs ended so far, by final state (for metrics; unlike ``jobs``, never trimmed)
        self.finished: collections.Counter[str] = collections.Counter()
        #: set when a job may have become runnable (members changed, a job was submitted or ended)
        self._members_changed = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        if journal is not None:
            self._recover(journal.load())
        for name in (
            "daemon_register",
            "daemon_drain",
            "job_result",
            "job_progress",
            "submit",
            "wait",
            "job",
            "cancel",
            "members",
            "cluster",
            "watch",
        ):
            # clients (the client token) may submit, watch, get and cancel jobs and read status;
            # daemon_register / daemon_drain / job_result / job_progress are for members only
            coordinator.register(name, getattr(self, "_rpc_" + name), clients=name in CLIENT_METHODS)
        coordinator.close_hooks.append(self._on_close)
        self.traces = timeline.serve(self)  # clock, job_trace, trace: job timelines

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

    # -- the journal ----------------------------------------------------------------------
    def _recover(self, state: Recovered) -> None:
        """Jobs from before a restart: queued ones queue again, running ones fail, records stay."""
        self._ids = itertools.count(state.next_id)
        for stored in state.jobs:
            job = self._restored(stored)
            if job is None:
                continue
            self.jobs[job.id] = job
            if job.state == JobState.QUEUED:
                self.pending[job.id] = job
        counts = collections.Counter(j.state.value for j in self.jobs.values())
        log.info(
            "journal %s: %s; next job id %d",
            self.journal.directory if self.journal else "-",
            ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no jobs",
            state.next_id,
        )
        self._trim()

    def _restored(self, stored: StoredJob) -> Job | None:
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
        job.on_finish = self._on_finish
        if stored.problem is not None:
            job.finish(JobState.FAILED, f"could not be restored after a coordinator restart: {stored.problem}")
        elif stored.state == "running":
            job.finish(JobState.FAILED, CRASHED)
        elif stored.state != "queued":
            job.finish(JobState.FAILED, f"unknown state {stored.state!r} in the journal")
        return job

    def _on_finish(self, job: Job) -> None:
        self.finished[job.state.value] += 1
        joblog.ended(job)
        self._members_changed.set()  # the scheduler looks again (ranks may be free)
        if self.journal is not None:
            self.journal.post(self.journal.write_finish, job.id, job.state.value, job.record(), self.history)

    # -- membership --------------------------------------------------------------------
    def ready_members(self) -> list[Member]:
        return [m for m in self.members.values() if not m.draining and m.session.proto.lost is None]

    async def _rpc_daemon_register(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        member_id, port, http_port = params.get("member_id"), params.get("listen_port"), params.get("http_port")
        hint, advertise = params.get("rank_hint"), params.get("advertise_host")
        if not isinstance(member_id, str) or not member_id or len(member_id) > 200:
            raise ValueError("member_id must be a non-empty string")
        if not isinstance(port, int) or not _is_port(port):
            raise ValueError(f"listen_port must be a TCP port, got {port!r}")
        if http_port is not None and not _is_port(http_port):
            raise ValueError(f"http_port must be a TCP port or None, got {http_port!r}")
        if hint is not None and (not isinstance(hint, int) or isinstance(hint, bool) or hint < 0):
            raise ValueError(f"rank_hint must be a non-negative int, got {hint!r}")
        seen = session.peer[0]
        host = advertise if isinstance(advertise, str) and advertise else seen
        if is_loopback(host) and not is_loopback(seen):
            raise ValueError(
                f"daemon {member_id} advertises {host}, but it connects from {seen}: peers on "
                "other hosts cannot reach a loopback address (drop --advertise-host)"
            )
        others = [m for m in self.members.values() if m.member_id != member_id]
        if others and is_loopback(host) != is_loopback(others[0].host):
            raise ValueError(
                f"daemon {member_id} at {host} cannot join daemons at {others[0].host}: "
                "a cluster cannot mix loopback and routable addresses (in a container, "
                "127.0.0.1 is the container itself)"
            )
        old = self.members.get(member_id)
        if old is not None and old.session is not session and old.session.proto.lost is None:
            raise ValueError(f"member id {member_id!r} is already registered from {old.host}:{old.port}")
        self.members[member_id] = Member(member_id, session, host, port, hint, http_port=http_port)
        session.data["daemon"] = member_id
        log.info(
            "daemon %s registered at %s:%d (HTTP port %s, hint %s)",
            escape(member_id),
            escape(host),
            port,
            http_port or "off",
            escape(hint),
        )
        self._members_changed.set()
        return {"epoch": self.epoch, "members": len(self.members)}

    async def _rpc_daemon_drain(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        member = self.members.get(session.data.get("daemon", ""))
        if member is not None:
            member.draining = True
            self._members_changed.set()
        return {}

    async def _on_close(self, session: Session) -> None:
        self._watchers_drop(session)
        member_id = session.data.get("daemon")
        member = self.members.get(member_id) if isinstance(member_id, str) else None
        if member is None or member.session is not session:
            return
        assert isinstance(member_id, str)
        del self.members[member_id]
        reason = session.data.get("drop_reason", "connection closed")
        log.log(
            logging.INFO if member.draining else logging.WARNING,
            "daemon %s left: %s",
            member.describe(),
            "drained" if member.draining else escape(reason),
        )
        job = self.current
        # A rank that has reported its part left in order (a draining daemon finishes
        # its job, reports, then goes): only one that has not is lost to the job.
        r = job.rank_of.get(member_id) if job is not None else None
        if job is not None and r is not None and r not in job.reports:
            verdict = session.data.get("drop_verdict", "was lost")  # "is gone": its heartbeats stopped
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
        self._admit(spec, inputs)
        job = Job(next(self._ids), spec, inputs)
        job.on_finish = self._on_finish
        if self.journal is not None:
            self._submitting += 1
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
                self._submitting -= 1
        self.submitted += 1
        self.jobs[job.id] = job
        self.pending[job.id] = job
        joblog.submitted(job, sum(j.state == JobState.QUEUED for j in self.pending.values()))
        self._trim()
        self._members_changed.set()
        return {"id": job.id, "state": job.state.value}

    def _admit(self, spec: JobSpec, inputs: Inputs | None) -> None:
        """The limits a submit must respect (ValueError naming the limit otherwise)."""
        lim = self.limits
        if spec.world_size is not None and spec.world_size > lim.max_world_size:
            raise ValueError(
                f"world_size {spec.world_size} exceeds the limit of {lim.max_world_size} ranks "
                "(max_world_size, NETCOLL_LIMIT_MAX_WORLD_SIZE)"
            )
        if spec.deadline > lim.max_deadline_s:
            raise ValueError(
                f"deadline {spec.deadline:g}s exceeds the limit of {lim.max_deadline_s:g}s "
                "(max_deadline_s, NETCOLL_LIMIT_MAX_DEADLINE_S)"
            )
        if inputs is not None:
            biggest = max((len(b) for b in inputs.blobs), default=0)
            if biggest > lim.max_job_bytes:
                raise ValueError(
                    f"an input array of {biggest} bytes exceeds the limit of {lim.max_job_bytes} bytes per rank "
                    "(max_job_bytes, NETCOLL_LIMIT_MAX_JOB_BYTES)"
                )
        self._admit_root(spec)
        queued = len(self.pending) + self._submitting
        if queued >= lim.max_queued_jobs:
            raise ValueError(
                f"the queue is full: {queued} jobs queued, the limit is {lim.max_queued_jobs} "
                "(max_queued_jobs, NETCOLL_LIMIT_MAX_QUEUED_JOBS); retry when some have run"
            )

    def _admit_root(self, spec: JobSpec) -> None:
        """A job on every ready daemon (no ``world_size``) needs its root among them now
        (with a ``world_size``, JobSpec checked it): refused here, it never reaches a rank."""
        coll = spec.collective
        ready = len(self.ready_members())
        if coll is None or not coll.takes_root or spec.world_size is not None or spec.root < max(ready, 1):
            return
        raise ValueError(
            f"root {spec.root} is out of range: {ready} rank daemon{'s are' if ready != 1 else ' is'} ready "
            f"(valid roots are 0..{ready - 1}); to wait for more, set world_size (--world-size) above the root"
        )

    def _get(self, params: dict[str, Any]) -> Job:
        jid = params.get("id")
        job = self.jobs.get(jid) if isinstance(jid, int) else None
        if job is None:
            raise KeyError(f"no job {jid!r} (unknown, or dropped from the bounded history)")
        return job

    async def _rpc_job(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        rec: dict[str, Any] = self._get(params).record()
        return rec

    async def _rpc_wait(self, session: Session, params: dict[str, Any], _: memoryview) -> Reply:
        job = self._get(params)
        timeout = params.get("timeout")
        try:
            async with asyncio.timeout(timeout if isinstance(timeout, (int, float)) else None):
                await job.done.wait()
        except TimeoutError:
            pass
        result, payload = job.record(with_results=True)
        return Reply(result, payload)

    async def _rpc_cancel(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        job = self._get(params)
        if job.state == JobState.QUEUED:
            job.finish(JobState.CANCELLED, "cancelled before it started")
        elif job.state == JobState.RUNNING:
            job.cancel_requested = True
            job.changed.set()
        rec: dict[str, Any] = job.record()
        return rec

    async def _rpc_watch(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        """Push ``progress`` events (:meth:`Job.snapshot`: queued and what it waits for,
        running and how far) as the job changes, at most every WATCH_INTERVAL; reply
        with the final record once it ends."""
        job = self._get(params)
        job.watchers.add(session)
        try:
            await self._push_progress(session, job)
        finally:
            job.watchers.discard(session)
        rec: dict[str, Any] = job.record()
        return rec

    @staticmethod
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

    def _watchers_drop(self, session: Session) -> None:
        for job in self.jobs.values():
            job.watchers.discard(session)

    async def _rpc_job_progress(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        """A rank's progress in its running job: timed iterations done, of how many, and
        payload bytes sent so far (rate limited on the rank; watchers are woken)."""
        job = self.jobs.get(params.get("job_id"))  # type: ignore[arg-type]
        rank, numbers = params.get("rank"), [params.get(k, 0) for k in ("iteration", "of", "bytes_sent")]
        if job is None or job.state != JobState.RUNNING or not isinstance(rank, int):
            return {}
        if job.members.get(rank) != session.data.get("daemon"):
            raise ValueError(f"rank {rank} of job {job.id} is not this daemon")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers):
            raise ValueError("iteration, of and bytes_sent must be non-negative integers")
        job.report_progress(rank, *numbers)
        return {}

    async def _rpc_job_result(self, session: Session, params: dict[str, Any], payload: memoryview) -> dict[str, Any]:
        job = self.jobs.get(params.get("job_id"))  # type: ignore[arg-type]
        rank = params.get("rank")
        if job is None or job.state != JobState.RUNNING or not isinstance(rank, int):
            return {"accepted": False}
        if job.members.get(rank) != session.data.get("daemon"):
            raise ValueError(f"rank {rank} of job {job.id} is not this daemon")
        job.reports[rank] = dict(params)
        if payload.nbytes:
            job.payloads[rank] = bytes(payload)
        job.changed.set()
        return {"accepted": True}

    async def _rpc_members(self, session: Session, params: dict[str, Any], _: memoryview) -> list[dict[str, Any]]:
        return self._member_rows()

    async def _rpc_cluster(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        return self.cluster()

    def cluster(self) -> dict[str, Any]:
        """What ``netcoll status`` shows (the ``cluster`` RPC, and ``/status`` on the HTTP port):
        epoch, members, queue length, the running job, recent jobs and the arrival board."""
        # a summary: per-rank timings and model stats stay in the job's own record (``job``)
        recent = [_summary(j.record()) for j in list(self.jobs.values())[-20:]]
        return {
            "epoch": self.epoch,
            "members": self._member_rows(),
            "queued": sum(j.state == JobState.QUEUED for j in self.pending.values()),
            "current_job": None if self.current is None else self.current.id,
            "jobs": recent,
            "board": self.coord.board(),  # the hang explainer: who each stuck operation waits for
        }

    def _member_rows(self) -> list[dict[str, Any]]:
        ranks = {mid: r for r, mid in enumerate(self.epoch_members or ())}
        job = self.current
        rows = []
        for m in sorted(self.members.values(), key=lambda m: (ranks.get(m.member_id, 1 << 30), m.member_id)):
            busy_job = job if job is not None and m.member_id in job.rank_of else None
            rows.append(
                {
                    "member_id": m.member_id,
                    "rank": ranks.get(m.member_id),
                    "address": f"{m.host}:{m.port}",
                    "host": m.host,
                    "port": m.port,
                    "http_port": m.http_port,
                    "rank_hint": m.rank_hint,
                    "epoch": self.epoch,
                    "state": "draining" if m.draining else ("busy" if busy_job else "ready"),
                    "current_job": busy_job.id if busy_job else None,
                    "registered_for_s": round(time.time() - m.since, 1),
                }
            )
        return rows

    def _trim(self) -> None:
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

    # -- the runner ------------------------------------------------------------------------
    async def _run_jobs(self) -> None:
        while True:
            picked = self._pick()
            if picked is None:
                await _wait(self._members_changed, self._idle_wait())
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

    def _pick(self) -> tuple[Job, list[Member]] | None:
        """The oldest queued job that can run now, with its members; jobs before it that
        cannot run are marked with what they wait for (and fail once past their deadline)."""
        now = asyncio.get_running_loop().time()
        ready = self.ready_members()
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
                chosen = assign_ranks(ready, self.epoch_members)
                chosen = chosen[:want] if want else chosen
                if self._root_fits(job, len(chosen)):
                    job.set_waiting(None)
                    return job, chosen
            elif want is None:
                job.set_waiting("waiting for a rank daemon (none is ready)")
            else:
                more = want - len(ready)
                job.set_waiting(f"waiting for {more} more rank{'s' if more != 1 else ''} (has {len(ready)} of {want})")
        return None

    @staticmethod
    def _root_fits(job: Job, world: int) -> bool:
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

    def _idle_wait(self) -> float:
        """How long the runner may sleep with nothing runnable: until the next waiting job's
        deadline, at most IDLE_POLL."""
        now = asyncio.get_running_loop().time()
        ends = [j.clock + j.spec.deadline - now for j in self.pending.values() if j.clock is not None]
        return max(min([IDLE_POLL, *ends]), 0.01)

    async def _run(self, job: Job, members: list[Member]) -> None:
        loop = asyncio.get_running_loop()
        deadline = (job.clock if job.clock is not None else loop.time()) + job.spec.deadline
        ids = tuple(m.member_id for m in members)
        if ids != self.epoch_members:
            self.epoch += 1
            self.session = secrets.token_hex(8)
            self.epoch_members = ids
            log.info("epoch %d: %d ranks: %s", self.epoch, len(ids), ", ".join(m.describe() for m in members))
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
                "session": self.session,
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
        self._conclude(job)
        self._cancel_now.discard(job.id)
        self._trim()
        if job.state != JobState.SUCCEEDED:
            self.epoch_members = None  # re-link before the next job: links may be broken

    async def _broadcast_cancel(self, job: Job) -> None:
        for mid in job.rank_of:
            member = self.members.get(mid)
            if member is not None:
                try:
                    await member.session.push("cancel", {"job_id": job.id})
                except Exception:  # noqa: BLE001
                    pass

    def _unresponsive(self, job: Job, ranks: list[int]) -> list[str]:
        """Those of ``ranks`` the coordinator sees alive but not progressing, named."""
        out = []
        for r in ranks:
            member = self.members.get(job.members.get(r, ""))
            why = None if member is None else self.coord.unresponsive(member.session)
            if member is not None and why:
                out.append(f"rank {r} ({member.describe()}) {why}")
        return out

    def _conclude(self, job: Job) -> None:
        spec, n = job.spec, job.world_size
        failures = {r: rep for r, rep in job.reports.items() if not rep.get("ok")}
        missing = [r for r in range(n) if r not in job.reports]
        if job.cancel_requested:
            job.finish(JobState.CANCELLED, "cancelled while running")
            return
        if job.lost or failures or missing:
            if job.id in self._cancel_now:  # we cancelled the others for a lost rank: their errors follow
                failures = {}
            parts = [job.lost[r] for r in sorted(job.lost)]
            parts += job_error(failures, spec.deadline)  # once, with the wait chain when ranks timed out
            quiet = [r for r in missing if r not in job.lost]
            if quiet:
                parts.append(f"ranks {quiet} never reported within the deadline")
                parts += self._unresponsive(job, quiet)
            job.finish(JobState.FAILED, "; ".join(parts))
            return
        times = slowest_per_call((rep.get("timings") or () for rep in job.reports.values()), spec.iters)
        job.time_s = sum(times) / len(times) if times else None
        nbytes = job.reports[0].get("nbytes", 0)
        if job.time_s:
            job.algbw, job.busbw = _bandwidth(spec, nbytes, job.time_s, n)
        verified = [rep.get("verified") for rep in job.reports.values()]
        job.verified = None if any(v is None for v in verified) else all(verified)
        if job.verified is False:
            bad = [r for r, rep in sorted(job.reports.items()) if rep.get("verified") is False]
            job.finish(
                JobState.FAILED,
                f"result did not verify on ranks {bad} "
                f"({sum(job.reports[r].get('wrong', 0) for r in bad)} wrong elements)",
            )
            return
        job.finish(JobState.SUCCEEDED, None)


def _is_port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536


def _bandwidth(spec: JobSpec, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s: the registry's nccl-tests factor; 1 for buffer jobs."""
    coll = spec.collective
    if coll is not None:
        return coll.bandwidth(nbytes, seconds, world)
    alg = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return alg, alg


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Clear ``event``, then wait for it to be set again, at most ``seconds``."""
    event.clear()
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass


#: what a status row leaves out of a job's record: per-rank detail that grows with ranks and calls
_DETAIL = ("timings", "model")


def _summary(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in _DETAIL}
