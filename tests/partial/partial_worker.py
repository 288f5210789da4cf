"""One rank of the partial all_reduce process test (tests/partial/test_partial_processes.py).

    python tests/partial/partial_worker.py ADDRESS INDEX WINDOW

Connects as rank INDEX of 4, runs one normal all_reduce and says "ready"; on a line
"go" on stdin, runs ``all_reduce(x, op="avg", partial=True, timeout=window)`` (seconds) (x = INDEX + 1
everywhere) and says what it got (or its error), then follows the documented loop:
regroup when the result left anyone out or the call failed, and check a normal
all_reduce on the new group. Every event is one JSON line on stdout.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from typing import Any

import numpy as np

import netcoll
from netcoll.errors import NetcollError


def say(**event: Any) -> None:
    print(json.dumps(event), flush=True)


async def main(address: str, index: int, window: float) -> None:
    async with netcoll.connect(
        address, world_size=4, rank=index, local_host=f"127.0.0.{index + 2}", timeout=30, collective_timeout=20
    ) as comm:
        await comm.all_reduce(np.ones(4))
        say(event="ready", rank=comm.rank)
        await asyncio.to_thread(sys.stdin.readline)
        x = np.full(1000, index + 1.0)
        work = comm.all_reduce(x, op="avg", partial=True, timeout=window)
        try:
            y = await work
        except NetcollError as exc:
            say(event="partial_error", rank=index, error=type(exc).__name__, ranks=list(getattr(exc, "ranks", ())))
            regroup = True
        else:
            assert work.contributors is not None
            digest = hashlib.sha256(y.tobytes()).hexdigest()
            say(event="partial", rank=index, contributors=list(work.contributors), digest=digest, first=float(y[0]))
            regroup = len(work.contributors) < comm.world_size
        if regroup:
            comm = await comm.regroup(timeout=30)
        n = comm.world_size
        z = await comm.all_reduce(np.full(8, comm.rank + 1.0), timeout=20)
        assert np.array_equal(z, np.full(8, n * (n + 1) / 2)), (comm.rank, n, z)
        say(event="done", old=index, rank=comm.rank, world_size=n)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
