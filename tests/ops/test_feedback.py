"""netcoll.feedback: the residual algebra of error feedback, its per-key bookkeeping, and that
:func:`transmitted` is exactly what a compressed all_reduce takes of a contribution."""

from __future__ import annotations

import numpy as np
import pytest

from netcoll.algorithms._scratch import split
from netcoll.compression import decode, encode
from netcoll.feedback import ErrorFeedback, shards, transmitted
from tests.support import run_world

CODECS = ["fp16", "bf16", "int8"]


@pytest.mark.parametrize(("n", "parts"), [(0, 1), (5, 3), (1030, 4), (7, 8), (3 * 517, 3)])
def test_shards_are_the_collectives_cut(n: int, parts: int) -> None:
    assert shards(n, parts) == split(n, parts)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(("rank", "world"), [(0, 1), (1, 3), (3, 4)])
def test_sent_plus_final_residual_is_the_sum_of_inputs(codec: str, rank: int, world: int) -> None:
    rng = np.random.default_rng(7)
    feedback = ErrorFeedback(codec, rank=rank, world_size=world)
    inputs = [rng.standard_normal(1500) * 10.0 ** rng.integers(-3, 3) for _ in range(25)]
    sent = np.zeros(1500)
    for x in inputs:
        sent += transmitted(codec, feedback.compensate("g", x), rank, world)
    residual = feedback.residual("g")
    assert residual is not None
    total = np.sum(inputs, axis=0)
    np.testing.assert_allclose(sent + residual, total, rtol=0, atol=1e-11 * np.abs(inputs).max() * len(inputs))
    if world > 1:  # something was dropped on the way, and the residual holds it
        assert np.abs(residual).max() > 0
        assert np.abs(sent - total).max() > 1e-11 * np.abs(total).max()


def test_float32_algebra_within_rounding() -> None:
    rng = np.random.default_rng(3)
    feedback = ErrorFeedback("int8", rank=0, world_size=2)
    xs = [rng.standard_normal(2048).astype(np.float32) for _ in range(50)]
    sent = np.zeros(2048)
    for x in xs:
        sent += transmitted("int8", feedback.compensate(0, x), 0, 2)
    residual = feedback.residual(0)
    assert residual is not None and residual.dtype == np.float32
    err = np.abs(sent + residual - np.sum(np.array(xs, np.float64), axis=0)).max()
    assert err < 50 * 2.0**-24 * 8  # one float32 rounding of each step's sum, magnitudes below 8


def test_without_feedback_the_error_grows_and_with_it_stays_bounded() -> None:
    """A constant input the codec cannot represent: dropped each step without feedback,
    so the sum drifts linearly; with feedback the drift stays below one step's error."""
    x = np.full(512, 1.0 + 2.0**-12, np.float64)  # fp16 rounds it down to 1.0
    steps = 64
    plain = sum(transmitted("fp16", x, 1, 2) for _ in range(steps))
    feedback = ErrorFeedback("fp16", rank=1, world_size=2)
    fed = sum(transmitted("fp16", feedback.compensate("k", x), 1, 2) for _ in range(steps))
    exact = steps * x
    assert np.abs(plain - exact)[:256].max() == pytest.approx(steps * 2.0**-12)  # shard 0: coded, dropped each step
    assert np.array_equal(plain[256:], exact[256:])  # shard 1, rank 1's own: reduced as it is
    assert np.abs(fed - exact).max() <= 2.0**-10


def test_transmitted_leaves_own_shard_and_codes_the_others() -> None:
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    got = transmitted("int8", x, 1, 2)
    a, b = shards(1000, 2)[0]
    want = decode("int8", encode("int8", x[a:b]), np.empty(b - a, np.float32))
    assert np.array_equal(got[a:b], want)
    assert np.array_equal(got[500:], x[500:])
    assert np.array_equal(transmitted("int8", x, 0, 1), x)  # a group of one sends nothing
    assert np.array_equal(transmitted("none", x, 0, 4), x)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("n", [2, 3])
async def test_transmitted_is_what_the_compressed_all_reduce_reduces(codec: str, n: int) -> None:
    """The collective's result is, shard by shard, the round trip of the rank-order sum of
    every rank's ``transmitted`` contribution: bit for bit."""
    xs = [np.random.default_rng(r).standard_normal(3 * 517 + 1).astype(np.float32) for r in range(n)]
    res = await run_world(n, lambda c: c.all_reduce(xs[c.rank].copy(), compression=codec))
    bounds = shards(xs[0].size, n)
    want = np.empty_like(xs[0])
    for s, (a, b) in enumerate(bounds):
        total = transmitted(codec, xs[0], 0, n)[a:b] if s else xs[0][a:b].copy()
        for r in range(1, n):
            total += xs[r][a:b] if r == s else transmitted(codec, xs[r], r, n)[a:b]
        decode(codec, encode(codec, total), want[a:b])
    for r in range(n):
        assert np.array_equal(res[r], want), (codec, n, r)


def test_keys_sizes_and_reset() -> None:
    feedback = ErrorFeedback("bf16", rank=0, world_size=2)
    x = np.linspace(-1, 1, 100, dtype=np.float32) + np.float32(1e-3)
    feedback.compensate(0, x)
    feedback.compensate(1, x[:10])
    assert feedback.nbytes == 110 * 4
    first = feedback.residual(0)
    assert first is not None and np.abs(first).max() > 0
    again = feedback.compensate(0, x[:50])  # the bucket changed size: start over from zero
    assert np.array_equal(again, x[:50])
    buf = x.copy()
    assert feedback.compensate(2, buf, out=buf) is buf  # in place
    feedback.reset()
    assert feedback.nbytes == 0 and feedback.residual(0) is None


def test_refusals() -> None:
    with pytest.raises(ValueError, match="compression must be one of"):
        ErrorFeedback("fp8")
    with pytest.raises(ValueError, match="rank must be in"):
        ErrorFeedback("fp16", rank=2, world_size=2)
    with pytest.raises(ValueError, match="needs a float16"):
        ErrorFeedback("int8").compensate(0, np.arange(4))
    with pytest.raises(ValueError, match="out must be a contiguous"):
        ErrorFeedback("fp16").compensate(0, np.ones(4), out=np.ones(5))


@pytest.mark.parametrize("codec", CODECS)
def test_out_apart_gives_what_in_place_gives_and_leaves_x(codec: str) -> None:
    rng = np.random.default_rng(11)
    apart, inplace = ErrorFeedback(codec, rank=2, world_size=3), ErrorFeedback(codec, rank=2, world_size=3)
    out = np.empty(70001, np.float32)
    for step in range(3):
        x = rng.standard_normal(70001).astype(np.float32)
        keep, buf = x.copy(), x.copy()
        assert apart.compensate("k", x, out=out) is out
        assert np.array_equal(x, keep), step  # x is only read
        inplace.compensate("k", buf, out=buf)
        assert np.array_equal(out, buf), step
        ra, rb = apart.residual("k"), inplace.residual("k")
        assert ra is not None and rb is not None and np.array_equal(ra, rb)
        a, b = shards(x.size, 3)[2]
        assert not ra[a:b].any() and ra[:a].any()  # the own shard is sent as it is: no residual there


def test_an_out_overlapping_x_reads_x_first() -> None:
    x = np.arange(10, dtype=np.float32) + np.float32(1 + 2.0**-12)
    want = ErrorFeedback("fp16", rank=0, world_size=2).compensate(0, x[2:].copy())
    got = ErrorFeedback("fp16", rank=0, world_size=2).compensate(0, x[2:], out=x[:8])
    assert np.array_equal(got, want)


def _awkward(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 values of every kind a cast meets: normal, beyond fp16's range, subnormal in
    fp16, exact ties of fp16 and bf16, infinities and NaN."""
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-9, 7, n)).astype(np.float32)
    k = n // 8
    x[:k] = np.float32(1.0) + np.float32(2.0**-11) * rng.integers(-64, 64, k).astype(np.float32)  # fp16 ties
    x[k : 2 * k] = np.float32(1.0) + np.float32(2.0**-8) * rng.integers(-64, 64, k).astype(np.float32)  # bf16 ties
    x[2 * k : 2 * k + 3] = [np.inf, -np.inf, np.nan]
    x[2 * k + 3 : 2 * k + 5] = [np.float32(65520.0), np.float32(-65519.0)]  # fp16 rounds the first to inf
    return x


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
@pytest.mark.parametrize(("rank", "world", "in_place"), [(0, 4, True), (3, 4, False), (1, 2, True)])
def test_through_torch_gives_the_bits_of_the_numpy_loop(
    codec: str, rank: int, world: int, in_place: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")  # loaded: compensate runs its loop with torch's kernels
    import netcoll.feedback as fb

    rng = np.random.default_rng(36)
    fast, slow = ErrorFeedback(codec, rank=rank, world_size=world), ErrorFeedback(codec, rank=rank, world_size=world)
    n = 3 * fb.CHUNK + 4099  # shards of more than one chunk, and a partial last chunk
    for step in range(3):
        x = _awkward(rng, n)
        with np.errstate(all="ignore"):
            monkeypatch.setenv("NETCOLL_TORCH_CASTS", "0")  # the reference: numpy's loop and casts
            want = slow.compensate("k", x.copy(), out=None)
            monkeypatch.delenv("NETCOLL_TORCH_CASTS")
            with monkeypatch.context() as m:
                m.setattr(fb, "codec_roundtrip", _refused)  # the torch loop, not the numpy one
                buf = x.copy()
                got = fast.compensate("k", buf, out=buf if in_place else None)
        assert np.array_equal(got, want, equal_nan=True), (codec, step)
        rf, rs = fast.residual("k"), slow.residual("k")
        assert rf is not None and rs is not None and np.array_equal(rf, rs, equal_nan=True), (codec, step)
        assert rf.view(np.uint32)[~np.isnan(rf)].tolist() == rs.view(np.uint32)[~np.isnan(rs)].tolist()


def _refused(*_: object) -> None:
    raise AssertionError("the numpy loop ran where the torch one should have")


def test_a_read_only_input_takes_the_numpy_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    x = np.full(1000, 1 + 2.0**-12, np.float32)
    x.flags.writeable = False
    calls: list[str] = []
    import netcoll.feedback as fb

    real = fb.codec_roundtrip
    monkeypatch.setattr(fb, "codec_roundtrip", lambda *a: calls.append("numpy") or real(*a))
    got = ErrorFeedback("fp16", rank=0, world_size=2).compensate(0, x)
    assert calls == ["numpy"] and got.tolist() == [1.0 + 2.0**-12] * 1000  # no residual yet: x itself
