"""The hang explainer: the coordinator's arrival board shows who a stuck
collective waits for (from the ranks' heartbeats), a deadlock as one, and
mismatched calls side by side; ``netcoll status`` prints it. Real hangs here;
the rules (what counts as stuck, what is a deadlock) with injected reports in
test_board_rules.py."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

import netcoll
from netcoll.cli.status import print_status
from netcoll.limits import Limits
from netcoll.rendezvous import board as arrivals
from netcoll.rendezvous import liveness as liveness_module
from netcoll.service import Client, JobService

pytestmark = pytest.mark.tcp


@contextlib.asynccontextmanager
async def _world(n: int) -> AsyncIterator[tuple[Client, list[netcoll.Communicator]]]:
    """A coordinator with its job service (so the client's status works) and ``n``
    embedded ranks that heartbeat every 0.1 s; a wait shows once 3 of them agree it
    has had no data for 0.2 s."""
    limits = Limits(liveness_timeout_s=0.4, progress_timeout_s=30.0, stuck_after_s=0.2)
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


async def test_board_names_a_deadlock_across_two_operations() -> None:
    """Rank 0 waits in a recv for rank 1, which waits for rank 0 in an all_reduce."""
    async with _world(2) as (client, comms):
        a = comms[0].recv(1, timeout=60)
        b = comms[1].all_reduce(np.ones(4, np.float32), timeout=60)

        def deadlocked(board: list[dict[str, Any]]) -> bool:
            return sum(1 for row in board if row["deadlock"]) == 2

        status = await _board_until(client, deadlocked)
        text = arrivals.lines(status["board"])
        assert text[0] == "deadlock: rank 0 in recv #0 waits for rank 1, rank 1 in all_reduce #0 waits for rank 0"
        assert sum(1 for line in text if line.startswith("deadlock:")) == 1  # named once
        row = next(r for r in status["board"] if r["op"] == "all_reduce")
        assert [m["rank"] for m in row["missing"]] == [0] and "in recv #0" in row["missing"][0]["why"]
        for w in (a, b):
            w.cancel()
        await asyncio.gather(a, b, return_exceptions=True)


async def test_slow_warnings_name_what_the_awaited_rank_waits_for(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Ring: rank 1 waits for rank 0, which waits for rank 2, which never calls. Rank 1's
    warnings name the chain and what its end is doing, from the coordinator's board (its
    heartbeats' answers)."""
    monkeypatch.setattr(liveness_module, "CHAIN_AFTER", 0.1)
    async with _world(3) as (_, comms):
        await asyncio.gather(*(c.barrier() for c in comms))
        for c in comms:
            c._engine.slow_op_s = 0.2
        x = np.ones(4, np.float32)
        with caplog.at_level(logging.WARNING, logger="netcoll.engine"):
            works = [comms[r].all_reduce(x, algorithm="ring", timeout=60) for r in (0, 1)]
            chain = "rank 0 in all_reduce #1 waits for rank 2; rank 2 never delivered ("

            def warned() -> list[str]:
                return [r.getMessage() for r in caplog.records if chain in r.getMessage()]

            async with asyncio.timeout(30):
                while not warned():
                    await asyncio.sleep(0.05)
        assert re.fullmatch(
            r"slow operation: all_reduce #1 of group 'default' still running on rank 1 after [0-9.]+s; "
            r"waiting for rank 0; rank 0 in all_reduce #1 waits for rank 2; "
            r"rank 2 never delivered \(has not called it: idle after #0; "
            r"(last heartbeat [0-9.]+s ago|no heartbeat for [0-9]+s)\); "  # (heartbeats every 0.1 s: may be late)
            r"(next warning at [0-9.]+s, )?timeout at 60s",
            warned()[0],
        ), warned()
        await comms[2].all_reduce(x, algorithm="ring")
        await asyncio.gather(*works)


def test_malformed_reports_are_dropped() -> None:
    assert arrivals.parse({"rank": -1, "ops": []}, 0.0) is None
    assert arrivals.parse({"rank": 0, "ops": [["g", 1, "x"]]}, 0.0) is None
    assert arrivals.parse("nope", 0.0) is None
    rep = arrivals.parse({"rank": 1, "ops": [["g" * 999, 3, "all_reduce", "fp", 1.0, [0, 1], [0]]]}, 5.0)
    assert rep is not None and len(rep.ops[0][0]) == arrivals.MAX_TEXT
