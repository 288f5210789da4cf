"""Compressed collectives (compression="fp16" | "bf16" | "int8"): results bit-identical on
every rank, within the codecs' bounds of a float64 reference, bytes on the links shrunk
(``link_stats()``'s ``bytes_sent``), and the refusals at the call. In-memory worlds; a
subset over real TCP (test_compressed_tcp)."""
# ruff: noqa: B023

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from netcoll.comm import Communicator
from netcoll.ops import BFLOAT16
from tests.support import connected_world, memory_world, run_world

CODECS = ["fp16", "bf16", "int8"]
DTYPES = [np.float32, np.float64, np.float16, BFLOAT16]
#: per-element error of one encoding, relative to the largest magnitude around
UNIT = {"fp16": 2.0**-11, "bf16": 2.0**-8, "int8": 1 / 254}
#: relative rounding of one addition in the input dtype
EPS = {
    np.dtype(np.float32): 2.0**-24,
    np.dtype(np.float64): 2.0**-53,
    np.dtype(np.float16): 2.0**-11,
    BFLOAT16: 2.0**-8,
}


def data(n: int, shape: tuple[int, ...], dtype: Any, seed: int = 0) -> list[np.ndarray]:
    return [np.random.default_rng(seed * 100 + r).standard_normal(shape).astype(dtype) for r in range(n)]


def bound(codec: str, dtype: Any, n: int, scale: float) -> float:
    """Error allowed for a result over ``n`` contributions of magnitude up to ``scale``
    (one encoding each, one of the result, and the additions in the input dtype)."""
    unit = UNIT[codec]
    if codec == "fp16" and np.dtype(dtype) == BFLOAT16:
        unit = 2.0**-8  # a bf16 value encoded in fp16 keeps its own 8 bits at best
    return (2 * n * unit + n * n * EPS[np.dtype(dtype)]) * scale * (1 + 1e-6) + 1e-30


def identical(results: list[np.ndarray]) -> None:
    first = results[0]
    for r in results[1:]:
        assert r.dtype == first.dtype and r.shape == first.shape
        assert np.array_equal(r.view(np.uint8), first.view(np.uint8))  # bit-identical, NaN included


async def collective(name: str, comm: Communicator, x: np.ndarray, codec: str) -> Any:
    if name == "all_reduce":
        return await comm.all_reduce(x, compression=codec)
    if name == "reduce":
        return await comm.reduce(x, root=comm.world_size - 1, compression=codec)
    if name == "reduce_scatter":
        return await comm.reduce_scatter(x.reshape(comm.world_size, -1), compression=codec)
    if name == "all_gather":
        return await comm.all_gather(x, compression=codec)
    return await comm.broadcast(x if comm.rank == 1 else None, root=1, compression=codec)


def check(name: str, n: int, xs: list[np.ndarray], res: list[Any], codec: str) -> None:
    dtype = xs[0].dtype
    wide = np.stack([x.astype(np.float64) for x in xs])
    scale = float(np.abs(wide).max())
    if name == "all_reduce":
        identical(res)
        err = np.abs(res[0].astype(np.float64) - wide.sum(0)).max()
    elif name == "reduce":
        assert all(r is None for r in res[:-1])
        err = np.abs(res[-1].astype(np.float64) - wide.sum(0)).max()
    elif name == "reduce_scatter":
        want = wide.sum(0).reshape(n, -1)
        err = max(np.abs(res[r].astype(np.float64) - want[r]).max() for r in range(n))
    elif name == "all_gather":
        identical(res)
        err = np.abs(res[0].astype(np.float64) - wide).max()
        n = 1
    else:
        identical(res)
        err = np.abs(res[0].astype(np.float64) - wide[1]).max()
        n = 1
    assert all(r is None or r.dtype == dtype for r in res)
    assert err <= bound(codec, dtype, n, scale), (name, codec, dtype, err)


NAMES = ["all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", [2, 3, 4])
async def test_every_collective_codec_and_dtype(name: str, n: int) -> None:
    for codec in CODECS:
        for dtype in DTYPES:
            for count in (1, 3 * 517):  # blocks and shards that do not divide evenly
                xs = data(n, (n * count,), dtype, seed=count)
                keep = [x.copy() for x in xs]
                res = await run_world(n, lambda c: collective(name, c, xs[c.rank], codec))
                check(name, n, keep, res, codec)
                assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(xs, keep, strict=True))


@pytest.mark.tcp
@pytest.mark.parametrize("n", [2, 3, 4])
async def test_over_tcp(n: int) -> None:
    async with connected_world(n) as comms:
        for name in NAMES:
            for codec in CODECS:
                xs = data(n, (n * 3000,), np.float32, seed=n)
                res = await asyncio.gather(*(collective(name, c, xs[c.rank], codec) for c in comms))
                check(name, n, xs, list(res), codec)


def sent(comms: list[Communicator]) -> int:
    return sum(v["bytes_sent"] for c in comms for v in c.link_stats().values())


@pytest.mark.parametrize("n", [2, 3, 4])
async def test_bytes_on_the_links_shrink(n: int) -> None:
    _, comms = memory_world(n)
    x = np.random.default_rng(0).standard_normal(n << 18).astype(np.float32)  # 4 MiB at 4 ranks
    for name in NAMES:
        got = {}
        for codec in ["none", *CODECS]:
            before = sent(comms)
            await asyncio.gather(*(collective(name, c, x, codec) for c in comms))
            got[codec] = sent(comms) - before
        assert got["fp16"] <= 0.55 * got["none"], (name, got)
        assert got["bf16"] <= 0.55 * got["none"], (name, got)
        assert got["int8"] <= 0.30 * got["none"], (name, got)


async def test_avg_min_max_and_out() -> None:
    n = 3
    xs = data(n, (2000,), np.float32)
    wide = np.stack([x.astype(np.float64) for x in xs])
    for op, want in (("avg", wide.mean(0)), ("min", wide.min(0)), ("max", wide.max(0))):
        res = await run_world(n, lambda c: c.all_reduce(xs[c.rank], op=op, compression="int8"))
        identical(res)
        assert np.abs(res[0] - want).max() <= 7 * UNIT["int8"] * np.abs(wide).max()
    outs = [np.empty(2000, np.float32) for _ in range(n)]
    res = await run_world(n, lambda c: c.all_reduce(xs[c.rank], out=outs[c.rank], compression="fp16"))
    assert all(r is o for r, o in zip(res, outs, strict=True))
    mine = [x.copy() for x in xs]  # in place: out is x
    res = await run_world(n, lambda c: c.all_reduce(mine[c.rank], out=mine[c.rank], compression="bf16"))
    identical(res)
    assert np.abs(res[0] - wide.sum(0)).max() <= bound("bf16", np.float32, n, float(np.abs(wide).max()))


async def test_non_finite_values_reach_every_rank_alike() -> None:
    n = 2
    xs = data(n, (2048,), np.float32)
    xs[0][5] = np.inf
    for codec in CODECS:
        res = await run_world(n, lambda c: c.all_reduce(xs[c.rank], compression=codec))
        identical(res)
        assert not np.isfinite(res[0][5])


async def test_broadcast_into_a_buffer_and_torch_free_meta() -> None:
    n = 3
    x = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float64)
    bufs = [np.zeros((4, 5), np.float64) for _ in range(n)]
    res = await run_world(n, lambda c: c.broadcast(x if c.rank == 0 else bufs[c.rank], compression="int8"))
    identical(res)
    assert res[1] is bufs[1] and res[0] is not x  # the root returns the decoded array
    assert np.abs(res[0] - x).max() <= np.abs(x).max() / 254 * 1.01


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_, np.complex64])
async def test_non_float_inputs_are_a_value_error_at_the_call(dtype: Any) -> None:
    _, comms = memory_world(2)
    c = comms[0]
    x = np.ones((2, 3), dtype)
    for call in (
        lambda: c.all_reduce(x, compression="fp16"),
        lambda: c.reduce(x, compression="int8"),
        lambda: c.reduce_scatter(x, compression="bf16"),
        lambda: c.all_gather(x, compression="int8"),
        lambda: c.broadcast(x, compression="int8"),
    ):
        with pytest.raises(ValueError, match="needs a float16, bfloat16, float32 or float64 input"):
            call()
    assert sent(comms) == 0  # nothing was sent


async def test_other_refusals_at_the_call() -> None:
    _, comms = memory_world(2)
    c, x = comms[0], np.ones(4, np.float32)
    with pytest.raises(ValueError, match="compression must be one of"):
        c.all_reduce(x, compression="zstd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="op='prod' cannot be compressed"):
        c.all_reduce(x, op="prod", compression="int8")
    with pytest.raises(ValueError, match="op='prod' cannot be compressed"):
        c.reduce(x, op="prod", compression="fp16")
    with pytest.raises(TypeError):
        c.all_reduce(x, op="band", compression="fp16")
    with pytest.raises(ValueError, match="algorithm must be 'auto'"):
        c.all_reduce(x, algorithm="ring", compression="fp16")
    with pytest.raises(ValueError, match="not a list"):
        c.reduce_scatter([x, x], compression="fp16")
    with pytest.raises(ValueError, match="not uneven=True"):
        c.all_gather(x, uneven=True, compression="fp16")
    assert sent(comms) == 0


async def test_env_default(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 2
    _, comms = memory_world(n)
    x = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)
    monkeypatch.setenv("NETCOLL_COMPRESSION", "int8")
    before = sent(comms)
    res = await asyncio.gather(*(c.all_reduce(x) for c in comms))
    compressed = sent(comms) - before
    identical(list(res))
    before = sent(comms)
    await asyncio.gather(*(c.all_reduce(x, compression="none") for c in comms))  # the call's own wins
    assert compressed <= 0.30 * (sent(comms) - before)
    # the default applies where it can: integers, prod, a named algorithm run uncompressed
    ints = [np.arange(5, dtype=np.int64) * (c.rank + 1) for c in comms]
    got = await asyncio.gather(*(c.all_reduce(ints[c.rank]) for c in comms))
    assert all(np.array_equal(g, np.arange(5) * 3) for g in got)
    got = await asyncio.gather(*(c.broadcast(ints[0] if c.rank == 0 else None) for c in comms))
    assert all(np.array_equal(g, ints[0]) and g.dtype == np.int64 for g in got)
    before = sent(comms)
    got = await asyncio.gather(*(c.all_reduce(x, op="prod") for c in comms))
    assert np.array_equal(got[0], x * x) and sent(comms) - before >= 2 * x.nbytes
    got = await asyncio.gather(*(c.all_reduce(x, algorithm="ring") for c in comms))
    assert np.array_equal(got[0], x + x)
    got = await asyncio.gather(*(c.all_gather(x, uneven=True) for c in comms))
    assert np.array_equal(got[0][1], x)
    with pytest.raises(ValueError, match="needs a float"):  # a call's own codec is strict
        comms[0].all_reduce(ints[0], compression="int8")
    monkeypatch.setenv("NETCOLL_COMPRESSION", "gzip")
    with pytest.raises(ValueError, match="NETCOLL_COMPRESSION must be one of"):
        comms[0].all_reduce(x)


async def test_ranks_that_disagree_on_the_codec_get_a_mismatch() -> None:
    from netcoll.errors import MismatchError

    n = 2
    x = np.ones(100, np.float32)
    res = await asyncio.wait_for(
        asyncio.gather(
            *(c.all_gather(x, compression="fp16" if c.rank == 0 else "bf16", timeout=10) for c in memory_world(n)[1]),
            return_exceptions=True,
        ),
        30,
    )
    assert all(isinstance(r, MismatchError) for r in res), res


def test_the_fingerprint_names_the_plan_and_the_codec() -> None:
    from netcoll.calls import compressed
    from netcoll.engine import Call
    from netcoll.observe import algorithm_of
    from netcoll.ops import ReduceOp

    _, comms = memory_world(2)
    e, x = comms[0]._engine, np.ones(1000, np.float32)
    for plan in (
        compressed.all_reduce(e, x, ReduceOp.SUM, None, "auto", "int8"),
        compressed.reduce(e, x, ReduceOp.SUM, 0, None, "auto", "int8"),
        compressed.reduce_scatter(e, x.reshape(2, -1), ReduceOp.SUM, None, "auto", "int8"),
    ):
        assert isinstance(plan, Call) and algorithm_of(plan.fp).startswith("compressed:")  # the metrics' label
        assert "compression=int8" in plan.fp


async def test_torch_tensors_in_torch_tensors_out() -> None:
    torch = pytest.importorskip("torch")
    n = 2
    gen = torch.Generator().manual_seed(0)
    ts = [torch.randn(1000, generator=gen).to(torch.bfloat16) for _ in range(n)]
    res = await run_world(n, lambda c: c.all_reduce(ts[c.rank], compression="int8"))
    assert all(isinstance(r, torch.Tensor) and r.dtype == torch.bfloat16 for r in res)
    assert torch.equal(res[0], res[1])
    want = (ts[0].double() + ts[1].double()).abs().max().item()
    assert (res[0].double() - ts[0].double() - ts[1].double()).abs().max().item() <= 0.05 * want
    got = await run_world(n, lambda c: c.broadcast(ts[0] if c.rank == 0 else None, compression="fp16"))
    assert all(isinstance(g, torch.Tensor) and g.dtype == torch.bfloat16 for g in got)
    assert torch.equal(got[0], got[1])
    assert torch.allclose(got[1].double(), ts[0].double(), rtol=2.0**-8, atol=2.0**-24)


@pytest.mark.parametrize("n", [2, 3, 4])
async def test_an_all_reduce_in_pieces_gives_the_bits_of_one_piece(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of every shard (netcoll.algorithms.compressed.pieces), tapered or not, run a few
    at once; each piece's encoding is that part of its whole shard's, so the result's bits do
    not change."""
    from netcoll.algorithms import compressed

    for codec in CODECS:
        for dtype in DTYPES:
            xs = data(n, (n * 9 * 517 + 1,), dtype, seed=7)  # shards of 4653 or 4654: nine pieces of 512 and a rest
            monkeypatch.setattr(compressed, "PIECES", {})  # every codec: PIECE_BYTES, WINDOW, DEPTH, TAPER
            monkeypatch.setattr(compressed, "PIECE_BYTES", 1 << 30)
            whole = await run_world(n, lambda c: c.all_reduce(xs[c.rank], compression=codec))
            monkeypatch.setattr(compressed, "PIECE_BYTES", 1024 * np.dtype(dtype).itemsize)
            for window, depth, taper in ((1, 1, 0), (2, 2, 1), (5, 5, 0), (2, 5, 1), (1, 3, 2)):
                monkeypatch.setattr(compressed, "WINDOW", window)
                monkeypatch.setattr(compressed, "DEPTH", depth)
                monkeypatch.setattr(compressed, "TAPER", taper)
                pieced = await run_world(n, lambda c: c.all_reduce(xs[c.rank], compression=codec))
                mine = [x.copy() for x in xs]  # in place, read without a copy: the same bits
                inplace = await run_world(n, lambda c: c.all_reduce(mine[c.rank], out=mine[c.rank], compression=codec))
                assert all(r is m for r, m in zip(inplace, mine, strict=True))
                identical([*whole, *pieced, *inplace])
    assert len(compressed.pieces([(0, 4654), (4654, 9307)], 1024)) == 5
    tapered = compressed.pieces([(0, 4654), (4654, 9307)], 1024, 1)
    assert [b - a for (a, b), _ in tapered] == [512, 1024, 1024, 1024, 512, 558]


@pytest.mark.parametrize("n", [2, 3, 4])
async def test_avg_divides_as_it_decodes_with_the_bits_of_a_division_after(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """op="avg" divides each piece's result as it decodes it (algorithms.compressed._decode_all,
    small pieces here): the bits of the sum divided afterwards by
    netcoll.ops.finalize, in place and out of place, on every rank, non-finite values too."""
    from netcoll.algorithms import compressed
    from netcoll.ops import finalize

    monkeypatch.setattr(compressed, "PIECE_BYTES", 1024 * 8)
    for codec in CODECS:
        for dtype in DTYPES:
            xs = [x * 1000 for x in data(n, (n * 9 * 517 + 1,), np.float64, seed=11)]
            for x in xs:
                x[5], x[-3], x[1234] = np.inf, -np.inf, np.nan
            xs = [x.astype(dtype) for x in xs]
            sums = await run_world(n, lambda c: c.all_reduce(xs[c.rank], op="sum", compression=codec))
            want = sums[0].copy()
            finalize("avg", want, n)
            avg = await run_world(n, lambda c: c.all_reduce(xs[c.rank], op="avg", compression=codec))
            mine = [x.copy() for x in xs]
            inplace = await run_world(
                n, lambda c: c.all_reduce(mine[c.rank], out=mine[c.rank], op="avg", compression=codec)
            )
            assert all(r is m for r, m in zip(inplace, mine, strict=True))
            identical([want, *avg, *inplace])
            assert not np.array_equal(want.view(np.uint8), sums[0].view(np.uint8))  # (it did divide)


def test_the_divider_has_the_bits_of_finalize() -> None:
    """algorithms.compressed.divider: finalize's avg without its checks, a power of two as a
    multiplication by its inverse: the same bits on every float16 and bfloat16 value and on
    float32 and float64 edge cases (subnormals, the largest, infinities, NaN) and random ones."""
    from netcoll.algorithms.compressed import divider
    from netcoll.ops import finalize

    every = np.arange(1 << 16, dtype=np.uint16)
    rng = np.random.default_rng(3)
    values = {
        np.dtype(np.float16): every.view(np.float16),
        BFLOAT16: every.view(BFLOAT16),
        np.dtype(np.float32): np.concatenate(
            [
                np.array([0, -0.0, 1e-45, -3e-45, 1.1754942e-38, 1.1754944e-38, 3.4028235e38, np.inf, -np.inf, np.nan]),
                rng.standard_normal(5000) * 10.0 ** rng.integers(-45, 38, 5000),
            ]
        ).astype(np.float32),
        np.dtype(np.float64): np.concatenate(
            [
                np.array([0, -0.0, 5e-324, -1e-323, 2.2250738585072014e-308, 1.7976931348623157e308, np.inf, np.nan]),
                rng.standard_normal(5000) * 10.0 ** rng.integers(-320, 308, 5000),
            ]
        ),
    }
    for dtype, x in values.items():
        for n in range(1, 10):
            want, got = x.copy(), x.copy()
            finalize("avg", want, n)
            with np.errstate(all="ignore"):
                divider(dtype, n)(got)
            identical([want, got])
