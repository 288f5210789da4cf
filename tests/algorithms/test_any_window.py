"""Any size, any window (issue 38): every collective and algorithm completes, and
is right, with the receive window at its minimum (every payload over 1 KiB goes by
rendezvous: it waits until its receive is posted), the reduction scratch at a few
segments and many segments per chunk, so that nothing but the order in which
receives are posted can make progress.

Before the ring reductions ran in slices of a scratch's worth
(``algorithms._scratch.slice_segments``), their next-step sends waited for receives
that the neighbour posted only after receiving more from the waiting rank: a
cycle, seen as a 300 MiB all_reduce at 4 ranks hanging with the 64 MiB window.
The same structure at a few MiB shows here with a 1 KiB window and 4 scratch
segments (the full sizes are measured by ``bench/bigmessage.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from netcoll.algorithms import ALGORITHMS, _scratch
from netcoll.comm import Communicator
from netcoll.links.factory import MIN_WINDOW
from netcoll.mesh.inprocess import MemoryHub
from tests.support import ALL_LINKS, tcp_group

SEGMENT = 4096  # bytes: with the sizes below, dozens to hundreds of segments per chunk
SCRATCH = 4 * SEGMENT  # the scratch budget: 4 segments (a slice of 2)
ROOT = 1

Check = Callable[[list[Any]], None]


@pytest.fixture
async def tiny_world(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    """``await tiny_world(n)``: ``n`` Communicators whose links have the smallest
    receive window netcoll allows, with a scratch budget of 4 segments."""
    monkeypatch.setattr(_scratch, "SCRATCH_BUDGET_BYTES", SCRATCH)
    closers: list[Callable[[], Awaitable[None]]] = []

    async def make(n: int) -> list[Communicator]:
        if request.param == "memory":
            hub = MemoryHub(n, window=MIN_WINDOW)
            meshes = list(hub.meshes)

            async def close() -> None:
                for t in meshes:
                    await t.close()

            closers.append(close)
            return [Communicator(t, timeout=30.0, segment_bytes=SEGMENT) for t in meshes]
        group = await tcp_group(n, links=request.param, window=MIN_WINDOW)
        closers.append(group.close)
        return group.communicators(timeout=30.0, segment_bytes=SEGMENT)

    yield make
    for close in reversed(closers):
        await close()


def _rows(rank: int, p: int, per: int, dtype: Any = np.float32) -> np.ndarray:
    """Rank ``rank``'s ``(p, per)`` input: small integers, so every sum is exact."""
    return ((np.arange(p * per).reshape(p, per) * (rank + 3)) % 11).astype(dtype)


def _plan(coll: str, algo: str, p: int, per: int) -> tuple[Callable[[Communicator], Any], Check]:
    """What every rank calls, and the check of the per-rank results."""
    rows = [_rows(r, p, per) for r in range(p)]
    flat = [x.reshape(-1) for x in rows]
    total = np.sum(flat, axis=0)

    def same(want: Any) -> Check:
        return lambda got: [np.testing.assert_array_equal(g, want) for g in got] and None

    def at_root(want: Any) -> Check:
        def check(got: list[Any]) -> None:
            np.testing.assert_array_equal(got[ROOT], want)
            assert all(g is None for r, g in enumerate(got) if r != ROOT)

        return check

    def each(want: Callable[[int], Any]) -> Check:
        return lambda got: [np.testing.assert_array_equal(g, want(r)) for r, g in enumerate(got)] and None

    calls: dict[str, tuple[Callable[[Communicator], Any], Check]] = {
        "all_reduce": (lambda c: c.all_reduce(flat[c.rank], algorithm=algo), same(total)),
        "reduce": (lambda c: c.reduce(flat[c.rank], root=ROOT, algorithm=algo), at_root(total)),
        "broadcast": (
            lambda c: c.broadcast(flat[ROOT] if c.rank == ROOT else None, root=ROOT, algorithm=algo),
            same(flat[ROOT]),
        ),
        "all_gather": (lambda c: c.all_gather(rows[c.rank][0], algorithm=algo), same(np.stack([x[0] for x in rows]))),
        "reduce_scatter": (
            lambda c: c.reduce_scatter(rows[c.rank], algorithm=algo),
            each(lambda r: total.reshape(p, per)[r]),
        ),
        "all_to_all": (
            lambda c: c.all_to_all(rows[c.rank], algorithm=algo),
            each(lambda r: np.stack([x[r] for x in rows])),
        ),
        "gather": (
            lambda c: c.gather(rows[c.rank][0], root=ROOT, algorithm=algo),
            at_root(np.stack([x[0] for x in rows])),
        ),
        "scatter": (
            lambda c: c.scatter(rows[ROOT] if c.rank == ROOT else None, root=ROOT, algorithm=algo),
            each(lambda r: rows[ROOT][r]),
        ),
        "barrier": (lambda c: c.barrier(), lambda got: None),
    }
    return calls[coll]


CASES = [(coll, algo) for coll, table in ALGORITHMS.items() for algo in table]


@pytest.mark.parametrize("tiny_world", ALL_LINKS, indirect=True)
@pytest.mark.parametrize(("coll", "algo"), CASES, ids=[f"{c}-{a}" for c, a in CASES])
@pytest.mark.parametrize("size", [3, 4])
async def test_every_algorithm_completes_with_the_smallest_window(
    tiny_world: Any, size: int, coll: str, algo: str
) -> None:
    """~100 segments per chunk (400 KiB of float32 per rank row), every payload by
    rendezvous, the ring reductions in slices of 2 segments: right on every rank."""
    comms = await tiny_world(size)
    call, check = _plan(coll, algo, size, 100 * SEGMENT // 4)
    async with asyncio.timeout(60):
        got = await asyncio.gather(*(call(c) for c in comms))
    check(got)


def test_a_slice_covers_a_step_within_the_scratch_budget() -> None:
    """Slices of at most the budget less two segments; at least one; never more than the chunk."""
    seg = 4 << 20
    assert _scratch.slice_segments(1, seg) == 1
    assert _scratch.slice_segments(6, seg) == 6  # 6 + 2 segments of 4 MiB fit 32 MiB: one slice
    assert _scratch.slice_segments(19, seg) == 6  # 75 MiB chunks (300 MiB at 4 ranks): 4 slices
    assert _scratch.slice_segments(1000, 64 << 20) == 1  # segments over the budget: the 3-segment minimum
