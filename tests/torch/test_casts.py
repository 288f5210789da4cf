"""netcoll.torch.casts: torch's casts are the fp16 and bf16 codecs' round trip, bit for bit,
and error feedback with them keeps the same residuals as with the codec's own."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from netcoll.compression import decode, encode
from netcoll.feedback import CHUNK, ErrorFeedback
from netcoll.torch.casts import roundtrip_for


def awkward(n: int, seed: int) -> np.ndarray:
    """float32 values across both formats' ranges: subnormals of half and of float32,
    rounding ties, the edges of overflow, signed zeros, infinities."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):  # some overflow float32: infinities, wanted
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 39, n)).astype(np.float32)
    ties = (rng.integers(0, 1 << 10, n // 8).astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-24)
    edges = np.array([65504, 65519.99, 65520, -65520, 2.0**-14, 2.0**-25, 2.0**-24 * 1.5, 3.39e38, 0.0, -0.0])
    special = np.array([np.inf, -np.inf], np.float32)
    return np.concatenate([x, ties, edges.astype(np.float32), special])


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torch_round_trip_has_the_codecs_bits(codec: str, seed: int) -> None:
    x = awkward(3 * CHUNK + 77, seed)  # longer than the scratch buffer, too
    roundtrip = roundtrip_for(codec)(x.dtype)
    assert roundtrip is not None
    got = np.empty_like(x)
    roundtrip(x, got)
    want = decode(codec, encode(codec, x), np.empty_like(x))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), codec
    nan = np.array([np.nan, -np.nan, 1.0], np.float32)
    roundtrip(nan, got[:3])
    assert np.isnan(got[:2]).all() and got[2] == 1.0  # a NaN stays a NaN (its payload may differ)


def test_other_codecs_and_dtypes_keep_the_codecs_own() -> None:
    assert roundtrip_for("int8")(np.dtype(np.float32)) is None
    assert roundtrip_for("fp16")(np.dtype(np.float64)) is None  # torch casts float64 through float32
    assert roundtrip_for("bf16")(np.dtype(np.float16)) is None


@pytest.mark.parametrize("codec", ["fp16", "bf16"])
def test_feedback_with_torch_casts_keeps_the_same_residuals(codec: str) -> None:
    plain = ErrorFeedback(codec, rank=1, world_size=3)
    fast = ErrorFeedback(codec, rank=1, world_size=3, roundtrip=roundtrip_for(codec))
    rng = np.random.default_rng(5)
    for step in range(4):
        x = (rng.standard_normal(2 * CHUNK + 1001) * 1e-5).astype(np.float32)
        a, b = plain.compensate(0, x), fast.compensate(0, x)
        assert np.array_equal(a, b), step
        ra, rb = plain.residual(0), fast.residual(0)
        assert ra is not None and rb is not None and np.array_equal(ra, rb), step
        assert np.abs(rb).max() > 0
