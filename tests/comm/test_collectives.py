"""Every collective of the public Communicator against a numpy reference, over
the in-memory transport: a Gloo-style grid of world sizes x counts x dtypes x
ops x algorithms. (The same calls over real TCP: test_tcp*.py.)"""
# Rank bodies are lambdas over loop variables, always awaited within the
# iteration that defines them:
# ruff: noqa: B023

from __future__ import annotations

import numpy as np
import pytest

from netcoll import algorithms
from netcoll.ops import BFLOAT16, ReduceOp, reduce_reference
from tests.support import rank_data, run_world, valid_ops

WORLD_SIZES = [1, 2, 3, 4, 5, 8]
COUNTS = [0, 1, 7, 1000]
BIG = 2**20 + 3
DTYPES = [np.float32, np.float64, np.int32, np.int64]
EXTRA_DTYPES = [np.bool_, np.float16, BFLOAT16, np.complex64, np.uint8, np.int8]


def inputs(n: int, shape: tuple[int, ...], dtype: object, op: ReduceOp | None = None) -> list[np.ndarray]:
    xs = [rank_data(r, shape, dtype) for r in range(n)]
    if op is ReduceOp.PROD and np.dtype(dtype).kind not in "b":  # keep products exact in every dtype
        xs = [np.clip(x.real if np.dtype(dtype).kind == "c" else x, -2, 2).astype(dtype) for x in xs]
    return xs


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if got.dtype.kind in "fc" or got.dtype == BFLOAT16:
        np.testing.assert_allclose(
            got.astype(np.complex128 if got.dtype.kind == "c" else np.float64),
            want.astype(np.complex128 if want.dtype.kind == "c" else np.float64),
            rtol=1e-2,
            atol=1e-2,
        )
    else:
        np.testing.assert_array_equal(got, want)


def algos(name: str) -> list[str]:
    return ["auto", *sorted(algorithms.ALGORITHMS[name])]


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES + EXTRA_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", algos("all_reduce"))
async def test_all_reduce_grid(n: int, dtype: object, algorithm: str) -> None:
    counts = COUNTS if dtype in DTYPES else [0, 7, 1000]
    for count in counts:
        for op in valid_ops(dtype):
            xs = inputs(n, (count,), dtype, op)
            keep = [x.copy() for x in xs]
            res = await run_world(n, lambda c: c.all_reduce(xs[c.rank], op=op, algorithm=algorithm))
            want = reduce_reference(op, keep)
            for r in range(n):
                assert_close(res[r], want)
                assert res[r].tobytes() == res[0].tobytes(), "all_reduce results must be bit-identical"
                np.testing.assert_array_equal(xs[r], keep[r])  # the input is never modified


@pytest.mark.parametrize("n", [3, 4, 8])
@pytest.mark.parametrize("algorithm", algos("all_reduce"))
async def test_all_reduce_big(n: int, algorithm: str) -> None:
    xs = [np.random.default_rng(r).standard_normal(BIG).astype(np.float32) for r in range(n)]
    res = await run_world(
        n, lambda c: c.all_reduce(xs[c.rank], op="sum", algorithm=algorithm), segment_bytes=256 * 1024
    )
    np.testing.assert_allclose(res[0], np.sum(xs, axis=0, dtype=np.float64), rtol=1e-4, atol=1e-4)
    assert all(r.tobytes() == res[0].tobytes() for r in res)


async def test_all_reduce_shapes_and_out() -> None:
    x = [np.arange(24, dtype=np.float64).reshape(2, 3, 4)[:, ::2, :] * (r + 1) for r in range(3)]  # non-contiguous
    res = await run_world(3, lambda c: c.all_reduce(x[c.rank]))
    np.testing.assert_array_equal(res[0], x[0] * 6)
    zero_d = await run_world(2, lambda c: c.all_reduce(np.float32(c.rank + 1)))
    assert zero_d[0].shape == () and zero_d[0] == 3
    bufs = [np.ones(5, np.int64) * (r + 1) for r in range(2)]
    out = await run_world(2, lambda c: c.all_reduce(bufs[c.rank], out=bufs[c.rank]))
    assert out[0] is bufs[0] and (bufs[1] == 3).all()


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", algos("reduce"))
async def test_reduce_grid(n: int, algorithm: str) -> None:
    for dtype in (np.float32, np.int64, BFLOAT16, np.bool_):
        for count in COUNTS:
            for op in valid_ops(dtype):
                for root in {0, n - 1}:
                    xs = inputs(n, (count, 2), dtype, op)
                    res = await run_world(n, lambda c: c.reduce(xs[c.rank], op=op, root=root, algorithm=algorithm))
                    assert_close(res[root], reduce_reference(op, xs))
                    assert all(res[r] is None for r in range(n) if r != root)


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", algos("broadcast"))
async def test_broadcast_grid(n: int, algorithm: str) -> None:
    for dtype in (np.float32, np.int8, BFLOAT16, np.complex128, np.bool_):
        for count in COUNTS:
            for root in {0, n // 2, n - 1}:
                x = rank_data(99, (count, 3), dtype)
                res = await run_world(
                    n, lambda c: c.broadcast(x if c.rank == root else None, root=root, algorithm=algorithm)
                )
                for r in range(n):
                    np.testing.assert_array_equal(res[r], x)
                    assert res[r].dtype == x.dtype and res[r].shape == x.shape


async def test_broadcast_into_buffer_and_big() -> None:
    x = np.random.default_rng(0).standard_normal(BIG).astype(np.float32)
    bufs = [x if r == 1 else np.zeros_like(x) for r in range(4)]
    res = await run_world(4, lambda c: c.broadcast(bufs[c.rank], root=1), segment_bytes=128 * 1024)
    for r in range(4):
        np.testing.assert_array_equal(res[r], x)
    assert res[2] is bufs[2]
    assert res[1] is x  # the root sends its own array without copying it (and never writes to it)
    ro = x[::2].copy()
    ro.flags.writeable = False  # a read-only root array is fine; a strided one is copied first
    res = await run_world(3, lambda c: c.broadcast(ro if c.rank == 0 else None))
    assert res[0] is ro and all(np.array_equal(r, ro) for r in res)
    res = await run_world(2, lambda c: c.broadcast(x[::2] if c.rank == 0 else None))
    assert res[0].flags.c_contiguous and all(np.array_equal(r, x[::2]) for r in res)


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", algos("all_gather"))
async def test_all_gather_grid(n: int, algorithm: str) -> None:
    for dtype in (np.float64, np.int32, BFLOAT16, np.bool_):
        for count in COUNTS:
            xs = inputs(n, (count,), dtype)
            res = await run_world(n, lambda c: c.all_gather(xs[c.rank], algorithm=algorithm))
            for r in range(n):
                np.testing.assert_array_equal(res[r], np.stack(xs))


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", algos("gather"))
async def test_gather_scatter_grid(n: int, algorithm: str) -> None:
    for dtype in (np.float32, np.uint16, BFLOAT16):
        for count in COUNTS:
            for root in {0, n - 1}:
                xs = inputs(n, (count,), dtype)
                res = await run_world(n, lambda c: c.gather(xs[c.rank], root=root, algorithm=algorithm))
                np.testing.assert_array_equal(res[root], np.stack(xs))
                assert all(res[r] is None for r in range(n) if r != root)
                full = np.stack(xs)
                sc = await run_world(n, lambda c: c.scatter(full if c.rank == root else None, root=root))
                for r in range(n):
                    np.testing.assert_array_equal(sc[r], full[r])
                    assert sc[r].dtype == full.dtype


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", algos("reduce_scatter"))
async def test_reduce_scatter_grid(n: int, algorithm: str) -> None:
    for dtype in (np.float32, np.int64, np.float16):
        for count in COUNTS:
            for op in valid_ops(dtype):
                xs = inputs(n, (n, count), dtype, op)
                res = await run_world(n, lambda c: c.reduce_scatter(xs[c.rank], op=op, algorithm=algorithm))
                want = reduce_reference(op, xs)
                for r in range(n):
                    assert_close(res[r], want[r])


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", algos("all_to_all"))
async def test_all_to_all_grid(n: int, algorithm: str) -> None:
    for dtype in (np.float32, np.int16, np.complex64):
        for count in COUNTS:
            xs = inputs(n, (n, count, 2), dtype)
            res = await run_world(n, lambda c: c.all_to_all(xs[c.rank], algorithm=algorithm))
            for r in range(n):
                np.testing.assert_array_equal(res[r], np.stack([xs[j][r] for j in range(n)]))


@pytest.mark.parametrize("n", [1, 3, 4])
async def test_out_buffers_are_filled_and_returned(n: int) -> None:
    """``out=`` for all_gather, gather, reduce_scatter and all_to_all: the
    result lands in (and is) the caller's array; inputs are never modified."""
    xs = inputs(n, (n, 5), np.float32)
    keep = [x.copy() for x in xs]
    full = np.stack(xs)

    async def run(c):  # type: ignore[no-untyped-def]
        x = xs[c.rank]
        outs = {
            name: np.full(shape, -1, np.float32)
            for name, shape in (("ag", (n, n, 5)), ("g", (n, n, 5)), ("rs", (5,)), ("a2a", (n, 5)))
        }
        outs["sc"] = np.full((5,), -1, np.float32)
        got = {
            "ag": await c.all_gather(x, out=outs["ag"]),
            "g": await c.gather(x, root=n - 1, out=outs["g"]),
            "rs": await c.reduce_scatter(x, out=outs["rs"]),
            "a2a": await c.all_to_all(x, out=outs["a2a"]),
            "sc": await c.scatter(xs[0] if c.rank == 0 else None, root=0, out=outs["sc"]),
        }
        return outs, got

    res = await run_world(n, run)
    for r, (outs, got) in enumerate(res):
        for name in ("ag", "rs", "a2a", "sc"):
            assert got[name] is outs[name]
        np.testing.assert_array_equal(outs["sc"], xs[0][r])
        np.testing.assert_array_equal(outs["ag"], full)
        np.testing.assert_array_equal(outs["rs"], full.sum(axis=0)[r])
        np.testing.assert_array_equal(outs["a2a"], full[:, r])
        if r == n - 1:
            assert got["g"] is outs["g"]
            np.testing.assert_array_equal(outs["g"], full)
        else:  # ignored away from the root
            assert got["g"] is None and (outs["g"] == -1).all()
    for x, k in zip(xs, keep, strict=True):
        np.testing.assert_array_equal(x, k)


@pytest.mark.parametrize("n", [2, 3])
async def test_out_buffers_aliasing_the_input(n: int) -> None:
    """In-place all_gather (``x`` is ``out[rank]``), and inputs that overlap
    ``out`` (copied first, so the result is still right)."""
    xs = inputs(n, (n, 6), np.int64)
    full = np.stack(xs)

    async def run(c):  # type: ignore[no-untyped-def]
        ag = np.zeros((n, n, 6), np.int64)
        ag[c.rank] = xs[c.rank]
        await c.all_gather(ag[c.rank], out=ag)  # in place, as NCCL's sendbuff == recvbuff + rank
        skew = np.zeros((n + 1, n, 6), np.int64)
        skew[1:] = full  # rank r's x is skew[r] = rank r-1's data: overlaps the result
        ag2 = await c.all_gather(skew[c.rank], out=skew[:n])
        rs_in = xs[c.rank].copy()
        rs = await c.reduce_scatter(rs_in, out=rs_in[c.rank])  # out is one row of x
        a2a_in = xs[c.rank].copy()
        a2a = await c.all_to_all(a2a_in, out=a2a_in)  # fully in place
        return ag, ag2.copy(), rs.copy(), a2a.copy()

    res = await run_world(n, run)
    shifted = np.concatenate([np.zeros((1, n, 6), np.int64), full])[:n]
    for r, (ag, ag2, rs, a2a) in enumerate(res):
        np.testing.assert_array_equal(ag, full)
        np.testing.assert_array_equal(ag2, shifted)
        np.testing.assert_array_equal(rs, full.sum(axis=0)[r])
        np.testing.assert_array_equal(a2a, full[:, r])


async def test_bad_out_buffers_are_refused_before_sending() -> None:
    x = np.ones((2, 3), np.float32)

    async def run(c):  # type: ignore[no-untyped-def]
        errors = []
        for call in (
            lambda: c.all_gather(x, out=np.empty((2, 2, 2), np.float32)),
            lambda: c.all_gather(x, out=np.empty((2, 2, 3), np.float64)),
            lambda: c.all_gather(x, out=np.empty((2, 3, 2), np.float32).transpose(0, 2, 1)),
            lambda: c.all_gather(x, out=[[0.0]]),
            lambda: c.all_gather(x, uneven=True, out=np.empty((2, 2, 3), np.float32)),
            lambda: c.gather(x, uneven=True, out=np.empty((2, 2, 3), np.float32)),
            lambda: c.reduce_scatter(x, out=np.empty((4,), np.float32)),
            lambda: c.reduce_scatter([x[0], x[1]], out=np.empty((3,), np.float32)),
            lambda: c.all_to_all(x, out=np.empty((3, 2), np.float32)),
            lambda: c.all_to_all([x[0], x[1]], out=np.empty((2, 3), np.float32)),
            lambda: c.scatter(x, out=np.empty((2,), np.float32)) if c.rank == 0 else c.scatter(None, out=[0.0, 1.0]),
            lambda: (
                c.scatter([x[0], x[1]], out=np.empty((3,), np.float32))
                if c.rank == 0
                else c.scatter(None, out=np.empty((3,), np.float32)[::-1])
            ),
        ):
            with pytest.raises((ValueError, TypeError)) as info:
                await call()
            errors.append(str(info.value))
        await c.barrier()  # nothing was sent: the ranks are still in step
        return errors

    res = await run_world(2, run)
    assert all("out" in e for e in res[0])


@pytest.mark.parametrize("n", [1, 2, 5, 8])
async def test_barrier_and_p2p(n: int) -> None:
    async def body(c):  # type: ignore[no-untyped-def]
        await c.barrier()
        if c.world_size == 1:
            return None
        nxt, prv = (c.rank + 1) % c.world_size, (c.rank - 1) % c.world_size
        send = [c.send(np.full((3, c.rank + 1), c.rank, np.int32), nxt, tag=t) for t in (0, 7)]
        for s in send:
            await s
        big = np.arange(BIG, dtype=np.uint8)
        await c.send(big, nxt, tag=1)
        got7 = await c.recv(prv, tag=7)
        got0 = await c.recv(prv, tag=0)
        gotbig = await c.recv(prv, tag=1)
        assert gotbig.shape == big.shape and (gotbig == big).all()
        return got0, got7

    res = await run_world(n, body, segment_bytes=64 * 1024)
    for r in range(1, n):
        for got in res[r]:
            assert got.shape == (3, r) and (got == r - 1).all()


async def test_split_subgroups() -> None:
    async def body(c):  # type: ignore[no-untyped-def]
        sub = await c.split(c.rank % 2, key=-c.rank + 10)
        y = await sub.all_reduce(np.array([c.rank], np.int64))
        none = await c.split(None if c.rank == 0 else 1)
        return sub.rank, sub.world_size, int(y[0]), none is None

    res = await run_world(5, body)
    assert [r[2] for r in res] == [0 + 2 + 4, 1 + 3, 6, 4, 6]
    assert res[4][0] == 0 and res[0][0] == 2  # ordered by key (descending rank here)
    assert res[0][3] and not res[1][3]


async def test_concurrent_collectives_share_links() -> None:
    import asyncio

    async def body(c):  # type: ignore[no-untyped-def]
        xs = [np.full(1000 + i, c.rank + i, np.float64) for i in range(6)]
        return await asyncio.gather(*(c.all_reduce(x) for x in xs), c.all_gather(np.array([c.rank])))

    res = await run_world(4, body, segment_bytes=1024)
    for i in range(6):
        assert (res[0][i] == sum(r + i for r in range(4))).all()
    assert (res[3][6].ravel() == [0, 1, 2, 3]).all()


async def test_ring_reading_the_input_in_place_gives_the_same_bits() -> None:
    """The ring reads a contiguous input directly (no copy into the result);
    with ``out=x`` it works in place: both must give the same bits."""
    xs = [np.random.default_rng(r).standard_normal(100_003).astype(np.float32) for r in range(4)]
    keep = [x.copy() for x in xs]
    direct = await run_world(4, lambda c: c.all_reduce(xs[c.rank], algorithm="ring"), segment_bytes=4096)
    assert all((x == k).all() for x, k in zip(xs, keep, strict=True))  # inputs untouched
    inplace = await run_world(
        4, lambda c: c.all_reduce(xs[c.rank], out=xs[c.rank], algorithm="ring"), segment_bytes=4096
    )
    for r in range(4):
        assert inplace[r] is xs[r]
        assert direct[r].tobytes() == inplace[r].tobytes() == direct[0].tobytes()


async def test_scatter_into_out_is_a_different_call_from_scatter_without() -> None:
    """scatter with out= on some ranks and without on others is a mismatch
    (the two move different messages), reported on every rank, never a hang."""
    from netcoll import CollectiveError
    from tests.support import run_world_settled

    x = np.arange(6, dtype=np.float32).reshape(3, 2)

    async def run(c):  # type: ignore[no-untyped-def]
        if c.rank == 1:
            return await c.scatter(None, out=np.empty(2, np.float32), timeout=5)
        return await c.scatter(x if c.rank == 0 else None, timeout=5)

    res = await run_world_settled(3, run)
    assert isinstance(res[1], CollectiveError), res
    assert any(isinstance(r, CollectiveError) for r in (res[0], res[2]))
