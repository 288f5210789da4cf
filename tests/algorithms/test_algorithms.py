"""Tests for netcoll.algorithms, each over the in-memory transport and over
loopback TCP (the ``make_group`` fixture of conftest.py, ids ``memory``/``tcp``).

Gloo-style grid (``gloo/test/allreduce_test.cc``): world size x element count x
dtype x op x algorithm, against numpy references, plus pipelining with tiny
segments, lost peers, posted receive buffers and the registry.
"""
# Rank bodies are closures over loop variables, always awaited within the
# iteration that defines them:
# ruff: noqa: B023

from __future__ import annotations

import asyncio
import gc
import inspect
import math
from collections.abc import Awaitable, Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from netcoll.algorithms import ALGORITHMS, DEFAULT_SEGMENT_BYTES, direct, doubling, ring, tree
from netcoll.errors import CommunicatorClosed, MismatchError, PeerLost
from netcoll.mesh.channel import Channel
from netcoll.ops import ReduceOp, finalize, reduce_reference
from netcoll.selection import choose
from tests.support import ALL_LINKS, Group, MakeGroup

SIZES = [1, 2, 3, 4, 5, 8]
COUNTS = [0, 1, 7, 1000]
BIG = 2**20 + 3
KIB = 1024
MAIN_DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int64)]
EXTRA_DTYPES = [np.dtype(np.bool_), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
FLOAT_OPS = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG]
INT_OPS = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
BOOL_OPS = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
RTOL = {
    np.dtype(np.float16): 2e-2,
    np.dtype(ml_dtypes.bfloat16): 8e-2,
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float64): 1e-12,
    np.dtype(np.complex64): 1e-5,
}


# -- harness ------------------------------------------------------------------


@pytest.fixture(autouse=True)
async def no_lost_task_errors():
    """Fail on 'Task exception was never retrieved' and friends: algorithms
    must clean up the receives they posted, also when they fail."""
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield
    gc.collect()
    await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert not seen, [c.get("message") for c in seen]


def rng_for(*key: Any) -> np.random.Generator:
    return np.random.default_rng(abs(hash(key)) % (2**32))


def make_inputs(dt: np.dtype, op: ReduceOp, P: int, count: int, seed: Any = 0) -> list[np.ndarray]:
    rng = rng_for(str(dt), op.value, P, count, seed)
    if dt == np.bool_:
        return [rng.random(count) < 0.5 for _ in range(P)]
    if dt.kind in "iu":
        return [rng.integers(-50, 50, size=count).astype(dt) for _ in range(P)]
    # positive values near 1: no cancellation (tolerances stay meaningful), no overflow
    return [(0.5 + rng.random(count)).astype(dt) for _ in range(P)]


def ops_for(dt: np.dtype) -> list[ReduceOp]:
    if dt == np.bool_:
        return BOOL_OPS
    return INT_OPS if dt.kind in "iu" else FLOAT_OPS


def grid_ops(group: Group, dt: np.dtype, *salt: int) -> list[ReduceOp]:
    """The ops a grid test runs for ``dt``: all of them in memory; over TCP one,
    taken in turn by ``salt`` (the test's parameters), so the grid as a whole
    still runs every op over TCP. The reduction code is the same over both
    meshes; what TCP adds is delivery, which the op does not change."""
    ops = ops_for(dt)
    return ops if group.kind == "memory" else [ops[sum(salt) % len(ops)]]


def check_reduced(got: np.ndarray, op: ReduceOp, inputs: list[np.ndarray], what: str) -> None:
    """``got`` is an un-finalized reduction of ``inputs``."""
    got = got.copy()
    finalize(op, got, len(inputs))
    want = reduce_reference(op, inputs)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if got.dtype in RTOL and op not in (ReduceOp.MIN, ReduceOp.MAX):
        wide = np.complex128 if got.dtype.kind == "c" else np.float64
        np.testing.assert_allclose(got.astype(wide), want.astype(wide), rtol=RTOL[got.dtype], err_msg=what)
    else:
        assert got.tobytes() == want.tobytes(), what


async def check_all_reduce(
    group: Group, algo: str, dt: np.dtype, op: ReduceOp, count: int, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> None:
    P = group.size
    inputs = make_inputs(dt, op, P, count)
    fn = ALGORITHMS["all_reduce"][algo]

    async def body(ch: Channel) -> np.ndarray:
        buf = inputs[ch.rank].copy()
        await fn(ch, buf, op, segment_bytes=segment_bytes)
        return buf

    results = await group.run(body)
    what = f"all_reduce/{algo} P={P} n={count} {dt} {op.value} seg={segment_bytes}"
    assert len({r.tobytes() for r in results}) == 1, f"{what}: ranks differ bitwise"
    check_reduced(results[0], op, inputs, what)


# -- all_reduce ------------------------------------------------------------------


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("P", SIZES)
@pytest.mark.parametrize("algo", sorted(ALGORITHMS["all_reduce"]))
async def test_all_reduce_grid(make_group: MakeGroup, algo: str, P: int, count: int) -> None:
    group = await make_group(P)
    for i, dt in enumerate(MAIN_DTYPES):
        for op in grid_ops(group, dt, i, P, count):
            await check_all_reduce(group, algo, dt, op, count)


@pytest.mark.parametrize("P", [2, 3, 5, 8])
@pytest.mark.parametrize("algo", sorted(ALGORITHMS["all_reduce"]))
async def test_all_reduce_extra_dtypes(make_group: MakeGroup, algo: str, P: int) -> None:
    group = await make_group(P)
    for count in (1, 7, 1000):
        for i, dt in enumerate(EXTRA_DTYPES):
            for op in grid_ops(group, dt, i, P, count):
                await check_all_reduce(group, algo, dt, op, count)


@pytest.mark.parametrize("make_group", ALL_LINKS, indirect=True)  # big payloads: shm rings and folds too
@pytest.mark.parametrize(
    ("algo", "P", "dt", "op"),
    [
        ("ring", 5, np.dtype(np.float32), ReduceOp.SUM),
        ("ring", 8, np.dtype(np.int64), ReduceOp.BXOR),
        ("tree", 3, np.dtype(np.float64), ReduceOp.AVG),
        ("doubling", 3, np.dtype(np.float32), ReduceOp.MAX),
    ],
)
async def test_all_reduce_big(make_group: MakeGroup, algo: str, P: int, dt: np.dtype, op: ReduceOp) -> None:
    await check_all_reduce(await make_group(P), algo, dt, op, BIG)


@pytest.mark.parametrize("P", [2, 3, 5, 6, 8])
@pytest.mark.parametrize("algo", sorted(ALGORITHMS["all_reduce"]))
async def test_all_reduce_bit_identical_with_nans_and_signed_zeros(make_group: MakeGroup, algo: str, P: int) -> None:
    """Operand order decides which NaN payload survives and min/max of -0/+0:
    every rank must still end with the same bits."""
    group = await make_group(P)
    nan1 = np.array([0x7FC00001], dtype=np.uint32).view(np.float32)[0]
    nan2 = np.array([0xFFC00002], dtype=np.uint32).view(np.float32)[0]
    pool = np.array([-0.0, 0.0, nan1, nan2, 1.0, -1.0], dtype=np.float32)
    rng = rng_for("nan", algo, P)
    inputs = [pool[rng.integers(0, len(pool), size=257)] for _ in range(P)]
    for op in (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX):

        async def body(ch: Channel) -> bytes:
            buf = inputs[ch.rank].copy()
            await ALGORITHMS["all_reduce"][algo](ch, buf, op, segment_bytes=128)
            return buf.tobytes()

        assert len(set(await group.run(body))) == 1, (algo, P, op)


async def test_all_reduce_keeps_shape_and_works_in_place(make_group: MakeGroup) -> None:
    group = await make_group(3)
    inputs = [np.arange(24, dtype=np.int32).reshape(2, 3, 4) * (r + 1) for r in range(3)]
    for algo, fn in ALGORITHMS["all_reduce"].items():

        async def body(ch: Channel) -> np.ndarray:
            buf = inputs[ch.rank].copy()
            await fn(ch, buf, "sum")
            return buf

        for got in await group.run(body):
            assert got.shape == (2, 3, 4)
            np.testing.assert_array_equal(got, sum(inputs), err_msg=algo)


# -- reduce / reduce_scatter ----------------------------------------------------------


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("P", SIZES)
async def test_reduce_tree(make_group: MakeGroup, P: int, count: int) -> None:
    group = await make_group(P)
    for dt, op in [
        (np.dtype(np.float32), ReduceOp.SUM),
        (np.dtype(np.float64), ReduceOp.AVG),
        (np.dtype(np.int32), ReduceOp.BXOR),
        (np.dtype(np.int64), ReduceOp.MIN),
        (np.dtype(np.int64), ReduceOp.PROD),
    ]:
        inputs = make_inputs(dt, op, P, count)
        for root in range(P):

            async def body(ch: Channel) -> np.ndarray:
                buf = inputs[ch.rank].copy()
                await tree.reduce(ch, buf, op, root)
                return buf

            results = await group.run(body)
            check_reduced(results[root], op, inputs, f"reduce P={P} n={count} {dt} {op} root={root}")


@pytest.mark.parametrize("P", [2, 3, 5, 8])
async def test_tree_reads_src_with_the_same_bits_as_in_place(make_group: MakeGroup, P: int) -> None:
    """all_reduce and reduce by tree with ``src`` (the caller's input, read only)
    and a result buffer that starts as garbage: the very bits of the in-place
    form (order-sensitive NaN payloads and signed zeros, several segments per
    message), on every rank and at roots 0, 1 and the last; ``src`` is left as it was."""
    nan1 = np.array([0x7FC00001], dtype=np.uint32).view(np.float32)[0]
    nan2 = np.array([0xFFC00002], dtype=np.uint32).view(np.float32)[0]
    pool = np.array([-0.0, 0.0, nan1, nan2, 1.0, -1.0, 3.0e38], dtype=np.float32)
    rng = rng_for("tree-src", P)
    xs = [pool[rng.integers(0, len(pool), size=301)] for _ in range(P)]
    keep = [x.tobytes() for x in xs]
    for op in (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX):
        for root in sorted({0, 1, P - 1}):

            async def body(ch: Channel) -> tuple[bytes, bytes]:
                plain = xs[ch.rank].copy()
                await tree.reduce(ch, plain, op, root, segment_bytes=256)
                out = np.full(301, 7.0, np.float32)
                await tree.reduce(ch, out, op, root, segment_bytes=256, src=xs[ch.rank])
                return plain.tobytes(), out.tobytes()

            got = await (await make_group(P)).run(body)
            assert got[root][0] == got[root][1], (op, root)

        async def all_reduce(ch: Channel) -> tuple[bytes, bytes]:
            plain = xs[ch.rank].copy()
            await tree.all_reduce(ch, plain, op, segment_bytes=256)
            out = np.full(301, 7.0, np.float32)
            await tree.all_reduce(ch, out, op, segment_bytes=256, src=xs[ch.rank])
            return plain.tobytes(), out.tobytes()

        got = await (await make_group(P)).run(all_reduce)
        assert {g for pair in got for g in pair} == {got[0][0]}, op
    assert [x.tobytes() for x in xs] == keep


@pytest.mark.parametrize("P", [2, 5, 8])
async def test_tree_reduce_needs_no_buffer_off_the_root(make_group: MakeGroup, P: int) -> None:
    """Off the root, ``buf=None`` with ``src``: an inner rank makes its own
    accumulator, a leaf needs none; the root gets the bits of the in-place form."""
    xs = [np.arange(1001, dtype=np.float32) * (k + 1) / 7 for k in range(P)]
    for root in sorted({0, P - 1}):

        async def body(ch: Channel) -> tuple[bytes, bytes]:
            plain = xs[ch.rank].copy()
            await tree.reduce(ch, plain, "sum", root, segment_bytes=512)
            out = np.empty(1001, np.float32) if ch.rank == root else None
            await tree.reduce(ch, out, "sum", root, segment_bytes=512, src=xs[ch.rank])
            return plain.tobytes(), b"" if out is None else out.tobytes()

        got = await (await make_group(P)).run(body)
        assert got[root][0] == got[root][1], root

    async def bad(ch: Channel) -> str:
        with pytest.raises(ValueError, match="the root passes buf") as info:
            await tree.reduce(ch, None, "sum", 0, src=None if ch.rank else xs[0])
        return str(info.value)

    assert len(await (await make_group(P)).run(bad)) == P


async def test_tree_src_errors_and_a_group_of_one(make_group: MakeGroup) -> None:
    group = await make_group(2)

    async def bad(ch: Channel) -> list[str]:
        errors = []
        buf = np.zeros(4, np.float32)
        for src in (np.zeros(5, np.float32), np.zeros(4, np.float64), buf):  # size, dtype, overlap
            for call in (
                lambda: tree.all_reduce(ch, buf, "sum", src=src),
                lambda: tree.reduce(ch, buf, "sum", 0, src=src),
            ):
                with pytest.raises(ValueError, match="src must match buf"):
                    await call()
                errors.append("ok")
        return errors

    assert all(len(e) == 6 for e in await group.run(bad))

    async def alone(ch: Channel) -> list[np.ndarray]:
        a, b = np.zeros(3), np.zeros(3)
        await tree.all_reduce(ch, a, "sum", src=np.arange(3.0))
        await tree.reduce(ch, b, "sum", 0, src=np.arange(3.0))
        return [a, b]

    for got in (await (await make_group(1)).run(alone))[0]:
        np.testing.assert_array_equal(got, [0.0, 1.0, 2.0])


@pytest.mark.parametrize("algo", sorted(ALGORITHMS["reduce_scatter"]))
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("P", SIZES)
async def test_reduce_scatter(make_group: MakeGroup, P: int, count: int, algo: str) -> None:
    """Every reduce_scatter algorithm, every group size (powers of two and not,
    so halving's extra ranks too), counts around the segment sizes."""
    fn = ALGORITHMS["reduce_scatter"][algo]
    group = await make_group(P)
    for i, dt in enumerate(MAIN_DTYPES):
        for op in grid_ops(group, dt, i, P, count):
            inputs = make_inputs(dt, op, P, P * count)

            async def body(ch: Channel) -> np.ndarray:
                buf = inputs[ch.rank].copy()
                out = np.empty(count, dtype=dt)
                await fn(ch, buf, op, out)
                assert buf.tobytes() == inputs[ch.rank].tobytes(), "reduce_scatter modified its input"
                return out

            results = await group.run(body)
            for r, got in enumerate(results):
                check_reduced(
                    got,
                    op,
                    [x[r * count : (r + 1) * count] for x in inputs],
                    f"reduce_scatter/{algo} P={P} n={count} {dt} {op} rank {r}",
                )


@pytest.mark.parametrize("P", [3, 5])
async def test_reduce_and_reduce_scatter_extra_dtypes(make_group: MakeGroup, P: int) -> None:
    group = await make_group(P)
    count = 7
    for dt in [*EXTRA_DTYPES, np.dtype(np.uint8), np.dtype(np.complex64)]:
        for op in ops_for(dt) if dt.kind != "c" else [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.AVG]:
            inputs = make_inputs(dt, op, P, P * count)

            async def red(ch: Channel) -> np.ndarray:
                buf = inputs[ch.rank].copy()
                await tree.reduce(ch, buf, op, 1)
                return buf

            check_reduced((await group.run(red))[1], op, inputs, f"reduce {dt} {op}")

            for fn in ALGORITHMS["reduce_scatter"].values():

                async def rs(ch: Channel, fn: Any = fn) -> np.ndarray:
                    out = np.empty(count, dtype=dt)
                    await fn(ch, inputs[ch.rank], op, out, segment_bytes=8)
                    return out

                for r, got in enumerate(await group.run(rs)):
                    check_reduced(got, op, [x[r * count : (r + 1) * count] for x in inputs], f"rs {fn} {dt} {op}")


@pytest.mark.parametrize("dt", EXTRA_DTYPES + MAIN_DTYPES, ids=str)
async def test_data_movement_dtypes(make_group: MakeGroup, dt: np.dtype) -> None:
    """Block collectives move any dtype's bytes (views as uint8 inside)."""
    P, count = 3, 7
    group = await make_group(P)
    parts = [make_inputs(dt, ReduceOp.MAX, P, count, seed=r)[0] for r in range(P)]
    whole = np.stack(parts)
    for algo, fn in ALGORITHMS["all_gather"].items():

        async def ag(ch: Channel) -> np.ndarray:
            buf = np.zeros((P, count), dt)
            buf[ch.rank] = parts[ch.rank]
            await fn(ch, buf, segment_bytes=3)
            return buf

        assert all(g.tobytes() == whole.tobytes() for g in await group.run(ag)), algo
    for algo, fn in ALGORITHMS["broadcast"].items():

        async def bc(ch: Channel) -> np.ndarray:
            buf = parts[2] if ch.rank == 2 else np.zeros(count, dt)
            return (await fn(ch, buf, 2, segment_bytes=5))[0]

        assert all(g.tobytes() == parts[2].tobytes() for g in await group.run(bc)), algo

    for algo, fn in ALGORITHMS["all_to_all"].items():

        async def a2a(ch: Channel, fn: Any = fn) -> np.ndarray:
            recv = np.zeros((P, count), dt)
            await fn(ch, whole, recv, segment_bytes=3)
            return recv

        got = await group.run(a2a)
        assert all(g.tobytes() == np.stack([parts[r]] * P).tobytes() for r, g in enumerate(got)), algo


@pytest.mark.parametrize("make_group", ALL_LINKS, indirect=True)  # big payloads: shm rings and folds too
@pytest.mark.parametrize(
    "name",
    [
        "broadcast/tree",
        "broadcast/ring",
        "reduce/tree",
        "all_gather/ring",
        "all_gather/doubling",
        "reduce_scatter/ring",
        "reduce_scatter/halving",
        "all_to_all/pairwise",
        "all_to_all/linear",
        "gather/direct",
        "scatter/direct",
    ],
)
async def test_big_buffers(make_group: MakeGroup, name: str) -> None:
    """2**20+3 elements (about 4 MiB), default 1 MiB segments."""
    P = 3
    group = await make_group(P)
    coll, algo = name.split("/")
    fn = ALGORITHMS[coll][algo]
    x = [np.arange(BIG, dtype=np.float32) + r for r in range(P)]
    if coll == "broadcast":

        async def body(ch: Channel) -> Any:
            return (await fn(ch, x[0] if ch.rank == 0 else None, 0))[0]

        assert all(g.tobytes() == x[0].tobytes() for g in await group.run(body))
    elif coll == "reduce":

        async def body(ch: Channel) -> Any:
            buf = x[ch.rank].copy()
            await fn(ch, buf, "max", 0)
            return buf

        assert (await group.run(body))[0].tobytes() == x[2].tobytes()
    elif coll == "all_gather":

        async def body(ch: Channel) -> Any:
            buf = np.zeros((P, BIG), np.float32)
            buf[ch.rank] = x[ch.rank]
            await fn(ch, buf)
            return buf

        assert all(g.tobytes() == np.stack(x).tobytes() for g in await group.run(body))
    elif coll == "reduce_scatter":

        async def body(ch: Channel) -> Any:
            out = np.empty(BIG // P, np.float32)
            await fn(ch, x[ch.rank][: BIG // P * P], "min", out)
            return out

        for r, got in enumerate(await group.run(body)):
            assert got.tobytes() == x[0][r * (BIG // P) : (r + 1) * (BIG // P)].tobytes()
    elif coll == "all_to_all":

        async def body(ch: Channel) -> Any:
            recv = np.empty(BIG // P * P, np.float32)
            await fn(ch, x[ch.rank][: BIG // P * P], recv)
            return recv.reshape(P, -1)

        for r, got in enumerate(await group.run(body)):
            assert (
                got.tobytes()
                == np.stack([x[j].reshape(-1)[: BIG // P * P].reshape(P, -1)[r] for j in range(P)]).tobytes()
            )
    elif coll == "gather":

        async def body(ch: Channel) -> Any:
            recv = np.empty((P, BIG), np.float32) if ch.rank == 1 else None
            await fn(ch, x[ch.rank], recv, 1)
            return recv

        assert (await group.run(body))[1].tobytes() == np.stack(x).tobytes()
    else:

        async def body(ch: Channel) -> Any:
            recv = np.empty(BIG, np.float32)
            await fn(ch, np.stack(x) if ch.rank == 1 else None, recv, 1)
            return recv

        assert all(g.tobytes() == x[r].tobytes() for r, g in enumerate(await group.run(body)))


# -- data movement ------------------------------------------------------------------------


def blocks(P: int, count: int, seed: Any = 0) -> list[np.ndarray]:
    rng = rng_for("blocks", P, count, seed)
    return [rng.standard_normal(count).astype(np.float32) for _ in range(P)]


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("P", SIZES)
@pytest.mark.parametrize("algo", sorted(ALGORITHMS["broadcast"]))
async def test_broadcast(make_group: MakeGroup, algo: str, P: int, count: int) -> None:
    group = await make_group(P)
    fn = ALGORITHMS["broadcast"][algo]
    for root in range(P):
        data = blocks(1, count, root)[0]
        meta = {"dtype": "float32", "shape": [count]}
        for preallocated in (False, True):

            async def body(ch: Channel) -> tuple[np.ndarray, dict[str, Any]]:
                if ch.rank == root:
                    return await fn(ch, data, root, dict(meta))
                buf = np.zeros(count, np.float32) if preallocated else None
                got, m = await fn(ch, buf, root)
                if preallocated:
                    assert got is buf
                return got, m

            for r, (got, m) in enumerate(await group.run(body)):
                assert m == dict(meta, nbytes=data.nbytes), (r, m)
                if r != root and not preallocated:
                    assert got.dtype == np.uint8
                assert got.tobytes() == data.tobytes(), (algo, P, count, root, r)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS["broadcast"]))
@pytest.mark.parametrize(("root_bytes", "mine", "segment_bytes"), [(10, 12, 1 << 20), (10, 12, 4), (12, 10, 4)])
async def test_broadcast_size_mismatch(
    make_group: MakeGroup, algo: str, root_bytes: int, mine: int, segment_bytes: int
) -> None:
    group = await make_group(2)
    fn = ALGORITHMS["broadcast"][algo]

    async def body(ch: Channel) -> Any:
        if ch.rank == 0:
            return await fn(ch, np.zeros(root_bytes, np.uint8), 0, segment_bytes=segment_bytes)
        with pytest.raises(MismatchError):
            await fn(ch, np.zeros(mine, np.uint8), 0, segment_bytes=segment_bytes)
        return None

    await group.run(body, timeout=5)  # a few bytes: a mismatch must fail at once, not hang


async def test_broadcast_root_meta_nbytes_checked(make_group: MakeGroup) -> None:
    group = await make_group(1)
    for fn in ALGORITHMS["broadcast"].values():

        async def body(ch: Channel) -> Any:
            with pytest.raises(ValueError):
                await fn(ch, np.zeros(4, np.uint8), 0, {"nbytes": 5})
            return await fn(ch, np.zeros(4, np.uint8), 0, {"nbytes": 4})

        ((_, meta),) = await group.run(body)
        assert meta == {"nbytes": 4}


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("P", SIZES)
@pytest.mark.parametrize("algo", sorted(ALGORITHMS["all_gather"]))
async def test_all_gather(make_group: MakeGroup, algo: str, P: int, count: int) -> None:
    group = await make_group(P)
    parts = blocks(P, count)

    async def body(ch: Channel) -> np.ndarray:
        buf = np.full((P, count), np.nan, dtype=np.float32)
        buf[ch.rank] = parts[ch.rank]
        await ALGORITHMS["all_gather"][algo](ch, buf)
        return buf

    for got in await group.run(body):
        assert got.tobytes() == np.stack(parts).tobytes(), (algo, P, count)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS["all_to_all"]))
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("P", SIZES)
async def test_all_to_all(make_group: MakeGroup, P: int, count: int, algo: str) -> None:
    group = await make_group(P)
    sends = [np.stack(blocks(P, count, seed=r)) for r in range(P)]

    async def body(ch: Channel) -> np.ndarray:
        recv = np.full((P, count), np.nan, dtype=np.float32)
        await ALGORITHMS["all_to_all"][algo](ch, sends[ch.rank].copy(), recv)
        return recv

    for r, got in enumerate(await group.run(body)):
        assert got.tobytes() == np.stack([sends[j][r] for j in range(P)]).tobytes(), (P, count, r)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS["all_to_all"]))
@pytest.mark.parametrize("P", [1, 3, 4])
async def test_all_to_all_without_own_leaves_this_ranks_block_as_it_was(
    make_group: MakeGroup, P: int, algo: str
) -> None:
    """``own=False`` (the compressed exchange, which never reads its own block there): the
    other blocks arrive as always, this rank's block of ``recv`` is not written."""
    group = await make_group(P)
    count = 257
    sends = [np.stack(blocks(P, count, seed=r)) for r in range(P)]

    async def body(ch: Channel) -> np.ndarray:
        recv = np.full((P, count), -7.0, dtype=np.float32)
        await ALGORITHMS["all_to_all"][algo](ch, sends[ch.rank].copy(), recv, segment_bytes=400, own=False)
        return recv

    for r, got in enumerate(await group.run(body)):
        want = np.stack([sends[j][r] for j in range(P)])
        want[r] = -7.0
        assert got.tobytes() == want.tobytes(), (algo, P, r)


@pytest.mark.parametrize("P", [2, 3, 4, 5])
async def test_all_to_all_linear_and_pairwise_send_the_same_messages(make_group: MakeGroup, P: int) -> None:
    """The two all_to_alls differ only in when they send: ranks running different ones
    still exchange the right blocks (pairwise sends at once where every link lends, a
    decision each rank makes alone), with two segments per block."""
    group = await make_group(P)
    count = 300
    sends = [np.stack(blocks(P, count, seed=r)) for r in range(P)]

    async def body(ch: Channel) -> np.ndarray:
        recv = np.full((P, count), np.nan, dtype=np.float32)
        algo = ("linear", "pairwise")[ch.rank % 2]
        await ALGORITHMS["all_to_all"][algo](ch, sends[ch.rank].copy(), recv, segment_bytes=count * 2)
        return recv

    for r, got in enumerate(await group.run(body)):
        assert got.tobytes() == np.stack([sends[j][r] for j in range(P)]).tobytes(), (P, r)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("P", SIZES)
async def test_gather_and_scatter(make_group: MakeGroup, P: int, count: int) -> None:
    group = await make_group(P)
    parts = blocks(P, count)
    for root in range(P):

        async def gather_body(ch: Channel) -> np.ndarray | None:
            recv = np.full((P, count), np.nan, np.float32) if ch.rank == root else None
            await ALGORITHMS["gather"]["direct"](ch, parts[ch.rank], recv, root)
            return recv

        got = (await group.run(gather_body))[root]
        assert got.tobytes() == np.stack(parts).tobytes(), ("gather", P, count, root)

        async def scatter_body(ch: Channel) -> np.ndarray:
            recv = np.full(count, np.nan, np.float32)
            await ALGORITHMS["scatter"]["direct"](ch, np.stack(parts) if ch.rank == root else None, recv, root)
            return recv

        for r, got in enumerate(await group.run(scatter_body)):
            assert got.tobytes() == parts[r].tobytes(), ("scatter", P, count, root, r)


@pytest.mark.parametrize("P", SIZES)
async def test_barrier(make_group: MakeGroup, P: int) -> None:
    """Nobody leaves before the last one (rank P-1, late) has entered."""
    group = await make_group(P)
    log: list[tuple[str, int]] = []

    async def body(ch: Channel) -> None:
        if ch.rank == P - 1:
            await asyncio.sleep(0.02)
        log.append(("enter", ch.rank))
        await ALGORITHMS["barrier"]["doubling"](ch)
        log.append(("exit", ch.rank))

    frames = group.count_frames()
    await group.run(body)
    kinds = [k for k, _ in log]
    assert kinds == ["enter"] * P + ["exit"] * P
    rounds = math.ceil(math.log2(P)) if P > 1 else 0
    assert frames == [rounds] * P


@pytest.mark.parametrize("count", [0, 1, 1000])
async def test_send_recv_message(make_group: MakeGroup, count: int) -> None:
    group = await make_group(3)
    data = blocks(1, count)[0]
    for segment_bytes in (1, 64, DEFAULT_SEGMENT_BYTES):
        for preallocated in (False, True):

            async def body(ch: Channel) -> Any:
                if ch.rank == 2:
                    return await direct.send_message(ch, 0, data, meta={"tag": 7}, step=3, segment_bytes=segment_bytes)
                if ch.rank == 0:
                    out = np.empty(count, np.float32) if preallocated else None
                    return await direct.recv_message(ch, 2, out, step=3, segment_bytes=segment_bytes)
                return None

            sent, _, (got, meta) = (await group.run(body))[::-1]
            assert meta == sent == {"tag": 7, "nbytes": data.nbytes}
            assert got.tobytes() == data.tobytes()


# -- pipelining, failures, posted buffers ------------------------------------------------------


@pytest.mark.parametrize("P", [3, 4, 5])
async def test_deep_pipelining_small_segments(make_group: MakeGroup, P: int) -> None:
    """64-byte segments: dozens of segments per chunk, all families."""
    group = await make_group(P)
    count, seg = 1000, 64
    for algo in ALGORITHMS["all_reduce"]:
        for dt, op in [
            (np.dtype(np.float32), ReduceOp.SUM),
            (np.dtype(np.int64), ReduceOp.BXOR),
            (np.dtype(np.float64), ReduceOp.MIN),
        ]:
            await check_all_reduce(group, algo, dt, op, count, segment_bytes=seg)
            await check_all_reduce(group, algo, dt, op, 7, segment_bytes=1)
    parts = blocks(P, count)
    whole = np.stack(parts)
    for algo, fn in ALGORITHMS["all_gather"].items():

        async def ag(ch: Channel) -> np.ndarray:
            buf = np.zeros((P, count), np.float32)
            buf[ch.rank] = parts[ch.rank]
            await fn(ch, buf, segment_bytes=seg)
            return buf

        assert all(g.tobytes() == whole.tobytes() for g in await group.run(ag)), algo
    for algo, fn in ALGORITHMS["broadcast"].items():

        async def bc(ch: Channel) -> np.ndarray:
            return (await fn(ch, parts[1] if ch.rank == 1 else None, 1, segment_bytes=seg))[0]

        assert all(g.tobytes() == parts[1].tobytes() for g in await group.run(bc)), algo

    async def red(ch: Channel) -> np.ndarray:
        buf = parts[ch.rank].copy()
        await tree.reduce(ch, buf, "max", 2, segment_bytes=seg)
        return buf

    assert (await group.run(red))[2].tobytes() == np.max(whole, axis=0).tobytes()

    async def rs(ch: Channel) -> np.ndarray:
        out = np.empty(count // 10, np.float32)
        await ring.reduce_scatter(
            ch, whole[:, : count // 10 * P].reshape(P, P, -1)[ch.rank].copy(), "max", out, segment_bytes=seg
        )
        return out

    expect = np.max(whole[:, : count // 10 * P].reshape(P, P, -1), axis=0)
    for r, got in enumerate(await group.run(rs)):
        assert got.tobytes() == expect[r].tobytes()

    for fn in ALGORITHMS["all_to_all"].values():

        async def a2a(ch: Channel, fn: Any = fn) -> np.ndarray:
            recv = np.empty((P, count), np.float32)
            await fn(ch, np.stack(blocks(P, count, ch.rank)), recv, segment_bytes=seg)
            return recv

        for r, got in enumerate(await group.run(a2a)):
            assert got.tobytes() == np.stack([blocks(P, count, j)[r] for j in range(P)]).tobytes()

    async def ga(ch: Channel) -> np.ndarray | None:
        recv = np.empty((P, count), np.float32) if ch.rank == 0 else None
        await direct.gather(ch, parts[ch.rank], recv, 0, segment_bytes=seg)
        return recv

    assert (await group.run(ga))[0].tobytes() == whole.tobytes()

    async def sc(ch: Channel) -> np.ndarray:
        recv = np.empty(count, np.float32)
        await direct.scatter(ch, whole if ch.rank == 0 else None, recv, 0, segment_bytes=seg)
        return recv

    assert all(g.tobytes() == parts[r].tobytes() for r, g in enumerate(await group.run(sc)))


def _collective_calls(P: int, count: int) -> dict[str, Callable[[Channel], Awaitable[Any]]]:
    """One call per (collective, algorithm) for every rank, 4 bytes per element."""
    calls: dict[str, Callable[[Channel], Awaitable[Any]]] = {}
    for algo, fn in ALGORITHMS["all_reduce"].items():
        calls[f"all_reduce/{algo}"] = lambda ch, fn=fn: fn(ch, np.ones(count, np.float32), "sum", segment_bytes=256)
    for algo, fn in ALGORITHMS["broadcast"].items():
        calls[f"broadcast/{algo}"] = lambda ch, fn=fn: fn(ch, np.ones(count, np.float32), 0, segment_bytes=256)
    calls["reduce/tree"] = lambda ch: tree.reduce(ch, np.ones(count, np.float32), "sum", 0, segment_bytes=256)
    calls["reduce/ring"] = lambda ch: ring.reduce(ch, np.ones(count, np.float32), "sum", 0, segment_bytes=256)
    for algo, fn in ALGORITHMS["all_gather"].items():
        calls[f"all_gather/{algo}"] = lambda ch, fn=fn: fn(ch, np.ones(P * count, np.float32), segment_bytes=256)
    for algo, fn in ALGORITHMS["reduce_scatter"].items():
        calls[f"reduce_scatter/{algo}"] = lambda ch, fn=fn: fn(
            ch, np.ones(P * count, np.float32), "sum", np.empty(count, np.float32), segment_bytes=256
        )
    for algo, fn in ALGORITHMS["all_to_all"].items():
        calls[f"all_to_all/{algo}"] = lambda ch, fn=fn: fn(
            ch, np.ones(P * count, np.float32), np.empty(P * count, np.float32), segment_bytes=256
        )
    calls["gather/direct"] = lambda ch: direct.gather(
        ch, np.ones(count, np.float32), np.empty(P * count, np.float32) if ch.rank == 0 else None, 0, segment_bytes=256
    )
    calls["scatter/direct"] = lambda ch: direct.scatter(
        ch, np.ones(P * count, np.float32) if ch.rank == 0 else None, np.empty(count, np.float32), 0, segment_bytes=256
    )
    calls["barrier/doubling"] = lambda ch: doubling.barrier(ch)
    return calls


def test_every_algorithm_is_exercised_by_the_failure_tests() -> None:
    names = set(_collective_calls(2, 1))
    assert names == {f"{c}/{a}" for c, algos in ALGORITHMS.items() for a in algos}


@pytest.mark.parametrize("name", sorted(_collective_calls(4, 1)))
async def test_killed_rank_raises_peer_lost(make_group: MakeGroup, name: str) -> None:
    """One rank (the root 0, or 3) never shows up and then dies: every other
    rank either finishes (it did not need that rank) or raises PeerLost
    naming it; none hangs."""
    P, count = 4, 5000
    call = _collective_calls(P, count)[name]
    lost = 0
    for missing in (0, 3):
        group = await make_group(P, killable=True)

        async def body(ch: Channel) -> Any:
            try:
                await call(ch)
            except PeerLost as exc:
                assert missing in exc.ranks
                return "lost"
            return "done"

        async def killer() -> None:
            await asyncio.sleep(0.02)
            group.kill(missing)

        async with asyncio.timeout(5):
            outcomes, _ = await asyncio.gather(group.run(body, ranks=[r for r in range(P) if r != missing]), killer())
        lost += outcomes.count("lost")
    assert lost, f"{name}: no rank noticed the lost peer"


async def test_killed_rank_mid_stream(make_group: MakeGroup) -> None:
    """A rank dies part-way through a deeply pipelined ring: survivors fail
    with PeerLost naming it, none waits for a deadline."""
    P = 4
    group = await make_group(P, killable=True)
    progressed, killed = asyncio.Event(), asyncio.Event()
    t3 = group.meshes[3]
    original = t3.send

    async def send_then_stall(peer: int, kind: Any, header: dict[str, Any], payload: Any = None) -> None:
        if header.get("s", 0) >= 2:  # rank 3 stalls after its first two ring steps, then dies
            progressed.set()
            await killed.wait()
        await original(peer, kind, header, payload)

    t3.send = send_then_stall  # type: ignore[method-assign]
    t3.send_nowait = lambda *_: False  # type: ignore[method-assign]  # every send through the stall

    async def body(ch: Channel) -> Any:
        try:
            await ring.all_reduce(ch, np.ones(20000, np.float32), "sum", segment_bytes=512)
        except PeerLost as exc:
            return exc.ranks
        except CommunicatorClosed:
            return "closed"
        return "done"

    async def killer() -> None:
        await progressed.wait()
        group.kill(3)
        killed.set()

    async with asyncio.timeout(5):
        outcomes, _ = await asyncio.gather(group.run(body), killer())
    assert outcomes[:3] == [(3,)] * 3
    assert outcomes[3] != "done"  # the dead rank's own outcome: it lost every link (or was closed)


def _count_sinks(group: Group) -> dict[str, int]:
    """Count DATA payloads written straight into a posted buffer ('hit') vs
    buffered and copied later ('miss')."""
    stats = {"hit": 0, "miss": 0}
    for t in group.meshes:

        def sink(src: int, header: dict[str, Any], nbytes: int, orig: Any = t.mailbox.sink) -> Any:
            out = orig(src, header, nbytes)
            stats["hit" if out is not None else "miss"] += 1
            return out

        t.mailbox.sink = sink  # type: ignore[method-assign]
    return stats


@pytest.mark.parametrize("make_group", ALL_LINKS, indirect=True)  # big payloads: shm rings and folds too
@pytest.mark.parametrize(
    ("name", "min_hit_ratio"),
    [
        # (in-memory, TCP). The in-memory transport delivers synchronously and ranks run
        # in bursts, so a ring neighbour can run far ahead of the posted window. Over TCP
        # a sender's eager segments may arrive before the receiver has posted that far
        # (tree and direct roots stream to receivers that post a window at a time).
        ("all_reduce/ring", (0.2, 0.8)),
        ("all_gather/ring", (0.2, 0.8)),
        ("reduce_scatter/ring", (0.2, 0.8)),
        ("all_reduce/doubling", (0.5, 0.6)),
        ("all_gather/doubling", (0.8, 0.8)),
        ("all_reduce/tree", (0.9, 0.5)),
        ("broadcast/tree", (0.9, 0.3)),
        ("broadcast/ring", (0.9, 0.3)),
        ("reduce/tree", (0.9, 0.8)),
        ("all_to_all/pairwise", (0.9, 0.8)),
        ("all_to_all/linear", (0.9, 0.8)),
        ("gather/direct", (0.9, 0.3)),
        ("scatter/direct", (0.9, 0.3)),
    ],
)
async def test_posted_buffers_and_message_counts(
    make_group: MakeGroup, name: str, min_hit_ratio: tuple[float, float]
) -> None:
    """Receives are posted ahead so payloads land in place, and segmenting
    sends exactly the expected number of messages."""
    P, count = 5, 10000
    group = await make_group(P)
    stats = _count_sinks(group)
    frames = group.count_frames()
    await group.run(_collective_calls(P, count)[name])
    total = stats["hit"] + stats["miss"]
    assert total == sum(frames)
    assert stats["hit"] >= min_hit_ratio[group.kind != "memory"] * total, (name, stats)
    if name == "all_reduce/ring":
        S = math.ceil(count // P * 4 / 256)
        assert frames == [2 * (P - 1) * S] * P
    if name == "broadcast/ring":
        S = math.ceil(count * 4 / 256)
        assert frames == [S] * (P - 1) + [0]
    if name == "broadcast/tree":  # root 0 of 5: children 4, 2, 1; rank 2 forwards to 3
        S = math.ceil(count * 4 / 256)
        assert frames == [3 * S, 0, S, 0, 0]


async def test_ring_all_reduce_lands_in_place_when_receivers_are_ready(make_group: MakeGroup) -> None:
    """With the receiver already waiting, every ring segment is received in
    place (into scratch or buf), never buffered and copied."""
    group = await make_group(2)
    stats = _count_sinks(group)

    async def body(ch: Channel) -> np.ndarray:
        buf = np.full(4096, ch.rank + 1, np.int32)
        if ch.rank == 0:
            await asyncio.sleep(0.01)  # rank 1 posts its first receives meanwhile
        await ring.all_reduce(ch, buf, "sum", segment_bytes=4096)
        return buf

    for got in await group.run(body):
        assert (got == 3).all()
    assert stats["hit"] >= 2, stats


@pytest.mark.parametrize("folds_from", [16 * KIB, None])
@pytest.mark.parametrize("algo", ["doubling", "halving"])
async def test_links_fold_only_into_buffers_not_being_sent(
    make_group: MakeGroup, algo: str, folds_from: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receive is posted with a fold (a link may reduce the payload into ``out``
    as it arrives) only where ``out`` is not also being sent: doubling's lower
    rank accumulates into the very buffer it sends, so a fold there would change
    bytes the partner has not got yet; its higher rank folds into its receive
    buffer, and halving into the half it keeps. None for payloads the link says
    it would not fold (``Channel.folds``: here a link folding from 16 KiB, and
    one that never folds, as TCP and in-memory links)."""
    posted: list[tuple[int, int, bool]] = []
    post = Channel.post
    monkeypatch.setattr(Channel, "folds", lambda self, peer, n: folds_from is not None and n >= folds_from)

    def recording(self: Channel, peer: int, **kw: Any) -> Any:
        out = kw.get("out")
        posted.append((self.rank, 0 if out is None else memoryview(out).nbytes, kw.get("fold") is not None))
        return post(self, peer, **kw)

    monkeypatch.setattr(Channel, "post", recording)
    group = await make_group(2)
    fn = ALGORITHMS["all_reduce"][algo]
    for count in (4, 64 * 1024):

        async def body(ch: Channel) -> np.ndarray:
            buf = np.full(count, ch.rank + 1, np.float32)
            await fn(ch, buf, "sum", segment_bytes=DEFAULT_SEGMENT_BYTES)
            return buf

        for got in await group.run(body):
            assert (got == 3).all()
    big = folds_from is not None  # whether the link folds the 64 Ki-element payloads
    if algo == "doubling":  # one exchange of the whole buffer
        assert set(posted) == {(0, 16, False), (1, 16, False), (0, 256 * KIB, False), (1, 256 * KIB, big)}
    else:  # a reduce-scatter round (folding both halves kept), then an all-gather round
        half = 128 * KIB
        assert set(posted) == {(r, 8, False) for r in (0, 1)} | {(r, half, f) for r in (0, 1) for f in {big, False}}


# -- registry ---------------------------------------------------------------------------------

SIGNATURES = {
    "all_reduce": ["ch", "buf", "op"],
    "broadcast": ["ch", "buf", "root", "meta"],
    "reduce": ["ch", "buf", "op", "root"],
    "all_gather": ["ch", "buf"],
    "reduce_scatter": ["ch", "buf", "op", "out"],
    "all_to_all": ["ch", "send", "recv"],
    "gather": ["ch", "send", "recv", "root"],
    "scatter": ["ch", "send", "recv", "root"],
    "barrier": ["ch"],
}


def test_registry_signatures() -> None:
    assert set(ALGORITHMS) == set(SIGNATURES)
    for coll, algos in ALGORITHMS.items():
        assert algos
        for name, fn in algos.items():
            assert inspect.iscoroutinefunction(fn), (coll, name)
            params = inspect.signature(fn).parameters
            positional = [p for p, v in params.items() if v.kind is not inspect.Parameter.KEYWORD_ONLY]
            assert positional == SIGNATURES[coll], (coll, name, positional)
            seg = params["segment_bytes"]
            assert seg.kind is inspect.Parameter.KEYWORD_ONLY and seg.default == DEFAULT_SEGMENT_BYTES
    assert DEFAULT_SEGMENT_BYTES == 4 << 20


def test_choose() -> None:
    for coll in ALGORITHMS:
        for nbytes in (0, 1, 1 << 10, 1 << 16, 1 << 20, 1 << 26):
            for P in (1, 2, 3, 8, 64):
                assert choose(coll, nbytes, P) in ALGORITHMS[coll]
    assert choose("all_reduce", 1024, 8) == "doubling"
    assert choose("all_reduce", 64 << 10, 4) == "doubling" and choose("all_reduce", 128 << 10, 4) == "tree"
    assert choose("all_reduce", 64 << 10, 8) == "tree"  # from 5 ranks, log2 P rounds of the whole buffer
    assert choose("all_reduce", 1 << 20, 4) == "tree" and choose("all_reduce", 1 << 20, 2) == "ring"
    assert choose("all_reduce", 1 << 24, 8) == "ring"
    assert choose("all_reduce", 4 << 20, 4) == "tree" and choose("all_reduce", 8 << 20, 3) == "ring"
    assert choose("all_reduce", (8 << 20) - 1, 5) == "tree" and choose("all_reduce", 8 << 20, 8) == "ring"
    assert choose("broadcast", 1024, 8) == "tree"
    assert choose("all_gather", (16 << 20) - 1, 4) == "doubling" and choose("all_gather", 16 << 20, 4) == "ring"
    assert choose("reduce", 1 << 24, 8) == "ring" and choose("reduce", 1 << 24, 2) == "tree"
    assert choose("reduce", (4 << 20) - 1, 4) == "tree" and choose("reduce", 4 << 20, 3) == "ring"
    for P in (3, 4, 8):  # recursive halving below 4 MiB at any size of group
        assert choose("reduce_scatter", (4 << 20) - 1, P) == "halving"
        assert choose("reduce_scatter", 4 << 20, P) == "ring"
    for P in (2, 4, 8):  # every transfer at once below 4 MiB, one peer per step above
        assert choose("all_to_all", (4 << 20) - 1, P) == "linear" and choose("all_to_all", 4 << 20, P) == "pairwise"
    with pytest.raises(ValueError):
        choose("all_reduce_typo", 1, 1)


async def test_bad_arguments_raise_before_sending(make_group: MakeGroup) -> None:
    group = await make_group(2)

    async def body(ch: Channel) -> None:
        with pytest.raises(ValueError):
            await ring.all_reduce(ch, np.ones((4, 4), np.float32)[:, :2], "sum")
        with pytest.raises(ValueError):
            await ring.all_gather(ch, np.ones(3, np.uint8))
        for rs in ALGORITHMS["reduce_scatter"].values():
            with pytest.raises(ValueError):
                await rs(ch, np.ones(4, np.float32), "sum", np.empty(3, np.float32))
        with pytest.raises(ValueError):
            await tree.broadcast(ch, None, 2)
        with pytest.raises(ValueError):
            await ring.all_reduce(ch, np.ones(4, np.float32), "sum", segment_bytes=0)
        with pytest.raises(TypeError):
            await doubling.all_reduce(ch, np.ones(4, np.float32), "bxor")

    frames = group.count_frames()
    await group.run(body)
    assert frames == [0, 0]


@pytest.mark.parametrize("P", [2, 3, 4, 5])
@pytest.mark.parametrize("count", [0, 1, 7, 1001])
async def test_ring_reduce_every_root_and_input_form(make_group: MakeGroup, P: int, count: int) -> None:
    """Uneven chunks, every root, and the three ways to hand in the input:
    ``buf`` alone (the root copies it), ``src`` with the root's result
    ``buf``, and ``src`` alone away from the root."""
    xs = [np.arange(count, dtype=np.int64) * (k + 1) + k for k in range(P)]
    keep = [x.copy() for x in xs]
    want = sum(xs)
    for root in range(P):
        group = await make_group(P)

        async def plain(ch: Channel) -> np.ndarray:
            buf = xs[ch.rank].copy()
            await ring.reduce(ch, buf, "sum", root, segment_bytes=24)
            return buf

        res = await group.run(plain)
        np.testing.assert_array_equal(res[root], want)

        async def with_src(ch: Channel) -> np.ndarray | None:
            out = np.full(count, -1, np.int64) if ch.rank == root else None
            await ring.reduce(ch, out, "sum", root, segment_bytes=24, src=xs[ch.rank])
            return out

        res = await (await make_group(P)).run(with_src)
        np.testing.assert_array_equal(res[root], want)
    for x, k in zip(xs, keep, strict=True):  # a src is only read
        np.testing.assert_array_equal(x, k)


async def test_ring_reduce_argument_errors(make_group: MakeGroup) -> None:
    group = await make_group(2)

    async def bad(ch: Channel) -> list[str]:
        errors = []
        for call in (
            lambda: ring.reduce(ch, None, "sum", 0),
            lambda: ring.reduce(ch, np.ones(3), "sum", 5),
            lambda: (
                ring.reduce(ch, np.ones(3), "sum", 0, src=np.ones(4))
                if ch.rank == 0
                else ring.reduce(ch, None, "sum", 0, segment_bytes=0)
            ),
        ):
            with pytest.raises(ValueError) as info:
                await call()
            errors.append(str(info.value))
        return errors

    assert all(len(e) == 3 for e in await group.run(bad))


class _SendLog:
    """A channel stand-in for ``send_each``: records when each send starts and ends; a send
    "lent" (``lent``) waits until the test lets it finish, as a lent send waits for its reader."""

    def __init__(self, lent: bool) -> None:
        self.lent, self.events, self.release = lent, [], asyncio.Event()

    def lends(self, peer: int, nbytes: int, *, step: int) -> bool:
        return self.lent

    async def send(self, peer: int, data: Any, *, step: int, chunk: int, meta: Any = None) -> None:
        self.events.append(("start", peer))
        if self.lent:
            await self.release.wait()
        else:
            await asyncio.sleep(0)
        self.events.append(("end", peer))


@pytest.mark.parametrize("lent", [False, True])
async def test_send_each_sends_one_after_the_other_unless_a_link_lends(lent: bool) -> None:
    """Sends that return at once go in order; sends that wait for their reader (lent) go
    to every peer at once, so the peers read at the same time; a failure cancels the rest."""
    from netcoll.algorithms._common import send_each

    ch = _SendLog(lent)
    data = np.zeros(4, np.uint8)
    task = asyncio.ensure_future(send_each(ch, [(1, data, None), (2, data, None), (3, data, None)], step=0, chunk=0))
    await asyncio.sleep(0.01)
    if lent:
        assert ch.events == [("start", 1), ("start", 2), ("start", 3)] and not task.done()
        ch.release.set()
    await task
    ends = [e for e in ch.events if e[0] == "end"]
    assert ends == [("end", 1), ("end", 2), ("end", 3)]
    if not lent:
        assert ch.events == [(what, p) for p in (1, 2, 3) for what in ("start", "end")]
    ch = _SendLog(True)
    failing = asyncio.ensure_future(send_each(ch, [(1, data, None), (2, data, {"m": 1})], step=0, chunk=0))
    await asyncio.sleep(0.01)
    failing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await failing
    assert ("end", 1) not in ch.events and ("end", 2) not in ch.events


@pytest.mark.parametrize("name", ["gather", "reduce"])
async def test_rooted_collectives_non_roots_wait_for_the_roots_receive(make_group: MakeGroup, name: str) -> None:
    """A gather's and a tree reduce's non-roots send synchronously (``Channel.sync_from``): over
    TCP a payload of ``SYNC_MIN`` or more waits for its receive (a rendezvous, though the window
    has room), so the root never holds one; smaller ones go eagerly. Results as before."""
    from netcoll.links.framed import SYNC_MIN

    P = 4
    group = await make_group(P)
    for nbytes in (SYNC_MIN, SYNC_MIN // 2):
        count = nbytes // 4
        inputs = [np.full(count, r + 1, np.float32) for r in range(P)]

        async def body(ch: Channel, inputs: list[np.ndarray] = inputs, count: int = count) -> np.ndarray | None:
            if name == "gather":
                recv = np.empty((P, count), np.float32) if ch.rank == 0 else None
                await ALGORITHMS["gather"]["direct"](ch, inputs[ch.rank], recv, 0)
                return recv
            buf = inputs[ch.rank].copy()
            await ALGORITHMS["reduce"]["tree"](ch, buf, "sum", 0)
            return buf if ch.rank == 0 else None

        before = [{p: link.stats() for p, link in t.links.items()} for t in group.meshes]
        got = (await group.run(body))[0]
        want = np.stack(inputs) if name == "gather" else np.full(count, P * (P + 1) // 2, np.float32)
        assert got is not None and np.array_equal(got, want)
        rendezvous = sum(
            link.stats().rendezvous - before[r][p].rendezvous
            for r, t in enumerate(group.meshes)
            for p, link in t.links.items()
        )
        # gather: the 3 non-roots; the tree: 1 -> 0, 2 -> 0, 3 -> 2 (shared memory never syncs)
        synced = nbytes >= SYNC_MIN and group.meshes[0].links[1].kind != "shm"
        assert rendezvous == (3 if synced else 0)
