"""Issued operations: every collective returns a ``netcoll.Work`` whose place
in the sequence is fixed at the call; cancelling aborts it on every rank and
the next collective is right (issue 9: "a collective cancelled before it
started made later results wrong")."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import netcoll
from netcoll.errors import (
    CollectiveCancelled,
    CollectiveClosed,
    CollectiveTimeout,
    MismatchError,
    PeerLost,
)
from netcoll.operation import Reason, Work
from netcoll.testing import fixed
from tests.support import ALL_LINKS, MakeGroup, memory_world


async def test_calls_return_work_and_await_unchanged() -> None:
    _, comms = memory_world(2)
    works = [c.all_reduce(np.full(3, c.rank + 1.0)) for c in comms]
    assert all(isinstance(w, netcoll.Work) for w in works)
    assert [w.seq for w in works] == [0, 0]
    assert not works[0].done()
    got = await asyncio.gather(*works)
    assert all(w.done() and w.exception() is None for w in works)
    np.testing.assert_array_equal(got[0], [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(works[1].result(), [3.0, 3.0, 3.0])


async def test_sequence_is_taken_at_the_call() -> None:
    """Rank 1 issues two collectives before running either; rank 0 issues
    them one by one. The first-issued pairs with the first-issued."""
    _, (c0, c1) = memory_world(2)
    a1 = c1.all_reduce(np.array([1.0]))
    b1 = c1.all_reduce(np.array([10.0]))
    assert (a1.seq, b1.seq) == (0, 1)
    b_res = await asyncio.gather(c0.all_reduce(np.array([2.0])), c0.all_reduce(np.array([20.0])), b1, a1)
    assert [float(r[0]) for r in b_res] == [3.0, 30.0, 30.0, 3.0]


async def test_many_in_flight_awaited_in_any_order() -> None:
    _, comms = memory_world(3)
    issued = [[c.all_reduce(np.full(4, float(c.rank + k))) for k in range(8)] for c in comms]
    for k in reversed(range(8)):
        for r in range(3):
            np.testing.assert_array_equal(await issued[r][k], np.full(4, 3.0 + 3 * k))
    gathered = [c.all_gather(np.array([c.rank])) for c in comms]
    sent = comms[0].send(np.arange(5), 2, tag=1)
    recvd = comms[2].recv(0, tag=1)
    np.testing.assert_array_equal(await recvd, np.arange(5))
    assert await sent is None
    assert (await gathered[1]).ravel().tolist() == [0, 1, 2]


@pytest.mark.parametrize("make_group", ALL_LINKS, indirect=True)
@pytest.mark.parametrize("algorithm", ["auto", "ring", "tree", "doubling"])
@pytest.mark.parametrize("size", [2, 3, 4])
async def test_the_later_of_two_issued_awaited_first(make_group: MakeGroup, size: int, algorithm: str) -> None:
    """Issue 34's program: rank 0 issues two all_reduces and awaits the second
    first (so it runs inline and opens before the first); the others await them
    in order. It deadlocked at 3 ranks and more: frames for the first that
    arrived while only the second was open were dropped as finished."""
    comms = (await make_group(size)).communicators(timeout=10.0)
    seed = fixed.PAIR_ALGORITHMS.index(algorithm)  # the program's seed picks its algorithm
    reports = await asyncio.gather(*(fixed.pair(c, seed, iterations=10) for c in comms))
    assert not [f for r in reports for f in r.failures], reports
    assert all(r.digests == reports[0].digests and len(r.digests) == 20 for r in reports)


async def test_cancelled_before_it_started_keeps_later_results_right() -> None:
    """The regression of issue 9: created and cancelled before it started on
    one rank; the others get a typed error naming that rank, and the next two
    all_reduce calls return 20 and 200 on every rank (not 11 and 110)."""
    _, comms = memory_world(2)
    cancelled = comms[1].all_reduce(np.array([5.0]))
    assert cancelled.cancel()
    assert cancelled.cancelled()
    with pytest.raises(CollectiveCancelled) as info:
        await comms[0].all_reduce(np.array([5.0]))
    assert info.value.ranks == (1,) and info.value.reason is Reason.CANCELLED
    assert "rank 1" in str(info.value) and "cancel" in str(info.value)

    async def two(c: netcoll.Communicator) -> list[float]:
        return [float((await c.all_reduce(np.array([10.0])))[0]), float((await c.all_reduce(np.array([100.0])))[0])]

    assert await asyncio.gather(*(two(c) for c in comms)) == [[20.0, 200.0], [20.0, 200.0]]


async def test_cancelled_before_it_started_then_closed_is_a_cancel_everywhere() -> None:
    """Cancelled before it started, then the communicator closed before its start came:
    the first cause wins, so the others are told of the cancel, naming the rank (they
    were told "closed": found by the schedule explorer, 8 ranks, seed 2022)."""
    _, comms = memory_world(2)
    cancelled = comms[1].all_reduce(np.array([5.0]))
    assert cancelled.cancel()
    await comms[1].close()
    with pytest.raises(CollectiveCancelled) as info:
        await comms[0].all_reduce(np.array([5.0]))
    assert info.value.ranks == (1,) and info.value.reason is Reason.CANCELLED
    with pytest.raises(asyncio.CancelledError):
        await cancelled


async def test_cancel_while_running_aborts_every_rank() -> None:
    _, comms = memory_world(3)
    works = [c.all_reduce(np.ones(8)) for c in comms[:2]]  # rank 2 has not called yet
    await asyncio.sleep(0.01)
    assert works[0].cancel()
    with pytest.raises(CollectiveCancelled) as info:
        await works[1]
    assert info.value.ranks == (0,)
    with pytest.raises(CollectiveCancelled):  # the late rank is told at once, not at its deadline
        await comms[2].all_reduce(np.ones(8), timeout=60)
    with pytest.raises(asyncio.CancelledError):
        await works[0]
    got = await asyncio.gather(*(c.all_reduce(np.full(2, 2.0)) for c in comms))
    assert all(g.tolist() == [6.0, 6.0] for g in got)


async def test_cancelling_the_awaiting_task_cancels_the_work() -> None:
    _, comms = memory_world(2)
    work = comms[0].barrier()
    waiter = asyncio.ensure_future(asyncio.wait_for(work, 0.05))  # rank 1 never enters
    with pytest.raises(TimeoutError):
        await waiter
    assert work.cancelled()
    with pytest.raises(CollectiveCancelled) as info:
        await comms[1].barrier()
    assert info.value.ranks == (0,)
    await asyncio.gather(*(c.barrier() for c in comms))


async def test_done_callbacks_and_exception() -> None:
    _, comms = memory_world(2)
    seen: list[Work] = []
    works = [c.all_reduce(np.ones(2)) for c in comms]
    works[0].add_done_callback(seen.append)
    await asyncio.gather(*works)
    await asyncio.sleep(0)
    assert seen == [works[0]]
    bad = comms[0].all_reduce(np.ones(2), timeout=0.05)
    with pytest.raises(CollectiveTimeout):
        await bad
    assert isinstance(bad.exception(), CollectiveTimeout) and bad.exception().reason is Reason.TIMEOUT


async def test_wait_from_another_thread() -> None:
    _, comms = memory_world(2)
    works = [c.all_reduce(np.full(2, 1.5)) for c in comms]
    with pytest.raises(RuntimeError, match="await"):
        works[0].wait()
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(works[0].wait(timeout=30)))
    thread.start()
    await asyncio.gather(*works)
    await asyncio.to_thread(thread.join, 30)
    assert results[0].tolist() == [3.0, 3.0]  # type: ignore[attr-defined]
    pending = comms[0].barrier(timeout=30)
    with pytest.raises(TimeoutError):
        await asyncio.to_thread(pending.wait, 0.05)
    pending.cancel()


async def test_arguments_are_checked_at_the_call_without_taking_a_number() -> None:
    _, comms = memory_world(2)
    with pytest.raises(TypeError):
        comms[0].all_reduce(np.ones(2, np.int32), op="avg")
    with pytest.raises(ValueError):
        comms[0].broadcast(np.ones(2), root=7)
    got = await asyncio.gather(*(c.all_reduce(np.ones(2)) for c in comms))
    assert got[0].tolist() == [2.0, 2.0]


async def test_every_failure_carries_its_reason() -> None:
    hub, comms = memory_world(2)
    with pytest.raises(MismatchError) as mismatch:
        await asyncio.gather(comms[0].all_reduce(np.ones(2)), comms[1].all_reduce(np.ones(3)))
    assert mismatch.value.reason is Reason.MISMATCH
    hub.kill(1)
    with pytest.raises(PeerLost) as lost:
        await comms[0].all_reduce(np.ones(2))
    assert lost.value.reason is Reason.PEER_LOST and lost.value.ranks == (1,)


async def test_closed_communicator() -> None:
    _, comms = memory_world(2)
    pending = comms[0].all_reduce(np.ones(2))
    await comms[0].close()
    with pytest.raises(CollectiveClosed) as info:
        await pending
    assert info.value.reason is Reason.CLOSED
    with pytest.raises(netcoll.CommunicatorClosed):
        comms[0].barrier()


async def test_group_of_one_is_done_at_once() -> None:
    _, (comm,) = memory_world(1)
    work = comm.all_reduce(np.arange(3.0), op="avg")
    assert work.done() and work.seq is None
    assert (await work).tolist() == [0.0, 1.0, 2.0]


async def test_split_is_issued_too() -> None:
    _, comms = memory_world(4)
    works = [c.split(c.rank % 2, key=-c.rank + 10) for c in comms]
    subs = await asyncio.gather(*works)
    assert [s.rank for s in subs] == [1, 1, 0, 0]
    got = await asyncio.gather(*(s.all_reduce(np.array([float(c.rank)])) for s, c in zip(subs, comms, strict=True)))
    assert [float(g[0]) for g in got] == [2.0, 4.0, 2.0, 4.0]


async def test_link_stats_show_the_link_kind_per_group_rank() -> None:
    _, comms = memory_world(3)
    subs = await asyncio.gather(*(c.split(0 if c.rank else None) for c in comms))
    assert subs[0] is None
    await asyncio.gather(*(s.all_reduce(np.ones(1000)) for s in subs[1:]))
    stats = subs[1].link_stats()
    assert list(stats) == [1] and stats[1]["kind"] == "memory" and stats[1]["peer"] == 2
    assert stats[1]["bytes_sent"] > 0 and stats[1]["unexpected_bytes"] == 0


async def test_cancelling_a_work_run_inline_leaves_the_awaiting_task_uncancelled() -> None:
    """As with any asyncio future: the awaiting task sees CancelledError, but
    it was not itself cancelled (asyncio.timeout and TaskGroups rely on that)."""
    _, comms = memory_world(2)
    issued: list[Work] = []

    async def waiter() -> int:
        issued.append(comms[0].barrier())
        try:
            await issued[0]  # runs the barrier inline in this task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            assert me is not None
            return me.cancelling()
        return -1

    task = asyncio.ensure_future(waiter())
    await asyncio.sleep(0.01)
    work = issued[0]
    assert work._driver is task and work.cancel()
    assert await task == 0
    assert work.cancelled()
    with pytest.raises(CollectiveCancelled):
        await comms[1].barrier()
