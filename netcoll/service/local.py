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
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

from ..config import UpConfig
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
    proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.DEVNULL, env=env,
                                                start_new_session=True, preexec_fn=_die_with_parent)
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


async def serve_local(cfg: UpConfig, out: IO[str] = sys.stdout) -> int:
    """``netcoll up``: coordinator + ``cfg.ranks`` daemons as child processes; until
    Ctrl-C/SIGTERM (or, with ``demo``, until every collective ran once)."""
    from ..config import DEFAULT_COORDINATOR

    stop = asyncio.Event()
    undo = _on_signals(lambda sig: stop.set())
    env = {k: v for k, v in os.environ.items()
           if k not in ("NETCOLL_RANK_HINT", "NETCOLL_ADVERTISE_HOST", "NETCOLL_HTTP_PORT", "NETCOLL_PORT",
                        "NETCOLL_HOST", "NETCOLL_COORDINATOR")}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")  # numpy's BLAS threads only compete with the ranks
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if cfg.token:
        env["NETCOLL_TOKEN"] = cfg.token
    wildcard = cfg.host in ("0.0.0.0", "::", "")
    dial_host = ("::1" if cfg.host == "::" else "127.0.0.1") if wildcard else cfg.host
    tmp = tempfile.mkdtemp(prefix="netcoll-up-")
    coord: _Child | None = None
    ranks: list[_Child] = []
    rc = 0
    try:
        http_port = cfg.coordinator_http_port
        coord = await _spawn("coordinator", [
            "coordinator", "--host", cfg.host, "--port", str(cfg.port),
            "--http-port", "off" if http_port is None else str(http_port), "--log-level", cfg.log_level],
            os.path.join(tmp, "coordinator.json"), env)
        info = await _wait_for(lambda: coord.poll_ready() if coord else None, [coord], stop, cfg.ready_timeout)
        if info is None:
            return _why_not_started(out, [coord], stop, "the coordinator")
        port = int(str(info["address"]).rpartition(":")[2])
        address = f"[{dial_host}]:{port}" if ":" in dial_host else f"{dial_host}:{port}"
        _say(out, f"netcoll up: coordinator at {address}"
                  f"{' (HTTP ' + info['http'] + ')' if info.get('http') else ''}; starting {cfg.ranks} rank daemons")
        for i in range(cfg.ranks):
            ranks.append(await _spawn(f"rank daemon {i}", [
                "rank", "--coordinator", address, "--host", "0.0.0.0" if wildcard else cfg.host, "--port", "0",
                "--http-port", "0", "--log-level", cfg.log_level], os.path.join(tmp, f"rank{i}.json"), env))
        t0 = time.monotonic()
        members = await _wait_members(address, cfg, ranks, coord, stop)
        if members is None:
            return _why_not_started(out, [coord, *ranks], stop, "the rank daemons")
        _say(out, f"netcoll up: ready: {len(members)} rank daemons registered in {time.monotonic() - t0:.1f}s")
        http_of = {c.info["member_id"]: c.info.get("http") for c in ranks if c.info}
        for m in members:
            _say(out, f"  {m['member_id']:<34} peers {m['address']:<22} http {http_of.get(m['member_id']) or '-'}")
        if cfg.demo:
            rc = await _demo(address, cfg, out, stop)
            return rc
        flag = "" if address == DEFAULT_COORDINATOR else f" --coordinator {address}"
        _say(out, "\nSubmit jobs from another terminal:")
        _say(out, f"    netcoll submit all_reduce --size 64MiB --iters 5{flag}")
        _say(out, f"    netcoll status{flag}")
        if cfg.token:
            _say(out, "  (with the same NETCOLL_TOKEN in the environment)")
        _say(out, "Ctrl-C stops the cluster.")
        rc = await _supervise(coord, ranks, stop, out)
        return rc
    finally:
        undo()
        running = [c for c in (*ranks, coord) if c is not None and c.proc.returncode is None]
        if running:
            _say(out, "netcoll up: stopping the rank daemons and the coordinator")
        await _stop(ranks, RANK_STOP_GRACE)
        if coord is not None:
            await _stop([coord], COORD_STOP_GRACE)
        for name in os.listdir(tmp):
            try:
                os.unlink(os.path.join(tmp, name))
            except OSError:
                pass
        try:
            os.rmdir(tmp)
        except OSError:
            pass
        if running:
            _say(out, "netcoll up: stopped")


async def _wait_for(probe: Callable[[], Any], children: list[_Child | None], stop: asyncio.Event,
                    timeout: float) -> Any:
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


async def _wait_members(address: str, cfg: UpConfig, ranks: list[_Child], coord: _Child,
                        stop: asyncio.Event) -> list[dict[str, Any]] | None:
    from .client import Client

    deadline = time.monotonic() + cfg.ready_timeout
    async with Client(address, token=cfg.token) as client:
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
                print(f"netcoll up: {c.name} exited with code {c.proc.returncode}; {left} rank daemons left",
                      file=sys.stderr)
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass
    return 0


DEMO_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "reduce_scatter", "all_to_all",
            "barrier")


async def _demo(address: str, cfg: UpConfig, out: IO[str], stop: asyncio.Event) -> int:
    """Run every collective once on generated, verified data, and one on your own arrays."""
    import numpy as np

    from .client import Client
    from .jobs import JobSpec

    ok = True
    _say(out, f"\nEvery collective on {cfg.ranks} ranks, {_human_bytes(cfg.size)} float32 per rank, "
              f"{cfg.iters} timed iterations after 1 warm-up, result verified on every rank:")
    _say(out, f"  {'collective':<15}{'state':<11}{'ranks':>5}{'time/iter':>12}{'algbw GB/s':>12}"
              f"{'busbw GB/s':>12}  verified")
    async with Client(address, token=cfg.token) as client:
        for op in DEMO_OPS:
            if stop.is_set():
                return 130
            fields: dict[str, Any] = {"op": op, "iters": cfg.iters, "warmup": 1}
            if op != "barrier":
                fields["size"] = cfg.size
            spec = JobSpec.model_validate(fields)
            rec = await client.run(spec)
            ok &= rec["state"] == "succeeded" and (op == "barrier" or rec["verified"] is True)
            _say(out, f"  {op:<15}{rec['state']:<11}{rec['world_size']:>5}{_human_time(rec['time_us']):>12}"
                      f"{_num(rec['algbw']):>12}{_num(rec['busbw']):>12}  "
                      f"{'-' if rec['verified'] is None else ('yes' if rec['verified'] else 'NO')}"
                      + ("" if rec["state"] == "succeeded" else f"  {rec['error']}"))
        n = cfg.ranks
        arrays = [np.arange(8, dtype=np.float64) * (r + 1) for r in range(n)]
        rec = await client.run("all_reduce", inputs=arrays)
        want = np.sum(arrays, axis=0)
        same = rec["state"] == "succeeded" and rec["result"] is not None and np.array_equal(rec["result"], want)
        ok &= bool(same)
        _say(out, f"\nall_reduce of your own arrays (rank r sends arange(8) * (r+1)): {rec['result']} "
                  f"{'== numpy' if same else '!= numpy ' + str(want) + ' ' + str(rec.get('error') or '')}")
    _say(out, "\ndemo " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _human_time(us: float | None) -> str:
    if us is None:
        return "-"
    if us < 1000:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.3f} s"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


__all__ = ["serve_local"]
