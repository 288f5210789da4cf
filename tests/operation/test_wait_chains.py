"""Timeouts that say what is stuck (netcoll.engine, netcoll.mesh.answers): a cycle of
waits, within one operation or across two, is named a deadlock with the ranks and the
operations in it; a chain that ends at a rank that never called names that rank. Real
hangs over the in-process mesh; the reports are awaited (a long grace that ends as
soon as the chain is whole), so the verdict does not depend on this machine's speed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from netcoll.comm import Communicator
from netcoll.errors import CollectiveAborted, CollectiveTimeout
from netcoll.mesh.answers import Answers
from netcoll.waits import Wait
from tests.support.worlds import memory_world

NEVER = "never delivered: not called yet, stuck, or too slow"


def _world(n: int, grace: float = 30.0) -> list[Communicator]:
    """``grace``: how long a timeout listens for reports; it ends as soon as every rank on
    the chain has told, so only a chain that ends at a silent rank waits it whole."""
    _, comms = memory_world(n)
    for c in comms:
        c._engine.timeout_grace = grace
    return comms


async def _settled(*aws: Any) -> list[Any]:
    async with asyncio.timeout(60):
        return list(await asyncio.gather(*aws, return_exceptions=True))


async def test_two_ranks_receiving_from_each_other_is_a_deadlock() -> None:
    comms = _world(2)
    first, second = await _settled(comms[0].recv(1, timeout=0.3), comms[1].recv(0, timeout=1.0))
    assert isinstance(first, CollectiveTimeout), first
    assert str(first) == (
        "recv #0 of group 'default/p2p/0/1>0' timed out after 0.3s on rank 0: waiting for rank 1; "
        "deadlock: rank 0 in recv #0 waits for rank 1, rank 1 in recv #0 waits for rank 0"
    )
    own = first.waits[0]
    assert own == Wait(0, "recv #0", (1,), own.stalled, own.age) and own.stuck, first.waits
    assert first.waits[1].rank == 1 and first.waits[1].ranks == (0,), first.waits
    # rank 1 timed out later, still in its recv: it heard rank 0's wait when rank 0 gave up
    assert isinstance(second, CollectiveTimeout), second
    assert str(second).endswith("deadlock: rank 1 in recv #0 waits for rank 0, rank 0 in recv #0 waits for rank 1")


async def test_a_cycle_across_two_operations_names_both() -> None:
    """Rank 2 waits in a recv for rank 0, which waits for rank 2 in the all_reduce that
    rank 2 has not opened: rank 2 answers rank 0's timeout with where it waits."""
    comms = _world(3)
    x = np.ones(4, np.float32)
    res = await _settled(
        comms[0].all_reduce(x, algorithm="ring", timeout=0.3),
        comms[1].all_reduce(x, algorithm="ring", timeout=30),
        comms[2].recv(0, timeout=1.0),
    )
    assert isinstance(res[0], CollectiveTimeout), res
    assert str(res[0]) == (
        "all_reduce #0 of group 'default' timed out after 0.3s on rank 0: waiting for rank 2; "
        "deadlock: rank 0 in all_reduce #0 waits for rank 2, rank 2 in recv #0 waits for rank 0"
    )
    assert isinstance(res[1], CollectiveAborted) and "aborted by rank 0 (timeout)" in str(res[1]), res[1]
    assert isinstance(res[2], CollectiveTimeout), res[2]  # (its own deadline: it was never told)
    assert "deadlock: rank 2 in recv #0 waits for rank 0, rank 0 in all_reduce #0 waits for rank 2" in str(res[2])


async def test_a_chain_that_ends_at_a_rank_that_never_called_names_it() -> None:
    comms = _world(3, grace=2.0)
    x = np.ones(4, np.float32)
    # ring: rank 1 waits for rank 0, rank 0 for rank 2, which never calls; rank 1 times out first
    res = await _settled(
        comms[0].all_reduce(x, algorithm="ring", timeout=30), comms[1].all_reduce(x, algorithm="ring", timeout=0.3)
    )
    assert isinstance(res[1], CollectiveTimeout), res
    assert str(res[1]) == (
        "all_reduce #0 of group 'default' timed out after 0.3s on rank 1: waiting for rank 0; "
        f"rank 0 in all_reduce #0 waits for rank 2; rank 2 {NEVER}"
    )
    assert res[1].ranks == (2,)
    assert isinstance(res[0], CollectiveAborted), res[0]  # the victim names the culprit too
    assert str(res[0]) == (
        "all_reduce #0 of group 'default' aborted by rank 1 (timeout): "  # its prefix once (issue 38)
        "timed out after 0.3s on rank 1: waiting for rank 0 (rank 0 itself was waiting for rank 2); "
        f"rank 2 {NEVER}"
    )
    # the rank that never called is told when it does (its deadline is far away)
    with pytest.raises(CollectiveAborted, match="aborted by rank 1 \\(timeout\\)"):
        await asyncio.wait_for(comms[2].all_reduce(x, algorithm="ring", timeout=3600), 30)


async def test_a_rank_waiting_nowhere_does_not_answer() -> None:
    """An idle rank (no operation open) sends nothing back: the chain ends at it."""
    comms = _world(2, grace=0.5)
    (err,) = await _settled(comms[0].recv(1, timeout=0.3))
    assert isinstance(err, CollectiveTimeout)
    assert str(err).endswith(f"waiting for rank 1; rank 1 {NEVER}")
    assert comms[1]._engine.mesh.answers.heard  # it heard rank 0's wait all the same


def test_an_answer_is_never_answered() -> None:
    """An answer names another operation than its own: the hook keeps it, sends nothing."""

    mesh = SimpleNamespace(rank=1, closed=False, mailbox=SimpleNamespace(ops={}))
    answers = Answers(mesh)  # type: ignore[arg-type]
    header = {
        "g": "default",
        "q": 1,
        "origin": 0,
        "cause": "timeout",
        "reason": "r",
        "w": {"n": "all_reduce", "q": 0, "g": "default", "r": [1], "s": 2.0},
    }
    answers(0, header, None)  # (no loop here: an attempt to send would raise)
    assert answers.heard[0][0] == header["w"]


def test_the_coordinators_answer_is_checked() -> None:
    mesh = SimpleNamespace(rank=1, closed=False, mailbox=SimpleNamespace(ops={}))
    answers = Answers(mesh)  # type: ignore[arg-type]
    answers.seen(
        {
            "waits": [[0, "all_reduce", 1, "default", [2], 8.0, 8.0], [0, "x"], [-1, "a", 1, "g", [2], 1.0, 1.0], "no"],
            "ends": [[2, "has not called it\x1b[2J"], [3], [True, "x"], [4, 5]],
        }
    )
    assert {r: w for r, (w, _) in answers.board.items()} == {
        0: {"n": "all_reduce", "q": 1, "g": "default", "r": [2], "s": 8.0, "a": 8.0}
    }
    assert answers.notes_since(0.0) == {2: "has not called it\\x1b[2J"}  # (escaped)
    answers.seen("nonsense")
    assert answers.board == {} and answers.notes == {}
