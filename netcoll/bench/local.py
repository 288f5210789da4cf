"""A local benchmark cluster: an in-process :class:`netcoll.Coordinator` on
127.0.0.1 and N rank *processes* (``python -m netcoll.bench.worker``), each of
which joins over TCP and runs the sweep; rank 0's rows come back as JSON lines
on its stdout.

Every child is killed and reaped on every way out of :func:`run_local`
(success, a failing rank, a timeout, cancellation, Ctrl-C). Children run in
their own session, so a terminal's Ctrl-C reaches only this process, which
then kills them; and each child exits by itself when its stdin (a pipe from
this process) closes, so none outlives a runner that was killed outright.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .common import SweepConfig

Event = Callable[[dict[str, Any]], None]


class BenchError(RuntimeError):
    """A rank failed (its error and stderr tail are in the message)."""


def _package_root() -> str:
    import netcoll

    return os.path.dirname(os.path.dirname(os.path.abspath(netcoll.__file__)))


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for rank processes: this netcoll importable, one BLAS/OpenMP
    thread per process (as torchrun sets), unbuffered output."""
    env = dict(os.environ)
    root = _package_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def machine_facts() -> dict[str, Any]:
    """What a result depends on: cores, CPU, Python, numpy, netcoll, kernel."""
    import netcoll

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu or platform.processor(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "netcoll": netcoll.__version__,
        "platform": platform.platform(),
        "hostname": platform.node(),
    }


class _Ranks:
    """The rank processes of one run and what they report: rows, hellos, errors,
    stderr tails. Their output is read by tasks; :meth:`close` kills and reaps all."""

    def __init__(self, ranks: int, on_event: Event | None) -> None:
        self.ranks, self.on_event = ranks, on_event
        self.rows: list[dict[str, Any]] = []
        self.hellos: dict[int, dict[str, Any]] = {}
        self.rank_list: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.tails: dict[int, collections.deque[str]] = {i: collections.deque(maxlen=40) for i in range(ranks)}
        self.failed = asyncio.Event()
        self.callback_errors: list[Exception] = []
        self.procs: list[asyncio.subprocess.Process] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def start(
        self, address: str, cfg: SweepConfig, *, loop: str, python: str | None, connect_timeout: float
    ) -> None:
        """One ``python -m netcoll.bench.worker`` per rank, with tasks reading its output."""
        env = child_env()
        for i in range(self.ranks):
            proc = await asyncio.create_subprocess_exec(
                python or sys.executable,
                "-m",
                "netcoll.bench.worker",
                "--address",
                address,
                "--world-size",
                str(self.ranks),
                "--rank",
                str(i),
                "--loop",
                loop,
                "--connect-timeout",
                str(connect_timeout),
                "--config",
                json.dumps(cfg.to_json()),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
            self.procs.append(proc)
            self.tasks += [
                asyncio.create_task(self._read_stdout(i, proc)),
                asyncio.create_task(self._read_stderr(i, proc)),
                asyncio.create_task(self._wait_exit(proc)),
            ]

    def _on_line(self, i: int, line: str) -> bool:
        """Handle one stdout line of rank ``i``; False: stop reading (the callback failed)."""
        try:
            ev = json.loads(line)
        except ValueError:
            self.tails[i].append(line)
            return True
        kind = ev.get("event")
        if kind == "hello":
            self.hellos[i] = ev
        elif kind == "row":
            self.rows.append(ev["row"])
        elif kind == "error":
            self.errors.append(ev)
            self.failed.set()
        elif kind == "ranks":
            self.rank_list[:] = ev["ranks"]
        if self.on_event is not None and kind in ("ranks", "start", "row"):
            try:
                self.on_event(ev)
            except Exception as exc:  # noqa: BLE001 - e.g. BrokenPipeError from the table printer: stop the run
                self.callback_errors.append(exc)
                self.failed.set()
                return False
        return True

    async def _read_stdout(self, i: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line and not self._on_line(i, line):
                return

    async def _read_stderr(self, i: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            self.tails[i].append(raw.decode(errors="replace").rstrip("\n"))

    async def _wait_exit(self, proc: asyncio.subprocess.Process) -> None:
        if await proc.wait() != 0:
            self.failed.set()

    async def wait(self, limit: float | None) -> None:
        """Until every rank is done; raise on a failure (BenchError) or after ``limit`` s."""
        fail_wait = asyncio.create_task(self.failed.wait())
        deadline = None if limit is None else time.monotonic() + limit
        pending: set[asyncio.Future[Any]] = set(self.tasks)
        try:
            while pending and not self.failed.is_set():
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                _, pending = await asyncio.wait(
                    pending | {fail_wait}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(fail_wait)
                if deadline is not None and time.monotonic() >= deadline and pending:
                    raise TimeoutError(f"benchmark did not finish within {limit:g} s")
        finally:
            fail_wait.cancel()
        if self.callback_errors:
            raise self.callback_errors[0]
        if self.failed.is_set():
            if pending:  # give the other ranks a moment to report their side (a lost peer, ...)
                await asyncio.wait(pending, timeout=3.0)
            raise BenchError(_describe_failure(self.procs, self.errors, self.tails))

    @property
    def running(self) -> bool:
        return any(p.returncode is None for p in self.procs)

    async def close(self) -> None:
        """Kill and reap every rank process; finish the reader tasks."""
        _kill_all(self.procs)
        for t in self.tasks:
            t.cancel()
        await _reap(self.procs)
        if self.tasks:
            await asyncio.wait(self.tasks)
        for t in self.tasks:  # retrieve every outcome (no "never retrieved" warnings)
            if not t.cancelled():
                t.exception()

    def meta(self, cfg: SweepConfig, loop: str, started: float) -> dict[str, Any]:
        """The run's ``meta``: machine, configuration, ranks, memory, timing."""
        return {
            **machine_facts(),
            "world_size": self.ranks,
            "transport": "tcp, loopback 127.0.0.1",
            "loop": self.hellos.get(0, {}).get("loop", loop),
            "config": cfg.to_json(),
            "ranks": self.rank_list
            or [
                {"rank": h.get("rank"), "pid": h.get("pid"), "host": h.get("host")}
                for _, h in sorted(self.hellos.items())
            ],
            "baseline_rss_bytes": max((r["baseline_rss_bytes"] for r in self.rows), default=None),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "elapsed_s": round(time.time() - started, 3),
            "in_place": "not measured (out-of-place only)",
        }


async def run_local(
    cfg: SweepConfig,
    ranks: int = 4,
    *,
    on_event: Event | None = None,
    loop: str = "auto",
    python: str | None = None,
    limit: float | None = None,
    connect_timeout: float = 60.0,
) -> dict[str, Any]:
    """Run ``cfg`` on a fresh local cluster of ``ranks`` processes.

    Returns ``{"meta": {...}, "rows": [...]}``. ``on_event`` sees rank 0's
    ``start``/``row`` events as they happen (for a live table and progress).
    Raises :class:`BenchError` if any rank fails, ``TimeoutError`` after
    ``limit`` seconds.
    """
    import netcoll
    from netcoll.mesh.certs import TlsConfig

    cfg.validate()
    if ranks < 1:
        raise ValueError(f"--ranks must be >= 1, got {ranks}")
    if cfg.root >= ranks:
        raise ValueError(f"-r/--root {cfg.root} is not a rank of {ranks} ranks")
    started = time.time()
    group = _Ranks(ranks, on_event)
    quiet = _Quiet()  # a rank we kill is "lost" to the coordinator: not worth a warning
    try:
        # NETCOLL_TLS_* set: everything over mutual TLS (the ranks' connect() reads them too)
        async with netcoll.Coordinator(host="127.0.0.1", tls=TlsConfig.from_env()) as coord:
            try:
                await group.start(coord.address, cfg, loop=loop, python=python, connect_timeout=connect_timeout)
                await group.wait(limit)
            finally:
                if group.running:
                    quiet.enter()
                await group.close()
    finally:
        quiet.exit()
    return {"meta": group.meta(cfg, loop, started), "rows": group.rows}


def _describe_failure(
    procs: list[asyncio.subprocess.Process], errors: list[dict[str, Any]], tails: dict[int, collections.deque[str]]
) -> str:
    parts = []
    for ev in errors:
        parts.append(f"rank {ev.get('rank')}: {ev.get('error')}: {ev.get('message')}")
    for i, p in enumerate(procs):
        if p.returncode not in (0, None) and not any(ev.get("rank") == i for ev in errors):
            tail = "\n    ".join(list(tails.get(i, ()))[-15:])
            parts.append(f"rank process {i} exited with code {p.returncode}" + (f":\n    {tail}" if tail else ""))
    if not parts:
        parts.append("a rank failed without a report")
    return "benchmark failed: " + "; ".join(parts)


class _Quiet:
    """Silence the in-process coordinator's warnings about the ranks we kill."""

    def __init__(self) -> None:
        self.logger = logging.getLogger("netcoll.rendezvous")
        self.level: int | None = None

    def enter(self) -> None:
        if self.level is None:
            self.level = self.logger.level
            self.logger.setLevel(logging.ERROR)

    def exit(self) -> None:
        if self.level is not None:
            self.logger.setLevel(self.level)
            self.level = None


def _kill_all(procs: list[asyncio.subprocess.Process]) -> None:
    for p in procs:
        if p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()


async def _reap(procs: list[asyncio.subprocess.Process]) -> None:
    """Wait for killed children, even while this task is being cancelled."""
    for p in procs:
        if p.returncode is not None:
            continue
        for _ in range(3):
            try:
                await asyncio.shield(p.wait())
                break
            except asyncio.CancelledError:
                continue
