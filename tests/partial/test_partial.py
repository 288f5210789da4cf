"""all_reduce(partial=True) over the in-memory mesh: everyone delivering, a rank dead
before it sends, a rank alive but late (held by an event until the others decided),
the refusals, and the Work's contributors (netcoll/algorithms/partial.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from netcoll.comm import Communicator
from netcoll.errors import PartialExcluded
from netcoll.mesh.inprocess import MemoryHub
from netcoll.ops import ReduceOp, reduce_reference
from tests.support.worlds import memory_world, rank_data

N = 4


def inputs(n: int, shape: tuple[int, ...] = (1000,), dtype: object = np.float32) -> list[np.ndarray]:
    return [rank_data(r, shape, dtype, seed=5) for r in range(n)]


async def partial(c: Communicator, x: np.ndarray, op: str = "avg", **kw: object) -> tuple[np.ndarray, object]:
    work = c.all_reduce(x, op=op, partial=True, **kw)  # type: ignore[call-overload]
    y = await work
    return y, work.contributors


@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "prod"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
async def test_everyone_delivers_gives_the_allpairs_bits_and_every_rank(op: str, dtype: object) -> None:
    if op == "avg" and np.dtype(dtype).kind == "i":
        pytest.skip("avg needs a floating dtype")
    _, comms = memory_world(N)
    xs = inputs(N, (1000,), dtype)
    keep = [x.copy() for x in xs]
    got = await asyncio.gather(*(partial(c, xs[c.rank], op, timeout=30) for c in comms))
    ref = await asyncio.gather(*(c.all_reduce(xs[c.rank], op=op, algorithm="allpairs") for c in comms))
    for r in range(N):
        y, contributors = got[r]
        assert contributors == (0, 1, 2, 3)
        assert y.tobytes() == ref[0].tobytes()  # bit-identical to allpairs, on every rank
        np.testing.assert_allclose(y, reduce_reference(ReduceOp(op), keep), rtol=1e-5)
        np.testing.assert_array_equal(xs[r], keep[r])  # the input is never modified


async def test_out_in_place_and_many_segments() -> None:
    _, comms = memory_world(3, segment_bytes=4096)
    xs = inputs(3, (10_000,), np.float64)  # 80 KB: 20 segments per peer
    want = sum(xs, np.zeros_like(xs[0]))
    await asyncio.gather(*(c.all_reduce(xs[c.rank], out=xs[c.rank], partial=True) for c in comms))
    for x in xs:
        np.testing.assert_array_equal(x, want)


async def test_a_rank_dead_before_it_sends_is_left_out_at_once() -> None:
    hub, comms = memory_world(N)
    xs = inputs(N)
    hub.kill(3)
    # a timeout of an hour: the dead rank is excluded because its link is gone, not by waiting
    got = await asyncio.wait_for(asyncio.gather(*(partial(c, xs[c.rank], timeout=3600) for c in comms[:3])), timeout=60)
    want = reduce_reference(ReduceOp.AVG, xs[:3])
    for y, contributors in got:
        assert contributors == (0, 1, 2)
        assert y.tobytes() == got[0][0].tobytes()
        np.testing.assert_allclose(y, want, rtol=1e-6)
    # the next normal collective includes the dead rank: it fails, and the survivors would regroup
    from netcoll.errors import PeerLost

    with pytest.raises(PeerLost):
        await comms[0].all_reduce(xs[0])


async def test_a_late_rank_is_excluded_with_a_typed_error_and_the_next_call_includes_it() -> None:
    _, comms = memory_world(N)
    xs = inputs(N)
    decided = asyncio.Event()

    async def on_time(c: Communicator) -> tuple[np.ndarray, object]:
        return await partial(c, xs[c.rank], timeout=2.0)  # the window (ranks 0-2 are on time; rank 3 is held)

    async def late(c: Communicator) -> BaseException | None:
        await decided.wait()  # held until the others have their result: late by an event
        try:
            await partial(c, xs[c.rank], timeout=30)
        except PartialExcluded as exc:
            return exc
        return None

    held = asyncio.ensure_future(late(comms[3]))
    got = await asyncio.gather(*(on_time(c) for c in comms[:3]))
    decided.set()
    error = await held
    assert isinstance(error, PartialExcluded), error
    assert error.ranks == (0, 1, 2) and "rank 3 was excluded" in str(error)
    for y, contributors in got:
        assert contributors == (0, 1, 2)
        assert y.tobytes() == got[0][0].tobytes()
        np.testing.assert_allclose(y, reduce_reference(ReduceOp.AVG, xs[:3]), rtol=1e-6)
    # the group goes on: the next collective (partial or not) includes rank 3 again
    again = await asyncio.gather(*(c.all_reduce(xs[c.rank]) for c in comms))
    np.testing.assert_allclose(again[3], reduce_reference(ReduceOp.SUM, xs), rtol=1e-6)
    last = await asyncio.gather(*(partial(c, xs[c.rank], timeout=30) for c in comms))
    assert all(contributors == (0, 1, 2, 3) for _, contributors in last)


async def test_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    _, comms = memory_world(3)
    ts = [torch.full((5,), float(r + 1), dtype=torch.bfloat16) for r in range(3)]
    got = await asyncio.gather(*(partial(c, ts[c.rank], timeout=30) for c in comms))
    for y, contributors in got:
        assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16
        assert contributors == (0, 1, 2)
        assert torch.equal(y, torch.full((5,), 2.0, dtype=torch.bfloat16))


async def test_a_group_of_one_and_non_partial_contributors() -> None:
    _, (c,) = memory_world(1)
    work = c.all_reduce(np.ones(3), op="avg", partial=True)
    np.testing.assert_array_equal(await work, np.ones(3))
    assert work.contributors == (0,)
    plain = c.all_reduce(np.ones(3))
    await plain
    assert plain.contributors is None


async def test_refusals_at_the_call() -> None:
    _, comms = memory_world(2)
    c = comms[0]
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="algorithm must be 'auto'"):
        c.all_reduce(x, partial=True, algorithm="ring")
    with pytest.raises(TypeError, match="partial must be True or False"):
        c.all_reduce(x, partial="yes")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="partial=True"):
        c.all_reduce(x, deadline=1.0)
    with pytest.raises(ValueError, match="must not exceed"):
        c.all_reduce(x, partial=True, timeout=1.0, deadline=2.0)
    with pytest.raises(ValueError, match="positive"):
        c.all_reduce(x, partial=True, deadline=0)
    with pytest.raises(TypeError):
        c.all_reduce(np.ones(4, np.int32), op="avg", partial=True)
    hub = MemoryHub(2)
    hub.meshes[0].decider = None
    with pytest.raises(ValueError, match="needs a decider"):
        Communicator(hub.meshes[0]).all_reduce(x, partial=True)
    assert c._engine.seq == 0  # nothing was issued


async def test_a_shorter_deadline_within_the_timeout() -> None:
    _, comms = memory_world(3)
    xs = inputs(3)
    go = asyncio.Event()

    async def late(c: Communicator) -> BaseException | None:
        await go.wait()
        try:
            await partial(c, xs[c.rank], timeout=30)
        except PartialExcluded as exc:
            return exc
        return None

    held = asyncio.ensure_future(late(comms[2]))
    got = await asyncio.gather(*(partial(c, xs[c.rank], timeout=3600, deadline=2.0) for c in comms[:2]))
    go.set()
    assert isinstance(await held, PartialExcluded)
    assert [contributors for _, contributors in got] == [(0, 1), (0, 1)]


async def test_a_rank_that_cancels_is_left_out_at_once() -> None:
    _, comms = memory_world(3)
    xs = inputs(3)
    cancelled = comms[2].all_reduce(xs[2], partial=True, timeout=3600)
    cancelled.cancel()  # before it ran: nothing of it was sent; the others are told at once
    got = await asyncio.wait_for(asyncio.gather(*(partial(c, xs[c.rank], timeout=3600) for c in comms[:2])), timeout=60)
    assert [contributors for _, contributors in got] == [(0, 1), (0, 1)]
    assert cancelled.cancelled()
    again = await asyncio.gather(*(c.all_reduce(xs[c.rank]) for c in comms))  # the group goes on
    np.testing.assert_allclose(again[2], reduce_reference(ReduceOp.SUM, xs), rtol=1e-6)


async def test_in_flight_with_other_collectives_awaited_in_any_order() -> None:
    _, comms = memory_world(N)
    xs = inputs(N)

    async def rank(c: Communicator) -> tuple[Any, ...]:
        a = c.all_reduce(xs[c.rank], partial=True, timeout=30)
        b = c.all_gather(xs[c.rank])
        d = c.all_reduce(xs[c.rank], op="max", partial=True, timeout=30)
        order = [d, b, a] if c.rank % 2 else [b, a, d]
        for w in order:
            await w
        return a.result(), a.contributors, b.result(), d.result(), d.contributors

    got = await asyncio.gather(*(rank(c) for c in comms))
    for a, ca, b, d, cd in got:
        assert ca == cd == (0, 1, 2, 3)
        assert a.tobytes() == got[0][0].tobytes() and d.tobytes() == got[0][3].tobytes()
        np.testing.assert_array_equal(b, np.stack(xs))
        np.testing.assert_array_equal(d, reduce_reference(ReduceOp.MAX, xs))


async def test_the_typed_errors_carry_the_aborted_reason() -> None:
    from netcoll.operation import Reason

    _, comms = memory_world(2)
    go = asyncio.Event()

    async def late(c: Communicator) -> BaseException:
        await go.wait()
        with pytest.raises(PartialExcluded) as info:
            await c.all_reduce(np.ones(3), partial=True, timeout=30)
        return info.value

    held = asyncio.ensure_future(late(comms[1]))
    await comms[0].all_reduce(np.ones(3), partial=True, timeout=0.2)
    go.set()
    error = await held
    assert error.reason is Reason.ABORTED and error.seq == 0 and error.op == "all_reduce"  # type: ignore[attr-defined]


@pytest.mark.parametrize("window", [64 << 10, 1 << 20])
async def test_any_receive_window(window: int) -> None:
    hub = MemoryHub(3, window=window)
    comms = [Communicator(m) for m in hub.meshes]
    xs = inputs(3, (1 << 20,), np.float32)  # 4 MiB per rank, sent to two peers
    got = await asyncio.gather(*(partial(c, xs[c.rank], op="sum", timeout=60) for c in comms))
    for y, contributors in got:
        assert contributors == (0, 1, 2)
        np.testing.assert_array_equal(y, got[0][0])
        np.testing.assert_allclose(y, reduce_reference(ReduceOp.SUM, xs), rtol=1e-6)


async def test_a_late_rank_behind_a_small_window_and_the_next_collective() -> None:
    """The on-time ranks' sends to the held rank stall on its receive window; they are
    abandoned once the others decided, and the links still carry the next collective."""
    hub = MemoryHub(3, window=64 << 10)
    comms = [Communicator(m, segment_bytes=16 << 10) for m in hub.meshes]
    xs = inputs(3, (1 << 18,), np.float32)  # 1 MiB: far more than the window
    go = asyncio.Event()

    async def late(c: Communicator) -> BaseException:
        await go.wait()
        with pytest.raises(PartialExcluded) as info:
            await c.all_reduce(xs[c.rank], partial=True, timeout=1.0)
        return info.value

    held = asyncio.ensure_future(late(comms[2]))
    got = await asyncio.gather(*(partial(c, xs[c.rank], op="sum", timeout=2.0) for c in comms[:2]))
    go.set()
    assert (await held).ranks == (0, 1)
    assert [contributors for _, contributors in got] == [(0, 1), (0, 1)]
    again = await asyncio.wait_for(asyncio.gather(*(c.all_reduce(xs[c.rank]) for c in comms)), timeout=60)
    for y in again:
        np.testing.assert_allclose(y, reduce_reference(ReduceOp.SUM, xs), rtol=1e-6)


async def test_a_lost_decider_fails_every_rank_with_a_collective_error() -> None:
    from netcoll.errors import CollectiveError

    hub, comms = memory_world(3)

    async def gone(group: str, seq: int, proposal: tuple[int, ...], timeout: float) -> tuple[int, ...]:
        raise ConnectionError("lost the coordinator")

    for mesh in hub.meshes:
        mesh.decider = gone
    got = await asyncio.gather(
        *(c.all_reduce(np.ones(3), partial=True, timeout=30) for c in comms), return_exceptions=True
    )
    for error in got:
        assert isinstance(error, CollectiveError) and "lost the coordinator" in str(error), error
