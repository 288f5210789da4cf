"""The coordinator's job service: daemon membership, epochs, and the job queue.

Rank daemons register (``daemon_register``) over their rendezvous connection;
the address a daemon is *seen* from is what its peers dial. Jobs run one at a
time in submission order, so every rank runs them in the same order. Before
each job the service takes the current membership; if it differs from the last
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

from ..rendezvous.coordinator import Coordinator
from ..rendezvous.groups import is_loopback
from ..rpc import Reply, Session
from .jobs import JobSpec, JobState
from .records import Job, Member, assign_ranks, split_inputs

log = logging.getLogger("netcoll.service")

REPORT_GRACE = 5.0  # after a job's deadline (or a lost rank), how long to wait for the others' reports
HISTORY = 1000
RESULT_JOBS = 32  # finished jobs whose result arrays are kept for `wait`
RESULT_BYTES = 2 << 30  # ... within this many bytes in all


class JobService:
    """Adds the job RPC methods to a :class:`Coordinator`."""

    def __init__(self, coordinator: Coordinator, *, history: int = HISTORY) -> None:
        self.coord = coordinator
        self.history = history
        self.members: dict[str, Member] = {}
        self.jobs: collections.OrderedDict[int, Job] = collections.OrderedDict()
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.current: Job | None = None
        self.epoch = 0
        self.session = ""
        self.epoch_members: tuple[str, ...] | None = None
        self._ids = itertools.count(1)
        self.submitted = 0
        #: jobs ended so far, by final state (for metrics; unlike ``jobs``, never trimmed)
        self.finished: collections.Counter[str] = collections.Counter()
        self._members_changed = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
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
            coordinator.register(name, getattr(self, "_rpc_" + name))
        coordinator.close_hooks.append(self._on_close)

    def start(self) -> None:
        if self._runner is None:
            self._runner = asyncio.create_task(self._run_jobs(), name="netcoll-job-runner")

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
            self._runner = None
        for job in list(self.jobs.values()):
            if not job.state.done:
                job.finish(JobState.FAILED, "the coordinator shut down")

    # -- membership --------------------------------------------------------------------
    def ready_members(self) -> list[Member]:
        return [m for m in self.members.values() if not m.draining and m.session.proto.lost is None]

    async def _rpc_daemon_register(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        member_id, port = params.get("member_id"), params.get("listen_port")
        hint, advertise = params.get("rank_hint"), params.get("advertise_host")
        if not isinstance(member_id, str) or not member_id or len(member_id) > 200:
            raise ValueError("member_id must be a non-empty string")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError(f"listen_port must be a TCP port, got {port!r}")
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
        self.members[member_id] = Member(member_id, session, host, port, hint)
        session.data["daemon"] = member_id
        log.info("daemon %s registered at %s:%d (hint %s)", member_id, host, port, hint)
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
            "daemon %s at %s:%d left: %s",
            member_id,
            member.host,
            member.port,
            "drained" if member.draining else reason,
        )
        job = self.current
        # A rank that has reported its part left in order (a draining daemon finishes
        # its job, reports, then goes): only one that has not is lost to the job.
        r = job.rank_of.get(member_id) if job is not None else None
        if job is not None and r is not None and r not in job.reports:
            job.lost[r] = f"rank {r} ({member.describe()}) was lost: {reason}"
            job.changed.set()
        self._members_changed.set()

    # -- jobs ----------------------------------------------------------------------------
    async def _rpc_submit(self, session: Session, params: dict[str, Any], payload: memoryview) -> dict[str, Any]:
        spec = JobSpec.model_validate(params.get("spec") or {})
        inputs = split_inputs(spec, params.get("inputs"), payload)
        if inputs is not None and inputs.per_rank is not None and spec.world_size is None:
            spec.world_size = len(inputs.per_rank)
        job = Job(next(self._ids), spec, inputs)
        job.on_finish = self._count_finished
        self.submitted += 1
        self.jobs[job.id] = job
        self._trim()
        self.queue.put_nowait(job)
        return {"id": job.id, "state": job.state.value}

    def _count_finished(self, job: Job) -> None:
        self.finished[job.state.value] += 1

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
        job = self._get(params)
        job.watchers.add(session)
        try:
            await job.done.wait()
        finally:
            job.watchers.discard(session)
        rec: dict[str, Any] = job.record()
        return rec

    def _watchers_drop(self, session: Session) -> None:
        for job in self.jobs.values():
            job.watchers.discard(session)

    async def _rpc_job_progress(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        job = self.jobs.get(params.get("job_id"))  # type: ignore[arg-type]
        if job is not None and job.state == JobState.RUNNING:
            job.progress = {k: params.get(k) for k in ("iteration", "of", "rank")}
            for watcher in list(job.watchers):
                try:
                    await watcher.push("progress", {"id": job.id, **job.progress})
                except Exception:  # noqa: BLE001 - a gone watcher is dropped
                    job.watchers.discard(watcher)
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
        recent = [j.record() for j in list(self.jobs.values())[-20:]]
        return {
            "epoch": self.epoch,
            "members": self._member_rows(),
            "queued": self.queue.qsize(),
            "current_job": None if self.current is None else self.current.id,
            "jobs": recent,
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
                    "rank_hint": m.rank_hint,
                    "epoch": self.epoch,
                    "state": "draining" if m.draining else ("busy" if busy_job else "ready"),
                    "current_job": busy_job.id if busy_job else None,
                    "registered_for": round(time.time() - m.since, 1),
                }
            )
        return rows

    def _trim(self) -> None:
        """Bound the history: at most ``history`` jobs, and result arrays of the
        last RESULT_JOBS finished jobs only (within RESULT_BYTES)."""
        kept, total = 0, 0
        for job in reversed(self.jobs.values()):
            if job.payloads:
                size = sum(len(p) for p in job.payloads.values())
                if kept >= RESULT_JOBS or total + size > RESULT_BYTES:
                    job.payloads.clear()
                    job.results_expired = True
                else:
                    kept, total = kept + 1, total + size
        while len(self.jobs) > self.history:
            oldest = next(iter(self.jobs.values()))
            if not oldest.state.done:
                break
            self.jobs.popitem(last=False)

    # -- the runner ------------------------------------------------------------------------
    async def _run_jobs(self) -> None:
        while True:
            job = await self.queue.get()
            if job.state != JobState.QUEUED:
                continue
            self.current = job
            try:
                await self._run(job)
            except asyncio.CancelledError:
                job.finish(JobState.FAILED, "the coordinator shut down")
                raise
            except Exception as exc:  # a job failure never stops the queue
                log.exception("job %d failed inside the coordinator", job.id)
                job.finish(JobState.FAILED, f"internal error in the coordinator: {exc!r}")
            finally:
                self.current = None

    async def _members_for(self, job: Job, deadline: float) -> list[Member] | None:
        loop = asyncio.get_running_loop()
        want = job.spec.world_size
        while True:
            ready = self.ready_members()
            if ready and (want is None or len(ready) >= want) and not job.cancel_requested:
                chosen = assign_ranks(ready, self.epoch_members)
                return chosen[:want] if want else chosen
            if job.state != JobState.QUEUED or job.cancel_requested:
                return None
            left = deadline - loop.time()
            if left <= 0:
                have = ", ".join(m.describe() for m in ready) or "none"
                job.finish(
                    JobState.FAILED,
                    f"waited {job.spec.deadline:g}s for {want or 'at least 1'} rank daemon(s); ready: {have}",
                )
                return None
            await _wait(self._members_changed, min(left, 1.0))

    async def _run(self, job: Job) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + job.spec.deadline
        members = await self._members_for(job, deadline)
        if members is None:
            return
        ids = tuple(m.member_id for m in members)
        if ids != self.epoch_members:
            self.epoch += 1
            self.session = secrets.token_hex(8)
            self.epoch_members = ids
            log.info("epoch %d: %d ranks: %s", self.epoch, len(ids), ", ".join(m.describe() for m in members))
        job.start(self.epoch, members)
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
            if job.cancel_requested and not cancel_sent:
                await self._broadcast_cancel(job)
                cancel_sent = True
            if job.lost:  # the others will fail fast (their links broke too); give them a moment
                hard_end = min(hard_end, loop.time() + REPORT_GRACE)
            left = hard_end - loop.time()
            if left <= 0:
                break
            await _wait(job.changed, min(left, 1.0))
        if len(job.reports) < job.world_size and not cancel_sent:
            await self._broadcast_cancel(job)
        self._conclude(job)
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

    def _conclude(self, job: Job) -> None:
        spec, n = job.spec, job.world_size
        failures = {r: rep for r, rep in job.reports.items() if not rep.get("ok")}
        missing = [r for r in range(n) if r not in job.reports]
        if job.cancel_requested:
            job.finish(JobState.CANCELLED, "cancelled while running")
            return
        if job.lost or failures or missing:
            parts = [job.lost[r] for r in sorted(job.lost)]
            primary = [
                f"rank {r}: {rep.get('error')}"
                for r, rep in sorted(failures.items())
                if rep.get("error_type") not in ("CollectiveAborted", "PeerLost")
            ]
            parts += primary or [f"rank {r}: {rep.get('error')}" for r, rep in sorted(failures.items())][:2]
            quiet = [r for r in missing if r not in job.lost]
            if quiet:
                parts.append(f"ranks {quiet} never reported within the deadline")
            job.finish(JobState.FAILED, "; ".join(parts))
            return
        times = (
            [max(rep["timings"][i] for rep in job.reports.values()) for i in range(spec.iters)]
            if all(len(rep.get("timings") or ()) == spec.iters for rep in job.reports.values())
            else []
        )
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
