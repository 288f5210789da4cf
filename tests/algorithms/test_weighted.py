# Rank bodies are closures over loop variables, awaited within the iteration that defines them:
# ruff: noqa: B023
"""Tests for the weighted all_reduce (netcoll.algorithms.weighted): the share solver
(exact cases and hypothesis properties) and the algorithm with unequal rates at 2-5
ranks, over memory and loopback TCP (and shared memory for a big buffer)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netcoll.algorithms import ALGORITHMS, weighted
from netcoll.algorithms import shares as sh
from netcoll.mesh.channel import Channel
from netcoll.ops import ReduceOp
from tests.algorithms.test_algorithms import check_reduced, make_inputs
from tests.support import ALL_LINKS, MakeGroup, tcp_group

rates_st = st.lists(st.floats(min_value=1e-3, max_value=1e3, allow_nan=False), min_size=1, max_size=9)


def test_registered_for_all_reduce_only() -> None:
    assert ALGORITHMS["all_reduce"]["weighted"] is weighted.all_reduce
    assert all("weighted" not in t for c, t in ALGORITHMS.items() if c != "all_reduce")


def test_four_ranks_one_four_times_slower_owns_nothing() -> None:
    """The issue's case: the slow rank moves only its own input out and the result in."""
    s = sh.shares(1200, [1.0, 1.0, 0.25, 1.0], 4)
    assert s == [400, 400, 0, 400]
    # the busiest rank's bytes, in the slow rank's time: n (against the ring's 1.5 n at its rate)
    assert sh.busiest(1200.0, [1.0, 1.0, 0.25, 1.0], 4) == pytest.approx(1200.0)
    assert sh.busiest(1200.0, [1.0] * 4, 4) == pytest.approx(1.5 * 1200.0)


def test_mildly_slower_rank_owns_less() -> None:
    s = sh.shares(10_000, [1.0, 0.8, 1.0], 3)
    assert sum(s) == 10_000 and s[1] < s[0] == s[2]
    real = sh.ideal(10_000.0, [1.0, 0.8, 1.0], 3)
    times = [(10_000 + real[i]) / w for i, w in enumerate([1.0, 0.8, 1.0])]
    assert max(times) == pytest.approx(min(times))  # everyone finishes together


def test_two_ranks_and_unusable_rates_give_equal_shares() -> None:
    assert sh.shares(11, [1.0, 0.1], 2) == [6, 5]
    assert sh.shares(10, None, 3) == [4, 3, 3]
    assert sh.shares(10, [1.0, 0.0, 1.0], 3) == [4, 3, 3]  # a zero rate: not measured
    assert sh.shares(10, [1.0, float("nan"), 1.0], 3) == [4, 3, 3]
    assert sh.shares(10, [1.0, 1.0], 3) == [4, 3, 3]  # not one per rank
    assert sh.shares(0, [1.0, 0.5, 0.2], 3) == [0, 0, 0]
    with pytest.raises(ValueError, match="p >= 1"):
        sh.shares(5, None, 0)


def test_uncapped_shares_are_one_float() -> None:
    """The ranks below their caps get one level, the same float (it was each computed from
    what was left: 695330 went to a rank at 350 rather than the one at 351)."""
    rates = [302.0, 302.0, 350.0, 350.0, 351.0, 175.32886696501205, 276.3776448942396, 350.0]
    real = sh.ideal(4194303.0, rates, 8)
    assert len({real[i] for i in (2, 3, 4, 7)}) == 1
    assert sh.shares(4194303, rates, 8) == [505048, 505048, 695329, 695329, 695330, 0, 402890, 695329]


@settings(max_examples=300, deadline=None)
@given(rates=rates_st, n=st.integers(min_value=0, max_value=10**7))
def test_shares_properties(rates: list[float], n: int) -> None:
    p = len(rates)
    s = sh.shares(n, rates, p)
    assert len(s) == p and sum(s) == n and min(s) >= 0
    for i in range(p):
        for j in range(p):
            if rates[i] < rates[j]:
                assert s[i] <= s[j], (i, j, s)
    assert s == sh.shares(n, list(rates), p)  # a pure function


@settings(max_examples=200, deadline=None)
@given(p=st.integers(min_value=1, max_value=16), n=st.integers(min_value=0, max_value=10**7), w=st.floats(1e-3, 1e3))
def test_equal_rates_equal_shares(p: int, n: int, w: float) -> None:
    s = sh.shares(n, [w] * p, p)
    assert max(s) - min(s) <= 1 and sum(s) == n


@settings(max_examples=200, deadline=None)
@given(rates=rates_st.filter(lambda r: len(r) >= 3), n=st.integers(min_value=1000, max_value=10**7))
def test_shares_minimise_the_slowest_rank(rates: list[float], n: int) -> None:
    """The latest rank finishes at the least possible time ``T`` (no shares finish all
    ranks by ``T (1 - 1e-6)``: a rank moves at least ``n`` each way, and ``s_i`` by ``T``
    needs ``s_i <= (T w_i - n)/(P-2)``), and the shares are the most nearly equal such: an
    owner with less than the largest share is at that cap (finishes at ``T``), and a rank
    that owns nothing has no room to."""
    p = len(rates)
    real = sh.ideal(float(n), rates, p)
    assert sum(real) == pytest.approx(n) and min(real) >= 0
    times = [(n + (p - 2) * real[i]) / rates[i] for i in range(p)]
    latest = max(times)
    sooner = latest * (1 - 1e-6)
    room = sum(max(0.0, (sooner * w - n) / (p - 2)) for w in rates)
    assert sooner < n / min(rates) or room < n  # nothing sooner is possible
    top = max(real)
    assert all(
        t == pytest.approx(latest, rel=1e-9) for t, x in zip(times, real, strict=True) if 0 < x < top * (1 - 1e-9)
    )
    assert all(w * latest <= n * (1 + 1e-9) for w, x in zip(rates, real, strict=True) if x == 0)


@pytest.mark.parametrize("P", [2, 3, 4, 5])
@pytest.mark.parametrize(
    ("dt", "op"),
    [(np.dtype(np.float32), ReduceOp.SUM), (np.dtype(np.int64), ReduceOp.BXOR), (np.dtype(np.float64), ReduceOp.AVG)],
)
async def test_unequal_rates_exact_and_bit_identical(make_group: MakeGroup, P: int, dt: np.dtype, op: ReduceOp) -> None:
    group = await make_group(P)
    for rates in (
        [1.0] * P,
        [0.25, *[1.0] * (P - 1)],
        [1.0 / (r + 1) for r in range(P)],
        [1.0, 0.25] * (P // 2) + [1.0] * (P % 2),
    ):
        for count, seg in ((0, 64), (1, 64), (777, 64), (5000, 1 << 20)):
            inputs = make_inputs(dt, op, P, count, seed=str(rates))

            async def body(ch: Channel) -> np.ndarray:
                buf = inputs[ch.rank].copy()
                await weighted.all_reduce(ch, buf, op, segment_bytes=seg, rates=rates)
                return buf

            results = await group.run(body)
            what = f"weighted P={P} n={count} {dt} {op.value} rates={rates}"
            assert len({r.tobytes() for r in results}) == 1, what
            check_reduced(results[0], op, inputs, what)
            again = await group.run(body)  # a fixed reduction order: the same bits each run
            assert again[0].tobytes() == results[0].tobytes(), what


@pytest.mark.parametrize("make_group", ALL_LINKS, indirect=True)
async def test_big_buffer_with_a_slow_rank(make_group: MakeGroup) -> None:
    P, count = 4, (1 << 20) + 3
    group = await make_group(P)
    inputs = make_inputs(np.dtype(np.float32), ReduceOp.SUM, P, count)
    rates = [1.0, 1.0, 0.25, 1.0]

    async def body(ch: Channel) -> np.ndarray:
        buf = inputs[ch.rank].copy()
        await weighted.all_reduce(ch, buf, ReduceOp.SUM, segment_bytes=256 << 10, rates=rates)
        return buf

    results = await group.run(body)
    assert len({r.tobytes() for r in results}) == 1
    check_reduced(results[0], ReduceOp.SUM, inputs, "weighted big")


@settings(max_examples=200, deadline=None)
@given(k=st.integers(min_value=0, max_value=500), m=st.integers(min_value=1, max_value=64))
def test_taper_covers_every_slice_small_at_both_ends(k: int, m: int) -> None:
    sizes = sh.taper(k, m)
    assert sum(sizes) == k and all(1 <= s <= m for s in sizes)
    if k:
        assert sizes[0] == 1 and sizes[-1] == 1
    if k >= 4 * m:  # a long stream is mostly full messages: at most 2 log2(m) + 1 short ones
        assert sum(s < m for s in sizes) <= 2 * max(1, m - 1).bit_length() + 1


@settings(max_examples=200, deadline=None)
@given(
    rates=st.lists(st.floats(min_value=1e-2, max_value=1e2, allow_nan=False), min_size=2, max_size=6),
    n=st.integers(min_value=0, max_value=200_000),
    seg=st.sampled_from([64, 4096, 1 << 20]),
)
def test_grid_messages_cut_each_share_in_whole_slices(rates: list[float], n: int, seg: int) -> None:
    p = len(rates)
    grid = sh.Grid.of(n, 4, p, seg, rates)
    assert grid.at == sh.bounds(sh.shares(n, rates, p))
    for q in range(p):
        share = grid.at[q + 1] - grid.at[q]
        assert [b for _, b in grid.slice_bounds(q)][-1:] == ([share] if share else [])
        for i in range(p):
            if i == q:
                continue
            msgs = grid.messages(i, q)
            assert msgs == grid.messages(i, q)  # a pure function: both ends compute the same
            assert [a for a, _ in msgs] == [0, *[b for _, b in msgs]][: len(msgs)]  # back to back
            assert (msgs[-1][1] if msgs else 0) == share
            assert all(a % grid.size == 0 and a < b for a, b in msgs)
            assert all(b - a <= grid.per_message(i, q) * grid.size for a, b in msgs)
            assert grid.per_message(i, q) == grid.per_message(q, i)


def test_a_slow_link_has_smaller_messages_and_paces_only_the_fast() -> None:
    rates = [1.0, 1.0, 1.0, 0.25]
    grid = sh.Grid.of(16 << 20, 4, 4, 4 << 20, rates)  # the 64 MiB of float32
    assert grid.per_message(0, 1) == grid.full == sh.FINE
    assert grid.per_message(3, 1) == sh.FINE // 4
    assert grid.paced(0, 1) and grid.paced(2, 0)  # fast to fast: held to the owner's pace
    assert not grid.paced(3, 0)  # the slow rank's input is what sets that pace
    even = sh.Grid.of(16 << 20, 4, 4, 4 << 20, None)
    assert not any(even.paced(i, q) for i in range(4) for q in range(4) if i != q)


def test_the_slowest_rank_streams_its_input_interleaved() -> None:
    """Only a slowest rank (of unequal rates) streams; its messages to every owner go in
    the order of how far into that owner's share they end (ties: the lower owner)."""
    assert [sh.Grid.of(1 << 20, 4, 4, 4 << 20, [1.0, 1.0, 1.0, 0.25]).streams(i) for i in range(4)] == [
        False,
        False,
        False,
        True,
    ]
    assert [sh.Grid.of(1 << 20, 4, 4, 4 << 20, [0.5, 1.0, 0.5, 1.0]).streams(i) for i in range(4)] == [
        True,
        False,
        True,
        False,
    ]
    assert not any(sh.Grid.of(1 << 20, 4, 3, 4 << 20, None).streams(i) for i in range(3))
    grid = sh.Grid(at=[0, 6, 9, 9], size=1, full=2, rates=[1.0, 1.0, 0.5])
    assert grid.messages(2, 0) == [(k, k + 1) for k in range(6)] and grid.messages(2, 1) == [(0, 1), (1, 2), (2, 3)]
    order = [(q, j) for q, j, _, _ in grid.interleaved(2)]
    assert order == [(0, 0), (0, 1), (1, 0), (0, 2), (0, 3), (1, 1), (0, 4), (0, 5), (1, 2)]
    assert all(grid.messages(2, q)[j] == (a, b) for q, j, a, b in grid.interleaved(2))


@pytest.mark.parametrize("rates", [[1.0, 0.25, 1.0, 1.0, 0.5], [1.0, 2.0, 0.1], None])
async def test_src_leaves_the_input_and_gives_the_same_bits(make_group: MakeGroup, rates: list[float] | None) -> None:
    P = 3 if rates is None else len(rates)
    group = await make_group(P)
    inputs = make_inputs(np.dtype(np.float32), ReduceOp.SUM, P, 50_003)

    async def body(ch: Channel, use_src: bool) -> np.ndarray:
        x = inputs[ch.rank].copy()
        out = np.full_like(x, np.nan) if use_src else x
        await weighted.all_reduce(ch, out, ReduceOp.SUM, segment_bytes=8 << 10, rates=rates, src=x if use_src else None)
        if use_src:
            assert x.tobytes() == inputs[ch.rank].tobytes()  # read only
        return out

    with_src = await group.run(lambda ch: body(ch, True))
    in_place = await group.run(lambda ch: body(ch, False))
    assert len({r.tobytes() for r in with_src + in_place}) == 1
    check_reduced(with_src[0], ReduceOp.SUM, inputs, f"weighted src rates={rates}")


@pytest.mark.parametrize("rates", [[1.0, 1.0, 1.0, 0.25], [1.0, 0.5, 0.3, 1.0, 0.1], [0.25, 1.0, 0.25, 1.0]])
async def test_paced_links_under_a_small_receive_window(rates: list[float]) -> None:
    """Paced fast links, slow links of smaller messages and every message's receive
    through a 64 KiB window (sends wait for credit or a rendezvous): no rank waits forever,
    and every rank ends with the same, right bits."""
    P = len(rates)
    group = await tcp_group(P, window=64 << 10)
    try:
        inputs = make_inputs(np.dtype(np.float32), ReduceOp.SUM, P, 300_001)
        grid = sh.Grid.of(300_001, 4, P, 64 << 10, rates)
        assert any(grid.paced(i, q) for i in range(P) for q in range(P) if i != q)

        async def body(ch: Channel) -> np.ndarray:
            buf = inputs[ch.rank].copy()
            await weighted.all_reduce(ch, buf, ReduceOp.SUM, segment_bytes=64 << 10, rates=rates)
            return buf

        results = await asyncio.wait_for(group.run(body), 60)
        assert len({r.tobytes() for r in results}) == 1
        check_reduced(results[0], ReduceOp.SUM, inputs, f"weighted paced rates={rates}")
    finally:
        await group.close()
