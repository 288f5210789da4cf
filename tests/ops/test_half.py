"""netcoll.half: float32 to IEEE half and back by integer arithmetic, bit for bit what numpy's
cast gives (a NaN stays a NaN with its sign), on every half value and on float32 values of
every exponent, in chunks that take either path."""

from __future__ import annotations

import numpy as np
import pytest

from netcoll import half


def test_every_half_decodes_as_numpy_casts_it() -> None:
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    normal = h[(h & 0x7C00) != 0]  # no subnormals: numpy's cast; all of them: the bits
    for src in (normal, h):
        got = np.empty(src.size, np.float32)
        half.decode(src, got)
        ref = src.view(np.float16).astype(np.float32)
        nan = np.isnan(ref)
        assert np.array_equal(got.view(np.uint32)[~nan], ref.view(np.uint32)[~nan])
        assert np.isnan(got[nan]).all() and np.array_equal(np.signbit(got[nan]), np.signbit(ref[nan]))


SPECIALS = [
    *(0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x477FF000, 0x477FEFFF, 0x477FF001),
    *(0x38800000, 0x387FFFFF, 0x33000000, 0x33000001, 0x32FFFFFF, 0x33800000, 0x3F800000, 1, 0x3FFFF000),
]


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e-6, None])
def test_float32_encodes_as_numpy_casts_it(scale: float | None) -> None:
    rng = np.random.default_rng(36)
    if scale is None:  # any bits: every exponent, NaNs and infinities
        x = rng.integers(0, 1 << 32, size=1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    else:
        x = (rng.standard_normal(1 << 18) * scale).astype(np.float32)
    x = np.concatenate([x, np.array(SPECIALS, np.uint32).view(np.float32)])
    got = np.empty(x.size, np.uint16)
    half.encode(x, got)
    with np.errstate(all="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(got[nan].view(np.float16)).all()
    back = np.empty(x.size, np.float32)
    half.decode(got, back)
    assert np.array_equal(back[~nan], want[~nan].view(np.float16).astype(np.float32))
