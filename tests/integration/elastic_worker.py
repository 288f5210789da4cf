"""One process of the elastic-group example (tests/integration/test_elastic_processes.py).

    python tests/integration/elastic_worker.py ADDRESS member INDEX     # one of the 4 first ranks
    python tests/integration/elastic_worker.py ADDRESS newcomer INDEX   # connects with elastic=True

A member loops on all_reduce; on a NetcollError it regroups; every few steps it
regroups too (admitting a newcomer once one waits); after every regroup that
changed the group, rank 0 broadcasts the step counter. Once the group has grown
back to 4 (or, for the newcomer, once admitted) it runs CHECKS more all_reduces and
exits. Every event is one JSON line on stdout (``time`` is ``time.time()``); a
wrong all_reduce result is an AssertionError (a crash, which fails the test).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import numpy as np

import netcoll
from netcoll.errors import NetcollError

WORLD = 4
EVERY = 5  # steps between regroups
CHECKS = 10  # all_reduces checked once the group is 4 again
DEADLINE = 90.0  # seconds a member waits for the newcomer at most


def say(**event: Any) -> None:
    print(json.dumps({"pid": os.getpid(), "time": time.time(), **event}), flush=True)


async def step_once(comm: netcoll.Communicator) -> None:
    n = comm.world_size
    y = await comm.all_reduce(np.full(8, comm.rank + 1.0), timeout=20)
    assert np.array_equal(y, np.full(8, n * (n + 1) / 2)), (comm.rank, n, y)


async def share_step(comm: netcoll.Communicator, step: int) -> int:
    """Rank 0's step counter, on every rank of the group."""
    got = await comm.broadcast(np.array([step if comm.rank == 0 else 0], np.int64), root=0, timeout=20)
    return int(got[0])


async def checks(comm: netcoll.Communicator, step: int) -> None:
    for _ in range(CHECKS):
        await step_once(comm)
        step += 1
    say(event="done", rank=comm.rank, world_size=comm.world_size, joined=comm.joined, step=step)


async def member(address: str, index: int) -> None:
    async with netcoll.connect(
        address, world_size=WORLD, rank=index, local_host=f"127.0.0.{index + 2}", timeout=30, collective_timeout=20
    ) as comm:
        say(event="ready", rank=comm.rank)
        step, costs, end = 0, [], time.monotonic() + DEADLINE
        while time.monotonic() < end:
            try:
                await step_once(comm)
                step += 1
                if step == 20:
                    say(event="stepping", rank=comm.rank)  # the test kills rank 3 once all say so
                if step % EVERY:
                    await asyncio.sleep(0.005)
                    continue
                t0 = time.perf_counter()
                new = await comm.regroup(timeout=30)
            except NetcollError as exc:
                say(event="failed", rank=comm.rank, error=type(exc).__name__)
                new = await comm.regroup(timeout=30)
                step = await share_step(new, step)
                say(event="regrouped", old_rank=index, rank=new.rank, world_size=new.world_size, step=step)
                comm = new
                continue
            if new is comm:
                costs.append(time.perf_counter() - t0)
                continue
            comm = new
            step = await share_step(comm, step)
            say(event="grown", rank=comm.rank, world_size=comm.world_size, step=step, noop_regroup_s=costs)
            if comm.world_size == WORLD:
                await checks(comm, step)
                return
        raise TimeoutError("the group did not grow back within the deadline")


async def newcomer(address: str, index: int) -> None:
    async with netcoll.connect(
        address, group="default", elastic=True, local_host=f"127.0.0.{index + 2}", timeout=60, collective_timeout=20
    ) as comm:
        step = await share_step(comm, 0)
        say(event="admitted", rank=comm.rank, world_size=comm.world_size, joined=comm.joined, step=step)
        await checks(comm, step)


if __name__ == "__main__":
    role = {"member": member, "newcomer": newcomer}[sys.argv[2]]
    asyncio.run(role(sys.argv[1], int(sys.argv[3])))
