"""The elastic-group example of DESIGN.md ("Elastic groups") with real processes:
4 ranks loop on all_reduce, rank 3 is SIGKILLed, the survivors catch the
NetcollError, regroup to 3 (ranks 0, 1, 2, in their old order), a fifth process
connects with elastic=True and is admitted as rank 3 (joined True), rank 0
broadcasts the step counter, and all_reduce is right on all 4
(tests/integration/elastic_worker.py; every process is ended by the test)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

import netcoll
from tests.support import eventprocs
from tests.support.eventprocs import Proc, until

pytestmark = pytest.mark.tcp
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_worker.py")


async def start(address: str, role: str, index: int) -> Proc:
    return await eventprocs.start(WORKER, address, role, str(index))


async def test_kill_regroup_admit_a_newcomer() -> None:
    procs: list[Proc] = []
    async with netcoll.Coordinator() as coord:
        try:
            async with asyncio.timeout(150):
                procs = [await start(coord.address, "member", i) for i in range(4)]
                await until(procs, "stepping")
                killed_at = time.time()
                os.kill(procs[3].proc.pid, signal.SIGKILL)
                await procs[3].proc.wait()
                survivors = procs[:3]
                regrouped = await until(survivors, "regrouped")
                assert [(e["old_rank"], e["rank"], e["world_size"]) for e in regrouped] == [
                    (0, 0, 3),
                    (1, 1, 3),
                    (2, 2, 3),
                ]
                assert len({e["step"] for e in regrouped}) == 1  # rank 0's counter, on all
                new = await start(coord.address, "newcomer", 4)
                procs.append(new)
                done = await until([*survivors, new], "done")
                for p in [*survivors, new]:
                    assert await p.proc.wait() == 0, p.events
        finally:
            for p in procs:
                if p.proc.returncode is None:
                    p.proc.kill()
                    await p.proc.wait()
                await asyncio.gather(p.reader, return_exceptions=True)
    admitted = new.first("admitted")
    assert admitted is not None and (admitted["rank"], admitted["world_size"], admitted["joined"]) == (3, 4, True)
    grown = [p.first("grown") for p in survivors]
    assert all(g is not None and g["world_size"] == 4 for g in grown), grown
    assert admitted["step"] == grown[0]["step"]  # type: ignore[index]  # rank 0's step counter reached the joiner
    assert [(d["rank"], d["world_size"], d["joined"]) for d in done] == [
        (0, 4, False),
        (1, 4, False),
        (2, 4, False),
        (3, 4, True),
    ]
    assert len({d["step"] for d in done}) == 1
    # figures for the record (printed with -s; never asserted: this machine's speed is no contract)
    costs = [c for g in grown if g is not None for c in g["noop_regroup_s"]]
    lag = max(e["time"] for e in regrouped) - killed_at
    median = sorted(costs)[len(costs) // 2] if costs else float("nan")
    print(f"\nkill -> regrouped {lag * 1000:.0f} ms; no-change regroup median {median * 1000:.2f} ms (n={len(costs)})")
