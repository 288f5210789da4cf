"""The hang explainer: the coordinator's arrival board shows who a stuck
collective waits for (from the ranks' heartbeats), and mismatched calls side
by side; ``netcoll status`` prints it."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

import netcoll
from netcoll.cli.status import print_status
from netcoll.limits import Limits
from netcoll.rendezvous import board as arrivals
from netcoll.service import Client, JobService

pytestmark = pytest.mark.tcp


@contextlib.asynccontextmanager
async def _world(n: int) -> AsyncIterator[tuple[Client, list[netcoll.Communicator]]]:
    """A coordinator with its job service (so the client's status works) and ``n``
    embedded ranks that heartbeat every 0.1 s."""
    limits = Limits(liveness_timeout_s=0.4, progress_timeout_s=30.0)
    async with netcoll.Coordinator(limits=limits) as coord:
        svc = JobService(coord)
        async with contextlib.AsyncExitStack() as stack:
            comms = await asyncio.gather(
                *(
                    stack.enter_async_context(
                        netcoll.connect(coord.address, world_size=n, rank=r, local_host=f"127.0.0.{r + 2}", timeout=20)
                    )
                    for r in range(n)
                )
            )
            client = await stack.enter_async_context(Client(coord.address))
            yield client, list(comms)
        await svc.close()


async def _board_until(client: Client, done: Callable[[list[dict[str, Any]]], bool]) -> dict[str, Any]:
    async with asyncio.timeout(20):
        while True:
            status = await client.status()
            if done(status.get("board") or []):
                return status
            await asyncio.sleep(0.05)


async def test_board_names_the_rank_that_did_not_call() -> None:
    async with _world(3) as (client, comms):
        await asyncio.gather(*(c.barrier() for c in comms))  # every rank is past #0
        works = [comms[r].all_reduce(np.ones(4, np.float32)) for r in (0, 1)]  # rank 2 never calls #1

        def stuck(board: list[dict[str, Any]]) -> bool:
            """#1 waits, with rank 2 judged by a heartbeat it sent after the barrier: one from
            before (up to 0.1 s old when #1 starts) still says it had no operation yet, which
            is what a loaded machine's board showed when the test read it that early."""
            return any(
                row["seq"] == 1
                and len(row["arrived"]) == 2
                and not any("no operation in this group yet" in m["why"] for m in row["missing"])
                for row in board
            )

        status = await _board_until(client, stuck)
        row = next(r for r in status["board"] if r["seq"] == 1)
        assert row["op"] == "all_reduce" and row["arrived"] == [0, 1]
        assert [m["rank"] for m in row["missing"]] == [2]
        assert "has not called it: idle after #0" in row["missing"][0]["why"]
        assert not row["mismatch"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print_status(status, "test", 0)
        text = out.getvalue()
        assert "all_reduce #1 (group default, running" in text and "waiting for rank 2 (has not called it" in text
        await comms[2].all_reduce(np.ones(4, np.float32))  # it arrives: everything completes
        results = await asyncio.gather(*works)
        assert all(np.array_equal(x, np.full(4, 3, np.float32)) for x in results)
        await _board_until(client, lambda board: not any(r["seq"] == 1 for r in board))


async def test_board_shows_a_mismatch_side_by_side() -> None:
    async with _world(2) as (client, comms):
        # each thinks itself the root, so both wait to receive: the call never fails by itself
        a = comms[0].reduce(np.ones(4, np.float32), root=0, timeout=60)
        b = comms[1].reduce(np.ones(4, np.float32), root=1, timeout=60)

        def both(board: list[dict[str, Any]]) -> bool:
            return any(row["mismatch"] for row in board)

        status = await _board_until(client, both)
        row = next(r for r in status["board"] if r["mismatch"])
        assert [c["ranks"] for c in row["calls"]] == [[0], [1]]
        assert "root=0" in row["calls"][0]["call"] and "root=1" in row["calls"][1]["call"]
        assert any("MISMATCH" in line for line in arrivals.lines(status["board"]))
        for w in (a, b):
            w.cancel()
        await asyncio.gather(a, b, return_exceptions=True)


def test_malformed_reports_are_dropped() -> None:
    assert arrivals.parse({"rank": -1, "ops": []}, 0.0) is None
    assert arrivals.parse({"rank": 0, "ops": [["g", 1, "x"]]}, 0.0) is None
    assert arrivals.parse("nope", 0.0) is None
    rep = arrivals.parse({"rank": 1, "ops": [["g" * 999, 3, "all_reduce", "fp", 1.0, [0, 1], [0]]]}, 5.0)
    assert rep is not None and len(rep.ops[0][0]) == arrivals.MAX_TEXT
