"""``netcoll up``: a coordinator and N rank daemons as local child processes,
started through the same entry points the containers run
(``python -m netcoll coordinator|rank``), supervised until Ctrl-C/SIGTERM, then
stopped in order (ranks drain first); ``--demo`` runs every collective once as
a job and exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

from ..config import UpConfig
from ..sizes import format_size
from .serve import (
    COORD_STOP_GRACE,
    RANK_STOP_GRACE,
    _on_signals,
)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except Exception:  # noqa: BLE001 - best effort
            pass


class _Child:
    def __init__(self, name: str, proc: asyncio.subprocess.Process, ready_file: str) -> None:
        self.name, self.proc, self.ready_file = name, proc, ready_file
        self.info: dict[str, Any] | None = None

    def poll_ready(self) -> dict[str, Any] | None:
        if self.info is None and os.path.exists(self.ready_file):
            try:
                with open(self.ready_file) as f:
                    self.info = json.load(f)
            except (OSError, ValueError):
                return None
        return self.info


async def _spawn(name: str, args: list[str], ready_file: str, env: dict[str, str]) -> _Child:
    cmd = [sys.executable, "-m", "netcoll", *args, "--ready-file", ready_file]
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=asyncio.subprocess.DEVNULL, env=env, start_new_session=True, preexec_fn=_die_with_parent
    )
    return _Child(name, proc, ready_file)


async def _stop(children: list[_Child], grace: float) -> None:
    live = [c for c in children if c.proc.returncode is None]
    for c in live:
        try:
            c.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    if not live:
        return
    _, pending = await asyncio.wait([asyncio.ensure_future(c.proc.wait()) for c in live], timeout=grace)
    for c in live:
        if c.proc.returncode is None:
            try:
                c.proc.kill()
            except ProcessLookupError:
                pass
            await c.proc.wait()
    for fut in pending:
        fut.cancel()


def _say(out: IO[str], text: str = "") -> None:
    out.write(text + "\n")
    out.flush()


_SERVER_VARIABLES = (
    "NETCOLL_RANK_HINT",
    "NETCOLL_ADVERTISE_HOST",
    "NETCOLL_HTTP_PORT",
    "NETCOLL_PORT",
    "NETCOLL_HOST",
    "NETCOLL_COORDINATOR",
)


def _child_env(cfg: UpConfig) -> dict[str, str]:
    """The children's environment: ours without the per-server variables (each child gets
    flags), unbuffered output, one BLAS thread, and the token."""
    env = {k: v for k, v in os.environ.items() if k not in _SERVER_VARIABLES}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")  # numpy's BLAS threads only compete with the ranks
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if cfg.token:
        env["NETCOLL_TOKEN"] = cfg.token
    for field, var in (("tls_cert", "NETCOLL_TLS_CERT"), ("tls_key", "NETCOLL_TLS_KEY"), ("tls_ca", "NETCOLL_TLS_CA")):
        path = getattr(cfg, field)
        if path:  # --tls-* (or the variables): every child runs with the same TLS files
            env[var] = os.path.abspath(path)
    return env


class _Local:
    """One ``netcoll up``: the coordinator and rank daemon children, and their files."""

    def __init__(self, cfg: UpConfig, out: IO[str], stop: asyncio.Event) -> None:
        self.cfg, self.out, self.stop = cfg, out, stop
        self.env = _child_env(cfg)
        self.wildcard = cfg.host in ("0.0.0.0", "::", "")
        self.tmp = tempfile.mkdtemp(prefix="netcoll-up-")
        self.coord: _Child | None = None
        self.ranks: list[_Child] = []

    async def start_coordinator(self) -> str | None:
        """Start the coordinator; its address once ready (None: it did not start)."""
        cfg = self.cfg
        http_port = cfg.coordinator_http_port
        self.coord = coord = await _spawn(
            "coordinator",
            [
                "coordinator",
                "--host",
                cfg.host,
                "--port",
                str(cfg.port),
                "--http-port",
                "off" if http_port is None else str(http_port),
                "--log-level",
                cfg.log_level,
            ],
            os.path.join(self.tmp, "coordinator.json"),
            self.env,
        )
        info = await _wait_for(coord.poll_ready, [coord], self.stop, cfg.ready_timeout)
        if info is None:
            return None
        dial_host = ("::1" if cfg.host == "::" else "127.0.0.1") if self.wildcard else cfg.host
        port = int(str(info["address"]).rpartition(":")[2])
        address = f"[{dial_host}]:{port}" if ":" in dial_host else f"{dial_host}:{port}"
        _say(
            self.out,
            f"netcoll up: coordinator at {address}"
            f"{' (HTTP ' + info['http'] + ')' if info.get('http') else ''}; "
            f"starting {cfg.ranks} rank daemons",
        )
        return address

    async def start_ranks(self, address: str) -> list[dict[str, Any]] | None:
        """Start the rank daemons; the members once all registered (None: they did not)."""
        cfg = self.cfg
        for i in range(cfg.ranks):
            self.ranks.append(
                await _spawn(
                    f"rank daemon {i}",
                    [
                        "rank",
                        "--coordinator",
                        address,
                        "--host",
                        "0.0.0.0" if self.wildcard else cfg.host,
                        "--port",
                        "0",
                        "--http-port",
                        "0",
                        "--log-level",
                        cfg.log_level,
                    ],
                    os.path.join(self.tmp, f"rank{i}.json"),
                    self.env,
                )
            )
        t0 = time.monotonic()
        assert self.coord is not None
        members = await _wait_members(address, cfg, self.ranks, self.coord, self.stop)
        if members is not None:
            _say(self.out, f"netcoll up: ready: {len(members)} rank daemons registered in {time.monotonic() - t0:.1f}s")
            http_of = {c.info["member_id"]: c.info.get("http") for c in self.ranks if c.info}
            for m in members:
                _say(
                    self.out,
                    f"  {m['member_id']:<34} peers {m['address']:<22} http {http_of.get(m['member_id']) or '-'}",
                )
        return members

    def hint(self, address: str) -> None:
        """How to use the running cluster."""
        from ..config import DEFAULT_COORDINATOR

        flag = "" if address == DEFAULT_COORDINATOR else f" --coordinator {address}"
        _say(self.out, "\nSubmit jobs from another terminal:")
        _say(self.out, f"    netcoll submit all_reduce --size 64MiB --iters 5{flag}")
        _say(self.out, f"    netcoll status{flag}")
        if self.cfg.token:
            _say(self.out, "  (with the same NETCOLL_TOKEN in the environment)")
        _say(self.out, "Ctrl-C stops the cluster.")

    async def run(self) -> int:
        """Start everything, then run the demo or supervise until stopped; the exit code."""
        address = await self.start_coordinator()
        if address is None:
            return _why_not_started(self.out, [self.coord], self.stop, "the coordinator")
        if await self.start_ranks(address) is None:
            return _why_not_started(self.out, [self.coord, *self.ranks], self.stop, "the rank daemons")
        if self.cfg.demo:
            return await _demo(address, self.cfg, self.out, self.stop)
        self.hint(address)
        assert self.coord is not None
        return await _supervise(self.coord, self.ranks, self.stop, self.out)

    async def close(self) -> None:
        """Stop the ranks (they drain), then the coordinator; remove the ready files."""
        running = [c for c in (*self.ranks, self.coord) if c is not None and c.proc.returncode is None]
        if running:
            _say(self.out, "netcoll up: stopping the rank daemons and the coordinator")
        await _stop(self.ranks, RANK_STOP_GRACE)
        if self.coord is not None:
            await _stop([self.coord], COORD_STOP_GRACE)
        shutil.rmtree(self.tmp, ignore_errors=True)
        if running:
            _say(self.out, "netcoll up: stopped")


async def serve_local(cfg: UpConfig, out: IO[str] = sys.stdout) -> int:
    """``netcoll up``: coordinator + ``cfg.ranks`` daemons as child processes; until
    Ctrl-C/SIGTERM (or, with ``demo``, until every collective ran once)."""
    stop = asyncio.Event()
    undo = _on_signals(lambda sig: stop.set())
    local = _Local(cfg, out, stop)
    try:
        return await local.run()
    finally:
        undo()
        await local.close()


async def _wait_for(
    probe: Callable[[], Any], children: list[_Child | None], stop: asyncio.Event, timeout: float
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        value = probe()
        if value:
            return value
        if any(c is not None and c.proc.returncode is not None for c in children):
            return None
        await asyncio.sleep(0.05)
    return None


def _why_not_started(out: IO[str], children: list[_Child | None], stop: asyncio.Event, what: str) -> int:
    if stop.is_set():
        return 0
    dead = [c for c in children if c is not None and c.proc.returncode is not None]
    if dead:
        c = dead[0]
        print(f"netcoll up: {c.name} exited with code {c.proc.returncode} (its error is above)", file=sys.stderr)
    else:
        print(f"netcoll up: {what} did not become ready in time", file=sys.stderr)
    return 1


async def _wait_members(
    address: str, cfg: UpConfig, ranks: list[_Child], coord: _Child, stop: asyncio.Event
) -> list[dict[str, Any]] | None:
    from .client import Client

    deadline = time.monotonic() + cfg.ready_timeout
    async with Client(address, token=cfg.token, tls=cfg.tls_config()) as client:
        while time.monotonic() < deadline and not stop.is_set():
            if coord.proc.returncode is not None or any(c.proc.returncode is not None for c in ranks):
                return None
            ours = {c.poll_ready()["member_id"] for c in ranks if c.poll_ready()}  # type: ignore[index]
            if len(ours) == len(ranks):
                members = await client.members()
                if ours <= {m["member_id"] for m in members}:
                    return [m for m in members if m["member_id"] in ours]
            await asyncio.sleep(0.1)
    return None


async def _supervise(coord: _Child, ranks: list[_Child], stop: asyncio.Event, out: IO[str]) -> int:
    reported: set[int] = set()
    while not stop.is_set():
        if coord.proc.returncode is not None:
            print(f"netcoll up: the coordinator exited with code {coord.proc.returncode}", file=sys.stderr)
            return 1
        for i, c in enumerate(ranks):
            if c.proc.returncode is not None and i not in reported:
                reported.add(i)
                left = sum(r.proc.returncode is None for r in ranks)
                print(
                    f"netcoll up: {c.name} exited with code {c.proc.returncode}; {left} rank daemons left",
                    file=sys.stderr,
                )
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass
    return 0


#: what the demo's columns mean, said once under them (a newcomer's first numbers)
DEMO_COLUMNS = (
    "\ntime/iter: the mean of each iteration's slowest rank. algbw: bytes per rank / time/iter;\n"
    "busbw: algbw x the collective's bus factor (nccl-tests' busbw: what each link carried, so\n"
    "collectives and rank counts compare). In GB/s (10^9 bytes/s). Python over loopback with more\n"
    "ranks than cores stays below 1 GB/s at these sizes; docs/benchmarks.md has the measured range."
)


async def _demo(address: str, cfg: UpConfig, out: IO[str], stop: asyncio.Event) -> int:
    """Run every collective of the registry once on generated, verified data, and one
    all_reduce on your own arrays; exit 0 iff all passed."""
    from .. import collectives
    from .client import Client

    ok = True
    _say(
        out,
        f"\nEvery collective on {cfg.ranks} ranks, {format_size(cfg.size)} float32 per rank, "
        f"{cfg.iters} timed iterations after 1 warm-up, result verified on every rank:",
    )
    _say(
        out,
        f"  {'collective':<15}{'state':<11}{'ranks':>5}{'time/iter':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}  verified",
    )
    async with Client(address, token=cfg.token, tls=cfg.tls_config()) as client:
        for coll in collectives.REGISTRY.values():
            if stop.is_set():
                return 130
            rec = await client.run(
                coll.name, iters=cfg.iters, warmup=1, **({"size": cfg.size} if coll.has_data else {})
            )
            ok &= rec["state"] == "succeeded" and (not coll.has_data or rec["verified"] is True)
            _say(out, _demo_row(coll.name, rec))
        ok &= await _demo_own_arrays(client, cfg.ranks, out)
    _say(out, DEMO_COLUMNS)
    _say(out, "\ndemo " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


def _demo_row(op: str, rec: dict[str, Any]) -> str:
    verified = "-" if rec["verified"] is None else ("yes" if rec["verified"] else "NO")
    return (
        f"  {op:<15}{rec['state']:<11}{rec['world_size']:>5}{human_time(rec['time_s']):>12}"
        f"{gbps(rec['algbw']):>12}{gbps(rec['busbw']):>12}  {verified}"
        + ("" if rec["state"] == "succeeded" else f"  {rec['error']}")
    )


async def _demo_own_arrays(client: Any, n: int, out: IO[str]) -> bool:
    """all_reduce of arrays sent by the client, compared with numpy."""
    import numpy as np

    arrays = [np.arange(8, dtype=np.float64) * (r + 1) for r in range(n)]
    rec = await client.run("all_reduce", inputs=arrays)
    want = np.sum(arrays, axis=0)
    same = rec["state"] == "succeeded" and rec["result"] is not None and np.array_equal(rec["result"], want)
    _say(
        out,
        f"\nall_reduce of your own arrays (rank r sends arange(8) * (r+1)): {rec['result']} "
        f"{'== numpy' if same else '!= numpy ' + str(want) + ' ' + str(rec.get('error') or '')}",
    )
    return bool(same)


def human_time(seconds: float | None) -> str:
    """A time in seconds as ``12.3 us``, ``4.56 ms`` or ``1.234 s`` (``-``: unknown)."""
    if seconds is None:
        return "-"
    us = seconds * 1e6
    if us < 1000:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{seconds:.3f} s"


def gbps(x: float | None) -> str:
    """A bandwidth in GB/s with three decimals (``-``: unknown)."""
    return "-" if x is None else f"{x:.3f}"


__all__ = ["gbps", "human_time", "serve_local"]
