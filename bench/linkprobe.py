"""One rank of the link probe (started by :func:`bench.runners.probe_links`): which kind of
link (``tcp``, ``shm``, ...) netcoll uses between rank processes on this machine under the
current ``NETCOLL_TRANSPORT``.

    python bench/linkprobe.py --address HOST:PORT --world-size N --rank R

Connects, runs one all-pairs all_reduce (every rank talks to every other), and prints
``{"event": "links", "rank": R, "kinds": {peer: kind}}`` from ``comm.link_stats()``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import numpy as np

import netcoll


async def probe(address: str, world_size: int, rank: int, timeout: float) -> dict[str, str]:
    async with netcoll.connect(
        address, world_size=world_size, rank=rank, group="linkprobe", local_host="127.0.0.1", timeout=timeout
    ) as comm:
        if world_size > 1:
            await comm.all_reduce(np.zeros(1, np.float32), algorithm="allpairs")
        kinds = {str(peer): str(s["kind"]) for peer, s in comm.link_stats().items()}
        await comm.barrier()
    return kinds


def main() -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("--address", required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--timeout", type=float, default=120.0)
    ns = p.parse_args()
    kinds = asyncio.run(probe(ns.address, ns.world_size, ns.rank, ns.timeout))
    sys.stdout.write(json.dumps({"event": "links", "rank": ns.rank, "kinds": kinds}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
