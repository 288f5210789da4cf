"""What ``all_reduce(partial=True)`` costs against a normal ``all_reduce`` (docs/training.md,
"Partial results"): every rank delivering, so both compute the same sum.

    python3 bench/partial.py [--ranks 4] [--sizes 1M,16M] [--iters 15] [--links tcp]

Starts a coordinator, then one process per rank (``netcoll.connect``, each from its
own loopback address); each size is timed ``iters`` times per kind (:data:`KINDS`), the
kinds alternating, each call after a barrier. Rank 0 prints the median seconds per call
of each kind (the slowest rank's time of each call, gathered after the loop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

import numpy as np

import netcoll
from netcoll.sizes import parse_size

#: the normal all_reduce (``auto``: the ring at these sizes), the partial one, and the normal
#: one over the partial's pattern (every rank to every rank): partial - allpairs is the agreement
KINDS = ("normal", "partial", "allpairs")


async def rank(address: str, index: int, world: int, sizes: list[int], iters: int) -> None:
    async with netcoll.connect(
        address, world_size=world, rank=index, local_host=f"127.0.0.{index + 2}", collective_timeout=120
    ) as comm:
        rows = []
        for size in sizes:
            x = np.ones(size // 4, np.float32)
            times: dict[str, list[float]] = {kind: [] for kind in KINDS}
            for i in range(iters + 2):  # two warm-up rounds
                for kind in KINDS:
                    await comm.barrier()
                    t0 = time.perf_counter()
                    if kind == "allpairs":
                        y = await comm.all_reduce(x, algorithm="allpairs", timeout=120)
                    else:
                        y = await comm.all_reduce(x, partial=kind == "partial", timeout=120)
                    took = time.perf_counter() - t0
                    assert float(y[0]) == world, (kind, y[0])
                    if i >= 2:
                        times[kind].append(took)
            slowest = {}
            for kind, ts in times.items():  # the slowest rank's time of each call
                got = await comm.all_reduce(np.array(ts), op="max")
                slowest[kind] = statistics.median(got.tolist())
            rows.append({"bytes": size, **slowest})
        if comm.rank == 0:
            print(json.dumps({"ranks": world, "links": os.environ.get("NETCOLL_TRANSPORT", "auto"), "rows": rows}))


async def lead(args: argparse.Namespace) -> int:
    async with netcoll.Coordinator() as coord:
        env = {**os.environ, "NETCOLL_TRANSPORT": args.links}
        cmd = [sys.executable, __file__, "--rank-of", coord.address]
        procs = [
            await asyncio.create_subprocess_exec(
                *cmd, str(i), "--ranks", str(args.ranks), "--sizes", args.sizes, "--iters", str(args.iters), env=env
            )
            for i in range(args.ranks)
        ]
        codes = [await p.wait() for p in procs]
    return max(codes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--sizes", default="1M,16M")
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--links", default="tcp", choices=("tcp", "auto"))
    p.add_argument("--rank-of", nargs=2, metavar=("ADDRESS", "INDEX"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_of:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
        asyncio.run(rank(args.rank_of[0], int(args.rank_of[1]), args.ranks, sizes, args.iters))
        return 0
    return asyncio.run(lead(args))


if __name__ == "__main__":
    sys.exit(main())
