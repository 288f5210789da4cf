"""all_reduce(partial=True) with real processes over loopback TCP, the coordinator
deciding: 4 ranks; rank 3 is SIGKILLed (by PID) before the call, rank 2 is alive but
held (by the test, until ranks 0 and 1 have their result). Ranks 0 and 1 return the
average of their own two contributions, bit-identical, contributors [0, 1]; rank 2 gets
PartialExcluded naming them; all three regroup to a group of 3 whose next all_reduce
is right (tests/partial/partial_worker.py; every process is ended by the test)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

import netcoll
from tests.support import eventprocs
from tests.support.eventprocs import Proc, until

pytestmark = pytest.mark.tcp
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "partial_worker.py")


async def start(address: str, index: int, window: float) -> Proc:
    return await eventprocs.start(WORKER, address, str(index), str(window), stdin=True)


async def test_a_rank_killed_before_it_sends_is_left_out_at_once() -> None:
    """The survivors' deadline is an hour: they return at once, as the dead rank's link is gone."""
    procs: list[Proc] = []
    async with netcoll.Coordinator() as coord:
        try:
            async with asyncio.timeout(120):
                procs = [await start(coord.address, i, 3600.0) for i in range(4)]
                await until(procs, "ready")
                os.kill(procs[3].proc.pid, signal.SIGKILL)
                await procs[3].proc.wait()
                for p in procs[:3]:
                    p.go()
                got = await until(procs[:3], "partial", "partial_error")
                done = await until(procs[:3], "done")
                for p in procs[:3]:
                    assert await p.proc.wait() == 0, p.events
        finally:
            await stop(procs)
    assert [(e["event"], e["contributors"]) for e in got] == [("partial", [0, 1, 2])] * 3, got
    assert len({e["digest"] for e in got}) == 1 and got[0]["first"] == 2.0  # (1 + 2 + 3) / 3, the same bits
    assert [(d["old"], d["rank"], d["world_size"]) for d in done] == [(0, 0, 3), (1, 1, 3), (2, 2, 3)]


async def stop(procs: list[Proc]) -> None:
    for p in procs:
        if p.proc.returncode is None:
            p.proc.kill()
            await p.proc.wait()
        await asyncio.gather(p.reader, return_exceptions=True)


async def test_dead_rank_and_late_rank_excluded_then_regroup() -> None:
    """Rank 3 killed, rank 2 held past the 8 s deadline (until ranks 0 and 1 have their result)."""
    procs: list[Proc] = []
    async with netcoll.Coordinator() as coord:
        try:
            async with asyncio.timeout(120):
                procs = [await start(coord.address, i, 8.0) for i in range(4)]
                await until(procs, "ready")
                os.kill(procs[3].proc.pid, signal.SIGKILL)
                await procs[3].proc.wait()
                procs[0].go()
                procs[1].go()
                got = await until(procs[:2], "partial", "partial_error")
                procs[2].go()  # late: the others have decided
                (late,) = await until([procs[2]], "partial", "partial_error")
                done = await until(procs[:3], "done")
                for p in procs[:3]:
                    assert await p.proc.wait() == 0, p.events
        finally:
            await stop(procs)
    assert [(e["event"], e["contributors"]) for e in got] == [("partial", [0, 1]), ("partial", [0, 1])], got
    assert got[0]["digest"] == got[1]["digest"] and got[0]["first"] == 1.5  # (1 + 2) / 2, the same bits on both
    assert (late["event"], late["error"], late["ranks"]) == ("partial_error", "PartialExcluded", [0, 1]), late
    assert [(d["old"], d["rank"], d["world_size"]) for d in done] == [(0, 0, 3), (1, 1, 3), (2, 2, 3)]
