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


async def run_local(cfg: SweepConfig, ranks: int = 4, *, on_event: Event | None = None, loop: str = "auto",
                    python: str | None = None, limit: float | None = None,
                    connect_timeout: float = 60.0) -> dict[str, Any]:
    """Run ``cfg`` on a fresh local cluster of ``ranks`` processes.

    Returns ``{"meta": {...}, "rows": [...]}``. ``on_event`` sees rank 0's
    ``start``/``row`` events as they happen (for a live table and progress).
    Raises :class:`BenchError` if any rank fails, ``TimeoutError`` after
    ``limit`` seconds.
    """
    import netcoll

    cfg.validate()
    if ranks < 1:
        raise ValueError(f"--ranks must be >= 1, got {ranks}")
    if cfg.root >= ranks:
        raise ValueError(f"-r/--root {cfg.root} is not a rank of {ranks} ranks")
    started = time.time()
    rows: list[dict[str, Any]] = []
    hellos: dict[int, dict[str, Any]] = {}
    rank_list: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    stderr_tails: dict[int, collections.deque[str]] = {}
    failed = asyncio.Event()
    callback_errors: list[Exception] = []
    procs: list[asyncio.subprocess.Process] = []

    async def read_stdout(i: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                stderr_tails[i].append(line)
                continue
            kind = ev.get("event")
            if kind == "hello":
                hellos[i] = ev
            elif kind == "row":
                rows.append(ev["row"])
            elif kind == "error":
                errors.append(ev)
                failed.set()
            elif kind == "ranks":
                rank_list[:] = ev["ranks"]
            if on_event is not None and kind in ("ranks", "start", "row"):
                try:
                    on_event(ev)
                except Exception as exc:  # e.g. BrokenPipeError from the table printer: stop the run
                    callback_errors.append(exc)
                    failed.set()
                    return

    async def read_stderr(i: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        async for raw in proc.stderr:
            stderr_tails[i].append(raw.decode(errors="replace").rstrip("\n"))

    async def wait_exit(proc: asyncio.subprocess.Process) -> None:
        if await proc.wait() != 0:
            failed.set()

    tasks: list[asyncio.Task[None]] = []
    quiet = _Quiet()  # a rank we kill is "lost" to the coordinator: not worth a warning
    try:
        async with netcoll.Coordinator(host="127.0.0.1") as coord:
            env = child_env()
            try:
                for i in range(ranks):
                    stderr_tails[i] = collections.deque(maxlen=40)
                    proc = await asyncio.create_subprocess_exec(
                        python or sys.executable, "-m", "netcoll.bench.worker", "--address", coord.address,
                        "--world-size", str(ranks), "--rank", str(i), "--loop", loop,
                        "--connect-timeout", str(connect_timeout), "--config", json.dumps(cfg.to_json()),
                        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
                    procs.append(proc)
                    tasks += [asyncio.create_task(read_stdout(i, proc)), asyncio.create_task(read_stderr(i, proc)),
                              asyncio.create_task(wait_exit(proc))]
                fail_wait = asyncio.create_task(failed.wait())
                deadline = None if limit is None else time.monotonic() + limit
                pending: set[asyncio.Future[Any]] = set(tasks)
                try:
                    while pending and not failed.is_set():
                        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                        _, pending = await asyncio.wait(pending | {fail_wait}, timeout=timeout,
                                                        return_when=asyncio.FIRST_COMPLETED)
                        pending.discard(fail_wait)
                        if deadline is not None and time.monotonic() >= deadline and pending:
                            raise TimeoutError(f"benchmark did not finish within {limit:g} s")
                finally:
                    fail_wait.cancel()
                if callback_errors:
                    raise callback_errors[0]
                if failed.is_set():
                    # give the other ranks a moment to report their side (a lost peer, ...)
                    if pending:
                        await asyncio.wait(pending, timeout=3.0)
                    raise BenchError(_describe_failure(procs, errors, stderr_tails))
            finally:
                if any(p.returncode is None for p in procs):
                    quiet.enter()
                _kill_all(procs)
                for t in tasks:
                    t.cancel()
                await _reap(procs)
                if tasks:
                    await asyncio.wait(tasks)
                for t in tasks:  # retrieve every outcome (no "never retrieved" warnings)
                    if not t.cancelled():
                        t.exception()
    finally:
        quiet.exit()

    meta = {
        **machine_facts(),
        "world_size": ranks,
        "transport": "tcp, loopback 127.0.0.1",
        "loop": hellos.get(0, {}).get("loop", loop),
        "config": cfg.to_json(),
        "ranks": rank_list or [{"rank": h.get("rank"), "pid": h.get("pid"), "host": h.get("host")}
                               for _, h in sorted(hellos.items())],
        "baseline_rss_bytes": max((r["baseline_rss_bytes"] for r in rows), default=None),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "elapsed_s": round(time.time() - started, 3),
        "in_place": "not measured (out-of-place only)",
    }
    return {"meta": meta, "rows": rows}


def _describe_failure(procs: list[asyncio.subprocess.Process], errors: list[dict[str, Any]],
                      tails: dict[int, collections.deque[str]]) -> str:
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
