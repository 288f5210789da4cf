"""Entry points of the long-running processes, used by the CLI and the containers:

- :func:`serve_coordinator` — ``netcoll coordinator``: rendezvous + job service + HTTP health/metrics;
- :func:`serve_rank` — ``netcoll rank``: a :class:`~netcoll.service.daemon.RankDaemon` + HTTP;
- ``netcoll up`` (:mod:`netcoll.service.local`) starts both as local child processes.

SIGTERM or SIGINT stops each of them cleanly and they return 0: the coordinator
fails its running job with a reason (and, without a state dir, its queued jobs;
with ``--state-dir`` they stay queued for the next start) and closes; a rank daemon drains (takes
no new job, finishes or fails the running one, deregisters). A second signal
stops at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import logs
from ..config import CoordinatorConfig, RankConfig
from ..logs import ContextFilter
from .metrics import coordinator_metrics, rank_metrics

if TYPE_CHECKING:
    from ..mesh.certs import TlsConfig
    from ..rendezvous.coordinator import Coordinator
    from .scheduler import JobService

log = logging.getLogger("netcoll.serve")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RANK_STOP_GRACE = 10.0  # `up`: SIGTERM -> SIGKILL for rank daemons
COORD_STOP_GRACE = 5.0


class StartupError(Exception):
    """A server could not start (port in use, bad address...): one line for the user."""


# -- logging ----------------------------------------------------------------------------------
def setup_logging(level: int | str, who: str, fmt: str | None = None) -> ContextFilter:
    """Log to stderr (text or JSON lines: :mod:`netcoll.logs`); returns the filter so
    the caller can update ``who`` (a rank learns its member id later)."""
    return logs.setup(level, who, fmt)


# -- helpers ----------------------------------------------------------------------------------
def _on_signals(callback: Callable[[int], None]) -> Callable[[], None]:
    """Call ``callback(signum)`` on SIGTERM/SIGINT; returns the undo function."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, callback, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / not Unix
            pass

    def undo() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return undo


def write_ready_file(path: str | None, info: dict[str, Any]) -> None:
    """Atomically write ``info`` as JSON to ``path`` (for supervisors and tests)."""
    if not path:
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".ready-", dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


def _listen_error(what: str, host: str, port: int, exc: OSError) -> StartupError:
    reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
    return StartupError(f"cannot listen on {host}:{port} for {what}: {reason}")


async def _start_http(cfg: CoordinatorConfig | RankConfig, server: Any) -> str | None:
    if cfg.http_port is None:
        return None
    host = cfg.http_host or cfg.host
    try:
        await server.start(host, cfg.http_port)
    except OSError as exc:
        raise _listen_error("HTTP", host, cfg.http_port, exc) from None
    return str(server.url)


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


# -- netcoll coordinator ------------------------------------------------------------------------
def _credentials(cfg: CoordinatorConfig) -> str:
    """What the coordinator's listener requires, for its "ready" log line."""
    tls = " + mutual TLS" if cfg.tls_cert else ""
    if cfg.token:
        return f" (member + client tokens{tls})" if cfg.client_token else f" (member token only{tls})"
    return " (mutual TLS, no token)" if tls else " (NO token: anyone who can reach this port can run jobs)"


def _job_service(cfg: CoordinatorConfig, coord: Coordinator) -> JobService:
    """The job service, with its journal when ``cfg.state_dir`` is set (a JournalError,
    before anything listens, when the directory cannot be used)."""
    from .journal import Journal
    from .scheduler import JobService

    journal = Journal.open(cfg.state_dir) if cfg.state_dir else None
    try:
        return JobService(coord, journal=journal, history=cfg.keep_jobs)
    except BaseException:
        if journal is not None:
            journal.close()
        raise


def _coordinator_http(coord: Coordinator, svc: JobService, stopping: Callable[[], bool], tls: TlsConfig | None) -> Any:
    """The coordinator's HTTP server: health, metrics, and the ``/jobs`` and ``/status`` views."""
    from .http import HttpServer, coordinator_ready
    from .views import coordinator_views

    return HttpServer(
        ready=coordinator_ready(coord, stopping),
        metrics=coordinator_metrics(coord, svc, time.time()),
        name="netcoll coordinator",
        tls=tls,
        views=coordinator_views(svc),
    )


async def serve_coordinator(cfg: CoordinatorConfig) -> int:
    """Run a coordinator with the job service until SIGTERM/SIGINT; return 0."""
    from ..rendezvous.coordinator import Coordinator

    cfg.require_credentials("coordinator")  # secure by default (a ConfigError: exit 2)
    state = {"stopping": False, "signals": 0}
    tls, token, client = cfg.tls_config(), cfg.token, cfg.client_token
    coord = Coordinator(cfg.host, cfg.port, token=token, client_token=client, tls=tls, insecure=cfg.insecure)
    svc = _job_service(cfg, coord)
    journal = svc.journal
    http = _coordinator_http(coord, svc, lambda: bool(state["stopping"]), tls)
    stop = asyncio.Event()

    def on_signal(sig: int) -> None:
        state["signals"] += 1
        if state["signals"] == 1:
            log.info("%s: shutting down", _signal_name(sig))
            state["stopping"] = True
            stop.set()
        else:
            log.warning("%s again: exiting now", _signal_name(sig))
            os._exit(1)

    undo = _on_signals(on_signal)
    try:
        try:
            await coord.start()
        except OSError as exc:
            raise _listen_error("the coordinator", cfg.host, cfg.port, exc) from None
        svc.start()
        url = await _start_http(cfg, http)
        log.info(
            "coordinator ready at %s%s; HTTP %s; jobs %s",
            coord.address,
            _credentials(cfg),
            f"{url}/metrics, /jobs, /status" if url else "off",
            f"journaled in {journal.directory}" if journal else "in memory only (no --state-dir)",
        )
        write_ready_file(
            cfg.ready_file, {"role": "coordinator", "pid": os.getpid(), "address": coord.address, "http": url}
        )
        await stop.wait()
    finally:
        state["stopping"] = True
        await svc.close()  # unfinished jobs end `failed` with a reason ...
        await asyncio.sleep(0.05)  # ... and their waiting clients get the answer
        await coord.close()
        await http.close()
        if journal is not None:
            journal.close()
        undo()
    log.info("coordinator stopped")
    return 0


# -- netcoll rank ----------------------------------------------------------------------------------
class _RankServer:
    """``netcoll rank``'s process: the daemon's task, its HTTP server, and the signals:
    the first drains (no new job; the running one finishes), the second stops at once."""

    def __init__(self, cfg: RankConfig, daemon: Any) -> None:
        from .http import HttpServer, rank_ready

        started = time.time()
        self.cfg, self.daemon = cfg, daemon
        self.stopping, self.signals = False, 0
        self.http = HttpServer(
            ready=rank_ready(daemon, lambda: self.stopping),
            metrics=rank_metrics(daemon, started),
            name=f"netcoll rank {daemon.member_id}",
            tls=daemon.tls,
        )
        self.run_task: asyncio.Task[None] | None = None  # started once HTTP listens (run)
        self.stopper: asyncio.Task[None] | None = None

    async def _stop_when_idle(self) -> None:
        """Nothing to drain while not registered (the coordinator is unreachable, so no
        result could be reported): do not wait for a connection attempt to time out."""
        task = self.run_task
        while task is not None and not task.done():
            if not self.daemon.registered:
                await asyncio.sleep(1.0)
                if not task.done() and not self.daemon.registered:
                    task.cancel()
                return
            await asyncio.sleep(0.1)

    def on_signal(self, sig: int) -> None:
        self.signals += 1
        if self.signals == 1:
            job = self.daemon.current_job
            running = "no job is running" if job is None else f"finishing job {job}"
            log.info("%s: draining (no new jobs; %s), then leaving", _signal_name(sig), running)
            self.stopping = True
            self.daemon.request_stop()
            self.stopper = asyncio.create_task(self._stop_when_idle())
        else:
            log.warning("%s again: stopping now", _signal_name(sig))
            if self.run_task is not None:
                self.run_task.cancel()

    async def _listening(self, task: asyncio.Task[None]) -> tuple[str, int]:
        """The peer listener's address, once bound (a StartupError if it could not be)."""
        while self.daemon.listener.address[1] == 0 and not task.done():  # noqa: ASYNC110 - bounded by run
            await asyncio.sleep(0.01)
        if task.done():
            try:
                task.result()
            except OSError as exc:
                raise _listen_error("peers", self.cfg.host, self.cfg.port, exc) from None
        host, port = self.daemon.listener.address[:2]
        return str(host), int(port)

    async def run(self) -> None:
        """Serve until the daemon stops (drained, or cancelled by a second signal). HTTP
        listens first, so the daemon registers with its bound HTTP port (port 0: any)."""
        cfg, daemon = self.cfg, self.daemon
        url = await _start_http(cfg, self.http)
        daemon.http_port = self.http.address[1] if url else None
        self.run_task = task = asyncio.create_task(daemon.run(), name="netcoll-rank-daemon")
        host, port = await self._listening(task)
        log.info(
            "rank daemon %s: peers on %s:%d, coordinator %s%s, HTTP %s",
            daemon.member_id,
            host,
            port,
            cfg.coordinator,
            f", rank hint {cfg.rank_hint}" if cfg.rank_hint is not None else "",
            f"{url}/metrics" if url else "off",
        )
        write_ready_file(
            cfg.ready_file,
            {
                "role": "rank",
                "pid": os.getpid(),
                "member_id": daemon.member_id,
                "listen": f"{host}:{port}",
                "http": url,
            },
        )
        try:
            await task
        except asyncio.CancelledError:
            if not self.stopping:
                raise

    async def close(self) -> None:
        if self.run_task is not None and not self.run_task.done():
            self.run_task.cancel()
            await asyncio.gather(self.run_task, return_exceptions=True)
        if self.stopper is not None:
            self.stopper.cancel()
        await self.http.close()


async def serve_rank(cfg: RankConfig, tag: ContextFilter | None = None) -> int:
    """Run a rank daemon until SIGTERM/SIGINT, then drain; return 0 (1 after a second signal)."""
    from .daemon import RankDaemon

    cfg.require_credentials("rank daemon")  # secure by default (a ConfigError: exit 2)
    daemon = RankDaemon(
        cfg.coordinator,
        host=cfg.host,
        port=cfg.port,
        token=cfg.token,
        rank_hint=cfg.rank_hint,
        advertise_host=cfg.advertise_host,
        member_id=cfg.member_id,
        local_host=cfg.local_host,
        heartbeat=cfg.heartbeat,
        tls=cfg.tls_config(),
        insecure=cfg.insecure,
    )
    if tag is not None:
        tag.who = f"rank {daemon.member_id}"
    server = _RankServer(cfg, daemon)
    undo = _on_signals(server.on_signal)
    try:
        await server.run()
    finally:
        await server.close()
        undo()
    log.info("rank daemon %s stopped (%d jobs ok, %d failed)", daemon.member_id, daemon.jobs_done, daemon.jobs_failed)
    return 1 if server.signals > 1 else 0


# -- netcoll up ---------------------------------------------------------------------------------------


__all__ = ["StartupError", "serve_coordinator", "serve_rank", "setup_logging", "write_ready_file"]
