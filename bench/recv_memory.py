"""Receive memory of a rank whose peer runs ahead of it (loopback only).

Two measurements, each with a coordinator in this process and two rank
processes on 127.0.0.1:

* ``ahead``: rank 0 issues ``--count`` sends of ``--size`` bytes to rank 1
  (200 x 1 MiB by default) while rank 1 sleeps ``--sleep`` seconds before
  receiving them. Reported: rank 1's peak RSS over its baseline (sampled every
  5 ms from /proc/self/statm), its unexpected-bytes peak from the link's
  stats, and the time to receive everything. Goal: peak <= 96 MiB with the
  default 64 MiB window.
* ``declare``: rank 0 writes, on its authenticated link to rank 1, a DATA
  frame that declares a 4 GiB payload (bypassing its own flow control), then
  a little data. Reported: rank 1's RSS growth 1 s later and why the link
  closed. Goal: no growth (the frame is refused at its header).

    python3 bench/recv_memory.py                 # both, default window
    python3 bench/recv_memory.py --window 16M    # NETCOLL_RECV_WINDOW for the ranks
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

import netcoll
from netcoll.sizes import parse_size
from netcoll.wire import Kind, encode_header

MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Sampler:
    """Peak RSS, sampled every ``period`` seconds by a task of this loop."""

    def __init__(self, period: float = 0.005) -> None:
        self.period, self.peak = period, rss()
        self._task: asyncio.Future[None] | None = None

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss())
            await asyncio.sleep(self.period)

    def __enter__(self) -> Sampler:
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = max(self.peak, rss())
        if self._task is not None:
            self._task.cancel()


async def rank_ahead(comm: netcoll.Communicator, args: argparse.Namespace) -> dict[str, Any]:
    if comm.rank == 0:
        data = np.full(args.size, 7, np.uint8)
        await comm.barrier()
        works = [comm.send(data, 1) for _ in range(args.count)]  # all issued at once: as far ahead as it gets
        for w in works:
            await w
        stats = link_stats(comm, 1)
        return {"sender_rendezvous_frames": stats.get("rendezvous")}
    base = rss()
    await comm.barrier()
    with Sampler() as sampler:
        await asyncio.sleep(args.sleep)
        asleep_peak = sampler.peak
        t0 = time.perf_counter()
        for _ in range(args.count):
            got = await comm.recv(0)
            assert got.nbytes == args.size and got[0] == 7
            del got
        elapsed = time.perf_counter() - t0
    stats = link_stats(comm, 0)
    return {
        "baseline_mib": base / MIB,
        "peak_over_baseline_mib": (sampler.peak - base) / MIB,
        "peak_while_asleep_mib": (asleep_peak - base) / MIB,
        "receive_s": elapsed,
        "unexpected_peak_mib": stats.get("unexpected_peak", 0) / MIB,
        "link_kind": stats.get("kind"),
        "window_mib": stats.get("recv_window", 0) / MIB,
    }


def link_stats(comm: netcoll.Communicator, peer: int) -> dict[str, Any]:
    """The link's stats as a dict ({} on a netcoll without per-peer links)."""
    get = getattr(comm.transport, "link_stats", None)
    return get()[peer].as_dict() if get is not None else {}


async def rank_declare(comm: netcoll.Communicator, args: argparse.Namespace) -> dict[str, Any]:
    if comm.rank == 0:
        await comm.barrier()
        link: Any = comm.transport.links[1]
        sock = link.transport if hasattr(link, "transport") else link  # (before per-peer links: the protocol)
        header = {"g": "default/p2p/0/0>1", "q": 0, "s": 0, "c": 0, "f": "p2p"}
        sock.write(encode_header(Kind.DATA, header, 4 << 30) + b"\0" * MIB)
        await asyncio.sleep(2.0)
        return {}
    base = rss()
    await comm.barrier()
    with Sampler() as sampler:
        try:
            await comm.recv(0, timeout=10)
            outcome = "received?!"
        except netcoll.NetcollError as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(1.0)
    lost = link_stats(comm, 0).get("lost")
    return {
        "rss_growth_mib": (rss() - base) / MIB,
        "peak_growth_mib": (sampler.peak - base) / MIB,
        "recv": outcome[:300],
        "link_lost": lost,
    }


async def rank_main(args: argparse.Namespace) -> None:
    async with netcoll.connect(args.address, world_size=2, rank=args.rank, local_host="127.0.0.1", timeout=30) as comm:
        fn = rank_ahead if args.scenario == "ahead" else rank_declare
        result = await fn(comm, args)
        if comm.rank == 0:
            await asyncio.sleep(0.2)
    print(json.dumps(result), flush=True)


async def run(scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    if args.window:
        env["NETCOLL_RECV_WINDOW"] = args.window
    async with netcoll.Coordinator(host="127.0.0.1", port=0) as coord:
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--role",
                str(r),
                "--address",
                coord.address,
                "--scenario",
                scenario,
                "--count",
                str(args.count),
                "--size",
                str(args.size),
                "--sleep",
                str(args.sleep),
                stdout=subprocess.PIPE,
                env=env,
            )
            for r in (0, 1)
        ]
        try:
            async with asyncio.timeout(120):
                outs = [await p.communicate() for p in procs]
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    await p.wait()
    result: dict[str, Any] = {}
    for r, (out, _) in enumerate(outs):
        lines = out.decode().strip().splitlines()
        result.update(json.loads(lines[-1]) if lines else {f"rank {r}": f"exited with {procs[r].returncode}"})
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--scenario", choices=["ahead", "declare", "both"], default="both")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--size", type=parse_size, default=MIB, help="bytes per message: 1048576, 1M, 1MiB, 1MB")
    ap.add_argument("--sleep", type=float, default=5.0)
    ap.add_argument("--window", default=None, help="receive window for the ranks (NETCOLL_RECV_WINDOW)")
    ap.add_argument("--role", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--address", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role is not None:
        args.rank = args.role
        asyncio.run(rank_main(args))
        return
    for scenario in ["ahead", "declare"] if args.scenario == "both" else [args.scenario]:
        print(scenario, json.dumps(asyncio.run(run(scenario, args)), indent=1))


if __name__ == "__main__":
    main()
