"""The rank daemon: a long-lived process that runs collective jobs.

It opens one port for all peer traffic, connects to the coordinator (retrying
until it is up, and again if it restarts), registers with a member id of its
own, and runs the jobs it is sent one at a time. A job names an epoch; when
the epoch changes the daemon drops its old links and links up with the new
peer table on the same port. SIGTERM drains: the running job finishes (or
fails cleanly), the daemon deregisters and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from .. import logs, observe, resultpool
from ..arrays import array_from_meta, meta_of
from ..comm import Communicator, form_group
from ..errors import CollectiveError, NetcollError, PeerLost
from ..escape import escape
from ..mesh.certs import TlsConfig
from ..mesh.tcpmesh import Listener, TcpMesh
from ..rendezvous.client import RendezvousClient, new_member_id
from .jobs import JobSpec, generate_input, verify
from .runner import ProgressReporter, run_collective
from .timeline import send_trace

log = logging.getLogger("netcoll.daemon")

#: what a job's task hands back: its report, its result bytes, whether its links broke,
#: and its span recorder when it asked for a timeline (sent before its result)
Outcome = tuple[dict[str, Any], bytes | None, bool, observe.Recorder | None]

RETRY = 1.0  # first reconnect delay; doubles up to RETRY_MAX
RETRY_MAX = 10.0
#: past a job's deadline, how long its collective has to time out by itself (and say what it
#: waited for: the error's wait chain) before the job is cancelled from outside
JOB_GRACE = 2.0


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno).lower()
    return str(exc)


class RankDaemon:
    """Args:
    coordinator: ``host:port`` of the coordinator.
    host, port: where to listen for peers (one port for everything; 0, the default: any
        free port, so several daemons share a host; the bound port is what the
        coordinator is told).
    rank_hint: preferred rank (a pod index), honoured when free.
    advertise_host: what peers should dial (default: as the coordinator sees us).
    tls: mutual TLS for the coordinator connections and every peer link.
    insecure: allow a non-loopback ``host`` with neither token nor TLS (else
        :meth:`run` raises :class:`~netcoll.InsecureListenerError`).
    """

    def __init__(
        self,
        coordinator: str,
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        token: str | None = None,
        rank_hint: int | None = None,
        advertise_host: str | None = None,
        member_id: str | None = None,
        local_host: str | None = None,
        heartbeat: float = 2.0,
        tls: TlsConfig | None = None,
        insecure: bool = False,
    ) -> None:
        self.coordinator = coordinator
        self.tls = tls
        self.host, self.port = host, port
        self.token = token
        self.rank_hint = rank_hint
        self.advertise_host = advertise_host
        self.local_host = local_host
        self.heartbeat = heartbeat
        self.member_id = member_id or new_member_id()
        #: the bound HTTP health/metrics port, told to the coordinator (None: no HTTP)
        self.http_port: int | None = None
        self.listener = Listener(token=token, tls=tls, insecure=insecure)
        self.rdv: RendezvousClient | None = None
        self.registered = False
        self.epoch: int | None = None
        self.rank: int | None = None
        self.mesh: TcpMesh | None = None
        self.comm: Communicator | None = None
        self.buffers: dict[str, np.ndarray] = {}
        self.current_job: int | None = None
        self.jobs_done = 0
        self.jobs_failed = 0
        self._jobs: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._job_task: asyncio.Task[Outcome] | None = None
        self._stopping = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "registered": self.registered,
            "epoch": self.epoch,
            "rank": self.rank,
            "current_job": self.current_job,
            "jobs_done": self.jobs_done,
            "jobs_failed": self.jobs_failed,
            "buffers": sorted(self.buffers),
            "listen": f"{self.listener.address[0]}:{self.listener.address[1]}",
            "http_port": self.http_port,
        }

    def request_stop(self) -> None:
        """Drain and stop (what SIGTERM does)."""
        self._stopping.set()

    async def run(self) -> None:
        await self.listener.start(self.host, self.port)
        log.info("rank daemon %s listening for peers on %s:%d", self.member_id, *self.listener.address)
        worker = asyncio.create_task(self._work(), name="netcoll-daemon-jobs")
        delay, failures = RETRY, 0
        try:
            while not self._stopping.is_set():
                try:
                    await self._session()
                    delay, failures = RETRY, 0  # we were registered: start over after a loss
                except (OSError, NetcollError, TimeoutError) as exc:
                    failures += 1
                    level = logging.WARNING if failures in (1, 3) or failures % 30 == 0 else logging.DEBUG
                    log.log(
                        level,
                        "coordinator %s unreachable (%s); retrying every %gs (attempt %d)",
                        self.coordinator,
                        escape(_reason(exc)),
                        delay,
                        failures,
                    )
                self.registered = False
                if not self._stopping.is_set():
                    try:
                        await asyncio.wait_for(self._stopping.wait(), delay)
                    except TimeoutError:
                        pass
                    delay = min(delay * 2, RETRY_MAX)
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            await self._drop_links()
            await self.listener.close()
            if self.rdv is not None:
                await self.rdv.close()

    async def _session(self) -> None:
        """One connection to the coordinator: register, then serve until it drops or we stop."""
        rdv = await RendezvousClient.connect(
            self.coordinator,
            token=self.token,
            timeout=10.0,
            local_host=self.local_host,
            heartbeat=self.heartbeat,
            tls=self.tls,
        )
        self.rdv = rdv
        rdv.report_with(self._in_flight, self._seen)
        lost = asyncio.Event()

        def on_event(event: dict[str, Any]) -> None:
            topic = event.get("topic")
            if topic == "job":
                self._jobs.put_nowait(event)
            elif topic == "cancel" and event.get("job_id") == self.current_job and self._job_task is not None:
                self._job_task.cancel()
            elif topic == "coordinator_lost":
                lost.set()
                if self._job_task is not None and not self._job_task.done():
                    log.warning("lost the coordinator during job %s: cancelling it", escape(self.current_job))
                    self._job_task.cancel()  # nobody could receive its result

        rdv.on_event = on_event
        try:
            await rdv.rpc.call(
                "daemon_register",
                {
                    "member_id": self.member_id,
                    "listen_port": self.listener.address[1],  # the bound port (port 0: any free one)
                    "http_port": self.http_port,
                    "rank_hint": self.rank_hint,
                    "advertise_host": self.advertise_host,
                },
                timeout=10.0,
            )
            self.registered = True
            log.info("registered with the coordinator at %s as %s", self.coordinator, self.member_id)
            stop = asyncio.create_task(self._stopping.wait())
            gone = asyncio.create_task(lost.wait())
            await asyncio.wait({stop, gone}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            gone.cancel()
            if self._stopping.is_set() and not lost.is_set():
                await self._drain(rdv)
        finally:
            self.registered = False
            await rdv.close()
            self.rdv = None

    def _in_flight(self) -> dict[str, Any] | None:
        """The operations this rank is in (the heartbeat thread reads it; thread-safe)."""
        mesh = self.mesh
        return None if mesh is None else mesh.mailbox.snapshot()

    def _seen(self, answer: Any) -> None:
        """What the coordinator says of the ranks this one waits for (heartbeat thread)."""
        mesh = self.mesh
        if mesh is not None:
            mesh.answers.seen(answer)

    async def _drain(self, rdv: RendezvousClient) -> None:
        running = "no job is running" if self.current_job is None else f"finishing job {escape(self.current_job)}"
        log.info("draining: no new jobs; %s", running)
        try:
            await rdv.rpc.call("daemon_drain", {}, timeout=5.0)
        except (OSError, NetcollError, TimeoutError):
            pass
        # Leaving the instant this rank's part is reported is safe: the scheduler counts a
        # rank lost only if it goes before reporting (JobService._on_close).
        await self._jobs.join()

    async def _drop_links(self) -> None:
        if self.mesh is not None:
            await self.mesh.close()
        self.mesh = self.comm = None
        self.epoch = self.rank = None

    # -- jobs -------------------------------------------------------------------------------
    async def _work(self) -> None:
        """Run the queued jobs one at a time. Only the collective part (its own task) is
        cancelled by a "cancel" event; dropping broken links and reporting run here, so a
        cancel that arrives after the collective ended can never lose the report."""
        while True:
            event: dict[str, Any] | None = await self._jobs.get()
            assert event is not None
            job_id, rank = event.get("job_id"), event.get("rank")
            self.current_job = job_id
            task = self._job_task = asyncio.create_task(self._job(event))
            event = None  # the job (and its inline input bytes) is held by its task alone
            try:
                await self._finish(task, job_id, rank)
            except Exception:  # never let one job stop the daemon taking jobs
                log.exception("job %s: could not finish it", escape(job_id))
            finally:
                self._job_task = None
                self.current_job = None
                resultpool.RESULTS.clear()  # an idle daemon keeps no result memory for reuse
                self._jobs.task_done()

    async def _finish(self, task: asyncio.Task[Outcome], job_id: Any, rank: Any) -> None:
        """Wait for the job's collective, drop broken links, report."""
        try:
            report, payload, broken, recorder = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                raise  # the daemon is stopping
            # cancelled before its first step: _job never ran to catch it
            report, payload, broken, recorder = _cancelled(job_id, rank), None, False, None
            self.jobs_failed += 1
        except Exception as exc:
            log.exception("job %s failed", escape(job_id))
            error = f"internal error: {exc!r}"
            report = {"job_id": job_id, "rank": rank, "ok": False, "error": error, "error_type": "RpcError"}
            payload, broken, recorder = None, True, None
            self.jobs_failed += 1
        if broken:
            try:
                await self._drop_links()
            except Exception:  # the report still goes out
                log.exception("job %s: could not close the broken links", escape(job_id))
                self.mesh = self.comm = None
                self.epoch = self.rank = None
        await self._report(job_id, report, payload, recorder)

    async def _report(
        self, job_id: Any, report: dict[str, Any], payload: bytes | None, recorder: observe.Recorder | None
    ) -> None:
        rdv = self.rdv
        if rdv is not None:
            try:
                if recorder is not None:  # before the result: the job is complete with its trace
                    await send_trace(rdv.rpc, job_id, report["rank"], recorder)
                await rdv.rpc.call("job_result", report, payload, timeout=30.0)
            except (OSError, NetcollError, TimeoutError) as exc:
                log.warning("could not report job %s: %s", escape(job_id), escape(exc))

    async def _ensure_links(self, event: dict[str, Any]) -> Communicator:
        if event["epoch"] != self.epoch or self.comm is None:
            await self._drop_links()
            peers = [(str(h), int(p)) for h, p in event["peers"]]
            mesh = TcpMesh(
                self.listener,
                rank=event["rank"],
                size=event["world_size"],
                session=event["session"],
                peers=peers,
                token=self.token,
            )
            self.mesh = mesh
            await mesh.connect(timeout=min(30.0, float(event["deadline"])))
            self.epoch, self.rank = event["epoch"], event["rank"]
            self.comm = Communicator(mesh, group=f"epoch{event['epoch']}")
            try:  # link kinds agreed, the cost model calibrated if on (docs/algorithms.md)
                await form_group(self.comm)
            except BaseException:  # not formed: the next job links anew, as after a failed connect
                await self._drop_links()
                raise
            log.info("epoch %s: rank %s of %s", escape(self.epoch), escape(self.rank), escape(event["world_size"]))
        return self.comm

    async def _job(self, event: dict[str, Any]) -> Outcome:
        """Run one job with its log context (rank, epoch, job): its :data:`Outcome`."""
        with logs.bind(rank=event.get("rank"), epoch=event.get("epoch"), job=event.get("job_id")):
            spec = event.get("spec")
            job_id = event.get("job_id")
            log.info(
                "job %s: %s starts", escape(job_id), escape(spec.get("op") if isinstance(spec, dict) else spec, 40)
            )
            outcome = await self._run_job(event)
            if outcome[0]["ok"]:
                log.info("job %s done", escape(job_id))
            else:
                log.warning("job %s failed: %s", escape(job_id), escape(outcome[0].get("error"), 300))
            return outcome

    async def _run_job(self, event: dict[str, Any]) -> Outcome:
        job_id, rank, world = event["job_id"], event["rank"], event["world_size"]
        report: dict[str, Any] = {"job_id": job_id, "rank": rank, "ok": False}
        payload: bytes | None = None
        broken = False
        recorder: observe.Recorder | None = None
        phase = "checking the job"
        try:
            spec = JobSpec.model_validate(event["spec"])
            if spec.trace:  # this task's context: every operation of the job records spans
                recorder = observe.Recorder()
                observe.TRACE.set(recorder)
            end = asyncio.get_running_loop().time() + float(event["deadline"])
            async with asyncio.timeout(float(event["deadline"]) + JOB_GRACE):
                phase = "linking to its peers"
                comm = await self._ensure_links(event)
                # Generating and checking data of a large job takes seconds of numpy work:
                # in a thread (numpy releases the GIL), so heartbeats and links stay served.
                phase = "making its input"
                x = await asyncio.to_thread(self._input, spec, event, rank, world)
                phase = f"running {spec.op}"
                async with ProgressReporter(self._progress_sender(job_id, rank), comm, spec.iters) as progress:
                    y, timings, nbytes = await run_collective(comm, spec, x, progress.step, end)
            report.update(timings=timings, nbytes=nbytes, links=_link_kinds(comm), model=comm.model_stats)
            if spec.data == "generated" and spec.op not in ("barrier",):
                report["verified"], report["wrong"] = await asyncio.to_thread(verify, spec, rank, world, y)
            payload = self._output(spec, rank, y, report)
            report["ok"] = True
            self.jobs_done += 1
        except asyncio.CancelledError:
            report = _cancelled(job_id, rank)
            self.jobs_failed += 1
        except CollectiveError as exc:  # (a CollectiveTimeout too: the job's deadline, as the call's)
            report.update(error=str(exc), error_type=type(exc).__name__)
            if exc.waits:  # what it (and those it heard from) waited for: the job's error merges them
                report["waits"] = [w.row() for w in exc.waits]
            self.jobs_failed += 1
            broken = isinstance(exc, PeerLost)
        except TimeoutError:  # (before OSError, its base class)
            report.update(error=f"job deadline passed while {phase}", error_type="CollectiveTimeout")
            self.jobs_failed += 1
        except (NetcollError, ValueError, TypeError, KeyError, OSError) as exc:
            report.update(error=str(exc), error_type=type(exc).__name__)
            self.jobs_failed += 1
            broken = True
        except Exception as exc:  # report, never crash the daemon
            log.exception("job %s failed", escape(job_id))
            report.update(error=f"internal error: {exc!r}", error_type="RpcError")
            self.jobs_failed += 1
        return report, payload, broken, recorder

    def _progress_sender(self, job_id: int, rank: int) -> Callable[[dict[str, int]], Awaitable[None]]:
        """Sends this rank's progress in the job to the coordinator (best effort)."""

        async def send(state: dict[str, int]) -> None:
            rdv = self.rdv
            if rdv is None:
                return
            try:
                await rdv.rpc.call("job_progress", {"job_id": job_id, "rank": rank, **state}, timeout=5.0)
            except (OSError, NetcollError, TimeoutError) as exc:
                log.debug("progress of job %s not sent: %s", escape(job_id), escape(exc))

        return send

    def _input(self, spec: JobSpec, event: dict[str, Any], rank: int, world: int) -> np.ndarray | None:
        if spec.op in ("get", "delete"):
            return None
        if spec.data == "generated":
            return generate_input(spec, rank, world)
        if spec.data == "buffer":
            if spec.input not in self.buffers:
                raise KeyError(f"rank {rank} holds no buffer {spec.input!r} (have: {sorted(self.buffers)})")
            return self.buffers[spec.input]
        meta, data = event.get("input"), event.get("payload")
        if meta is None:
            return None
        return array_from_meta(meta, memoryview(data if data is not None else b"")).copy()

    def _output(self, spec: JobSpec, rank: int, y: Any, report: dict[str, Any]) -> bytes | None:
        if spec.op == "put" and y is not None:
            self.buffers[spec.output or spec.input or ""] = y
            return None
        if spec.op == "delete":
            report["deleted"] = self.buffers.pop(spec.input or spec.output or "", None) is not None
            return None
        if spec.op == "get":
            name = spec.input or spec.output or ""
            if name not in self.buffers:
                raise KeyError(f"rank {rank} holds no buffer {name!r}")
            y = self.buffers[name]
        if spec.output and y is not None and spec.op != "get":
            self.buffers[spec.output] = y
        if not spec.return_result or spec.data == "generated" or y is None:
            return None
        if spec.op in ("all_reduce", "all_gather", "broadcast") and rank != 0:
            return None  # identical on every rank: rank 0's copy is the result
        arr = np.ascontiguousarray(y)
        report["result"] = meta_of(arr)
        return arr.reshape(-1).view(np.uint8).tobytes()


def _cancelled(job_id: Any, rank: Any) -> dict[str, Any]:
    return {"job_id": job_id, "rank": rank, "ok": False, "error": "cancelled", "error_type": "Cancelled"}


def _link_kinds(comm: Communicator) -> dict[str, str]:
    """The kind of link ("tcp", ...) this rank used to each peer, by group rank."""
    return {str(peer): str(stats["kind"]) for peer, stats in comm.link_stats().items()}
