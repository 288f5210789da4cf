"""Uneven ("v") collectives over the in-memory transport: all_to_all /
scatter / reduce_scatter given lists of per-rank arrays, gather / all_gather
with ``uneven=True``; argument checks before any byte is sent; mismatches
(including different ``segment_bytes``) are typed errors on every rank."""

from __future__ import annotations

import numpy as np
import pytest

from netcoll import CollectiveAborted, MismatchError
from netcoll.comm import Communicator
from netcoll.mesh.inprocess import MemoryHub
from netcoll.ops import BFLOAT16, ReduceOp, finalize, reduce_into
from tests.support import memory_world, rank_data, run_world, run_world_settled, valid_ops

WORLD_SIZES = [1, 2, 3, 5]
DTYPES = [np.float32, np.int64, BFLOAT16, np.bool_, np.complex64, np.float16, np.uint8]


def dt_id(d: object) -> str:
    return "bfloat16" if d is BFLOAT16 else np.dtype(d).name


def data(seed: int, shape: tuple[int, ...], dtype: object) -> np.ndarray:
    return np.asarray(rank_data(seed, shape, dtype))  # 0-d: an array, not a numpy scalar


def shape_for(i: int, j: int) -> tuple[int, ...]:
    """A varied shape per (i, j): 0-d, empty, 1-d and 2-d arrays."""
    k = (3 * i + j) % 5
    return [(), (0,), (k + 1,), (k, 2), (2, 0, 3)][(i + 2 * j) % 5]


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
async def test_all_to_all_list(n: int, dtype: object) -> None:
    # x[i][j]: rank i's array for rank j
    xs = [[data(i * n + j, shape_for(i, j), dtype) for j in range(n)] for i in range(n)]
    keep = [[a.copy() for a in row] for row in xs]
    for seg in (None, 5):
        res = await run_world(n, lambda c: c.all_to_all(xs[c.rank]), segment_bytes=seg)
        for r in range(n):
            assert isinstance(res[r], list) and len(res[r]) == n
            for j in range(n):
                same(res[r][j], keep[j][r])
        for i in range(n):  # inputs untouched
            for j in range(n):
                same(xs[i][j], keep[i][j])


async def test_all_to_all_list_big_and_noncontiguous() -> None:
    n = 3
    rng = np.random.default_rng(1)
    big = [
        [rng.standard_normal((200 + 1000 * i + 37 * j, 3)).astype(np.float64)[:, ::2] for j in range(n)]
        for i in range(n)
    ]  # non-contiguous views
    res = await run_world(n, lambda c: c.all_to_all(tuple(big[c.rank])), segment_bytes=4096)
    for r in range(n):
        for j in range(n):
            np.testing.assert_array_equal(res[r][j], big[j][r])
            assert res[r][j].flags.writeable


@pytest.mark.parametrize("limit", ["none", "some", "all"])
async def test_all_to_all_list_ranks_sending_at_once_or_step_by_step_match(
    limit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank sending less than LIST_AT_ONCE_MAX_BYTES in all posts and sends
    everything at once, a larger one goes peer by peer; the messages are the
    same, so a group where ranks decide differently (their sizes differ) still
    gets every block right, in segments or whole."""
    from netcoll.algorithms import pairwise

    n = 4
    rng = np.random.default_rng(5)
    xs = [[rng.standard_normal(100 * (i + 1) + 7 * j).astype(np.float32) for j in range(n)] for i in range(n)]
    totals = sorted(sum(a.nbytes for a in row) for row in xs)
    at = {"none": 0, "some": (totals[1] + totals[2]) // 2, "all": totals[-1] + 1}[limit]
    monkeypatch.setattr(pairwise, "LIST_AT_ONCE_MAX_BYTES", at)
    for seg in (None, 256):
        res = await run_world(n, lambda c: c.all_to_all(xs[c.rank]), segment_bytes=seg)
        for r in range(n):
            for j in range(n):
                same(res[r][j], xs[j][r])


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
async def test_scatter_list(n: int, dtype: object) -> None:
    for root in sorted({0, n - 1}):
        blocks = [data(100 + k, shape_for(k, root), dtype) for k in range(n)]
        keep = [b.copy() for b in blocks]
        res = await run_world(
            n, lambda c, b=blocks, root=root: c.scatter(b if c.rank == root else None, root=root), segment_bytes=3
        )
        for r in range(n):
            same(res[r], keep[r])
        for b, k in zip(blocks, keep, strict=True):
            same(b, k)


async def test_scatter_array_0d_rows() -> None:
    x = np.arange(4, dtype=np.int16)
    res = await run_world(4, lambda c: c.scatter(x if c.rank == 2 else None, root=2))
    for r in range(4):
        same(res[r], np.array(r, np.int16))
    one = await run_world(1, lambda c: c.scatter(np.arange(1.0)))
    same(one[0], np.array(0.0))


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
async def test_gather_and_all_gather_uneven(n: int, dtype: object) -> None:
    xs = [data(7 + r, shape_for(r, 1), dtype) for r in range(n)]
    keep = [x.copy() for x in xs]
    for root in sorted({0, n // 2}):
        res = await run_world(n, lambda c, root=root: c.gather(xs[c.rank], root=root, uneven=True), segment_bytes=4)
        for r in range(n):
            if r != root:
                assert res[r] is None
        assert isinstance(res[root], list) and len(res[root]) == n
        for k in range(n):
            same(res[root][k], keep[k])
    res = await run_world(n, lambda c: c.all_gather(xs[c.rank], uneven=True), segment_bytes=4)
    for r in range(n):
        assert isinstance(res[r], list) and len(res[r]) == n
        for k in range(n):
            same(res[r][k], keep[k])
    for x, k in zip(xs, keep, strict=True):
        same(x, k)


async def test_uneven_false_is_unchanged() -> None:
    xs = [np.full(3, r, np.int32) for r in range(3)]
    res = await run_world(3, lambda c: c.all_gather(xs[c.rank], uneven=False))
    same(res[1], np.stack(xs))
    res = await run_world(3, lambda c: c.gather(xs[c.rank], root=2, uneven=False))
    same(res[2], np.stack(xs))


def documented_order(op: ReduceOp, contribs: list[np.ndarray], r: int) -> np.ndarray:
    """((x[r+1] op x[r+2]) op ... op x[r-1]) op x[r], then finalize."""
    P = len(contribs)
    acc = contribs[(r + 1) % P].copy() if P > 1 else contribs[0].copy()
    for k in range(2, P + 1) if P > 1 else ():
        reduce_into(op, acc, contribs[(r + k) % P])
    finalize(op, acc, P)
    return acc


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
async def test_reduce_scatter_list(n: int, dtype: object) -> None:
    shapes = [shape_for(j, 2) for j in range(n)]  # block j: same shape on every rank
    for op in valid_ops(dtype):
        xs = [[data(i * 31 + j, shapes[j], dtype) for j in range(n)] for i in range(n)]
        if op is ReduceOp.PROD and np.dtype(dtype).kind != "b":
            xs = [
                [np.asarray(np.clip(a.real if np.dtype(dtype).kind == "c" else a, -2, 2).astype(dtype)) for a in row]
                for row in xs
            ]
        keep = [[a.copy() for a in row] for row in xs]
        res = await run_world(n, lambda c, xs=xs, op=op: c.reduce_scatter(xs[c.rank], op=op), segment_bytes=6)
        for r in range(n):
            want = documented_order(op, [keep[i][r] for i in range(n)], r)
            same(res[r], want)  # bit-exact: the documented fixed order
        for i in range(n):
            for j in range(n):
                same(xs[i][j], keep[i][j])


async def test_reduce_scatter_list_floats_deterministic_and_big() -> None:
    n = 4
    rng = np.random.default_rng(5)
    shapes = [(5000,), (0,), (123, 7), (65537,)]
    xs = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(n)]
    runs = [await run_world(n, lambda c: c.reduce_scatter(xs[c.rank], op="sum"), segment_bytes=4096) for _ in range(2)]
    for r in range(n):
        assert runs[0][r].tobytes() == runs[1][r].tobytes()
        np.testing.assert_allclose(runs[0][r], sum(xs[i][r].astype(np.float64) for i in range(n)), rtol=1e-5, atol=1e-5)
        same(runs[0][r], documented_order(ReduceOp.SUM, [xs[i][r] for i in range(n)], r))
    avg = await run_world(n, lambda c: c.reduce_scatter(xs[c.rank], op="avg"))
    for r in range(n):
        same(avg[r], documented_order(ReduceOp.AVG, [xs[i][r] for i in range(n)], r))


# -- argument checks: raised on the caller before any byte is sent -------------------


def _untouched(hub: MemoryHub) -> bool:
    return all(t.frames_sent == 0 for t in hub.meshes)


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.all_to_all([np.zeros(2)] * 2),  # wrong length
        lambda c: c.all_to_all([np.zeros(2, np.float32), np.zeros(2), np.zeros(2)]),  # mixed dtypes
        lambda c: c.all_to_all([np.zeros(2), None, np.zeros(1)]),  # not an array
        lambda c: c.all_to_all([np.zeros(2)] * 3, algorithm="ring"),
        lambda c: c.scatter([np.zeros(1)] * 4),
        lambda c: c.scatter([np.zeros(1, np.int8), np.zeros(1), np.zeros(1)]),
        lambda c: c.reduce_scatter([np.zeros(1)] * 2),
        lambda c: c.reduce_scatter([np.zeros(1, np.int32), np.zeros(1), np.zeros(1)]),
        lambda c: c.reduce_scatter([np.zeros(1)] * 3, op="band"),  # op x dtype
        lambda c: c.reduce_scatter([np.zeros(1)] * 3, algorithm="ring"),
        lambda c: c.gather(np.zeros(1), uneven=1),
        lambda c: c.all_gather(np.zeros(1), uneven="yes"),
        lambda c: c.all_gather(np.zeros(1), uneven=True, algorithm="doubling"),
        lambda c: c.gather(np.zeros(1), uneven=True, algorithm="tree"),
    ],
)
async def test_bad_arguments_fail_before_sending(call) -> None:  # type: ignore[no-untyped-def]
    hub, comms = memory_world(3)
    with pytest.raises((TypeError, ValueError)):
        await call(comms[0])
    assert _untouched(hub)
    # the communicator still works afterwards (no sequence number was taken)
    res = await run_on(comms, lambda c: c.all_reduce(np.ones(2)))
    assert all((r == 3).all() for r in res)


async def run_on(comms: list[Communicator], fn):  # type: ignore[no-untyped-def]
    import asyncio

    async with asyncio.timeout(10):
        return await asyncio.gather(*(fn(c) for c in comms))


# -- mismatches between ranks --------------------------------------------------------


async def test_list_vs_array_all_to_all_is_a_mismatch() -> None:
    res = await run_world_settled(
        2, lambda c: c.all_to_all([np.zeros(1), np.zeros(1)] if c.rank == 0 else np.zeros((2, 1))), limit=10
    )
    for r in res:
        assert isinstance(r, MismatchError), r
        assert "list of float64" in str(r) and "float64[2,1]" in str(r)


async def test_reduce_scatter_list_shape_disagreement_is_a_mismatch() -> None:
    res = await run_world_settled(
        3, lambda c: c.reduce_scatter([np.zeros(2), np.zeros(3 + (c.rank == 2)), np.zeros(1)]), limit=10
    )
    for r in res:
        assert isinstance(r, MismatchError), r


async def test_uneven_gather_dtype_disagreement_is_a_mismatch() -> None:
    res = await run_world_settled(
        3, lambda c: c.all_gather(np.zeros(c.rank, np.float32 if c.rank else np.float64), uneven=True), limit=10
    )
    for r in res:
        assert isinstance(r, MismatchError), r
        assert "float32[uneven]" in str(r) and "float64[uneven]" in str(r)


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.all_reduce(np.ones(1000)),
        lambda c: c.broadcast(np.ones(10) if c.rank == 0 else None),
        lambda c: c.all_to_all([np.ones(5)] * c.world_size),
        lambda c: c.scatter(np.ones((2, 3)) if c.rank == 0 else None),
    ],
)
async def test_different_segment_bytes_is_a_mismatch(call) -> None:  # type: ignore[no-untyped-def]
    hub = MemoryHub(2)
    comms = [Communicator(t, segment_bytes=s) for t, s in zip(hub.meshes, (64, 128), strict=True)]
    import asyncio

    async with asyncio.timeout(10):
        res = await asyncio.gather(*(call(c) for c in comms), return_exceptions=True)
    for rank, r in enumerate(res):
        if not isinstance(r, BaseException):  # a sender that finished first (broadcast/scatter root)
            assert rank == 0
            with pytest.raises(CollectiveAborted) as info:  # its next call fails, naming the mismatch
                await comms[0].barrier(timeout=5)
            r = info.value
        assert isinstance(r, (MismatchError, CollectiveAborted)), r
        assert "segment_bytes=64" in str(r) and "segment_bytes=128" in str(r)


@pytest.mark.parametrize("n", [2, 3, 5])
async def test_lists_of_equal_rows_match_the_array_forms_bitwise(n: int) -> None:
    """A list of the rows of an array gives the array form's result, bit for bit
    (reduce_scatter: the pairwise list algorithm folds in the ring's order)."""
    rng = np.random.default_rng(n)
    xs = [(rng.standard_normal((n, 999)) * 10.0 ** rng.integers(-3, 3, (n, 999))).astype(np.float32) for _ in range(n)]
    for op in ("sum", "prod", "min", "max", "avg"):
        ring = await run_world(
            n, lambda c, op=op: c.reduce_scatter(xs[c.rank], op=op, algorithm="ring"), segment_bytes=512
        )
        lst = await run_world(n, lambda c, op=op: c.reduce_scatter(list(xs[c.rank]), op=op), segment_bytes=512)
        for r in range(n):
            same(lst[r], ring[r])
    arr = await run_world(n, lambda c: c.all_to_all(xs[c.rank]))
    lst = await run_world(n, lambda c: c.all_to_all(list(xs[c.rank])))
    for r in range(n):
        same(np.stack(lst[r]), arr[r])
