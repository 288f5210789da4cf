"""The pieces of a compressed all_reduce (netcoll.algorithms._pieces): a schedule covers
every shard exactly, each piece starting on an int8 block (so the bits are those of one
piece: tests/comm/test_compressed.py), the ramps where they fit; and run()'s limits on the
pieces in their exchange and under way, in order, a failure raised."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netcoll.algorithms._pieces import pieces, run, schedule
from netcoll.compression import INT8_BLOCK


@given(st.integers(0, 40 * INT8_BLOCK), st.integers(1, 8), st.integers(0, 4))
def test_a_schedule_covers_the_shard_exactly_from_block_starts(longest: int, blocks: int, taper: int) -> None:
    size = blocks * INT8_BLOCK
    got = schedule(longest, size, taper)
    assert got[0][0] == 0 and got[-1][1] == longest
    assert all(y == x2 for (_, y), (x2, _) in itertools.pairwise(got))
    assert all(x % INT8_BLOCK == 0 and (y > x or longest == 0) for x, y in got)
    assert all(y - x <= size + INT8_BLOCK for x, y in got)


def test_the_ramps_halve_towards_each_end_and_only_where_they_fit() -> None:
    size = 16 * INT8_BLOCK
    got = [y - x for x, y in schedule(100 * INT8_BLOCK + 7, size, 3)]
    assert got[:3] == [2 * INT8_BLOCK, 4 * INT8_BLOCK, 8 * INT8_BLOCK]
    assert got[-3:] == [8 * INT8_BLOCK, 4 * INT8_BLOCK, 2 * INT8_BLOCK + 7]
    assert set(got[3:-3]) <= {size, 100 * INT8_BLOCK - 28 * INT8_BLOCK - 4 * size}
    assert [y - x for x, y in schedule(2 * size + 5, size, 3)] == [size, size, 5]  # too short: even pieces
    assert schedule(5, size, 2) == [(0, 5)]


def test_pieces_cut_every_shard_alike_shorter_shards_clipped() -> None:
    got = pieces([(0, 3 * INT8_BLOCK), (3 * INT8_BLOCK, 5 * INT8_BLOCK)], INT8_BLOCK + 3)
    assert got == [
        [(0, INT8_BLOCK), (3 * INT8_BLOCK, 4 * INT8_BLOCK)],
        [(INT8_BLOCK, 2 * INT8_BLOCK), (4 * INT8_BLOCK, 5 * INT8_BLOCK)],
        [(2 * INT8_BLOCK, 3 * INT8_BLOCK), (5 * INT8_BLOCK, 5 * INT8_BLOCK)],
    ]


class Pieces:
    """Fake pieces that record how many are in their exchange and under way at once; each
    exchange waits for ``exchanges``, each all_gather for ``gathers`` (no timers)."""

    def __init__(self, fail: int | None = None) -> None:
        self.exchanging = self.running = self.most_exchanging = self.most_running = 0
        self.started: list[int] = []
        self.fail = fail
        self.exchanges, self.gathers = asyncio.Event(), asyncio.Event()

    async def __call__(self, j: int, exchanged: Callable[[], None]) -> None:
        self.started.append(j)
        self.exchanging += 1
        self.running += 1
        self.most_exchanging = max(self.most_exchanging, self.exchanging)
        self.most_running = max(self.most_running, self.running)
        try:
            try:
                await self.exchanges.wait()
                if j == self.fail:
                    raise RuntimeError(f"piece {j}")
            finally:
                self.exchanging -= 1
                exchanged()
            await self.gathers.wait()
        finally:
            self.running -= 1


async def settle() -> None:
    for _ in range(100):
        await asyncio.sleep(0)


@pytest.mark.parametrize(("window", "depth"), [(1, 1), (2, 2), (2, 5), (3, 1), (4, 8)])
async def test_run_keeps_its_limits_and_the_order(window: int, depth: int) -> None:
    fake = Pieces()
    task = asyncio.ensure_future(run(12, fake, window, depth))
    await settle()
    assert fake.started == list(range(window)) and fake.exchanging == window  # exchanges held
    fake.exchanges.set()
    await settle()
    assert fake.started == list(range(max(window, depth))) and fake.running == max(window, depth)
    assert not task.done()
    fake.gathers.set()
    await task
    assert fake.started == list(range(12))
    assert fake.most_exchanging == window and fake.most_running == max(window, depth)
    assert fake.running == 0


async def test_a_failed_piece_raises_and_the_rest_are_cancelled() -> None:
    fake = Pieces(fail=3)
    task = asyncio.ensure_future(run(40, fake, 2, 4))
    fake.exchanges.set()
    await settle()
    assert fake.started == [0, 1, 2, 3] and fake.running == 3  # piece 3 failed; raised after 0 to 2
    fake.gathers.set()
    with pytest.raises(RuntimeError, match="piece 3"):
        await task
    assert fake.running == 0 and len(fake.started) < 40
