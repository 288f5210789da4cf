"""The codecs of netcoll.compression: sizes, round-trip error bounds (property tests),
non-finite values, refusals, NETCOLL_COMPRESSION, int8's decoded bits and fold
(decode then reduce, a piece at a time)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from netcoll.compression import (
    FOLD,
    INT8_BLOCK,
    check_codec,
    decode,
    default_compression,
    encode,
    encoded_nbytes,
    fold,
    parse_compression,
    resolve,
)
from netcoll.ops import BFLOAT16, ReduceOp, reduce_into

FLOATS = [np.float16, BFLOAT16, np.float32, np.float64]


def roundtrip(codec: str, x: np.ndarray) -> np.ndarray:
    data = encode(codec, x)
    assert data.dtype == np.uint8 and data.size == encoded_nbytes(codec, x.dtype, x.size)
    return decode(codec, data, np.empty(x.size, x.dtype)).reshape(x.shape)


finite32 = hnp.arrays(
    np.float32,
    st.integers(0, 3 * INT8_BLOCK + 5),
    elements=st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_infinity=False),
)


@settings(max_examples=60, deadline=None)
@given(finite32)
def test_fp16_round_trip_bound(x: np.ndarray) -> None:
    got = roundtrip("fp16", x).astype(np.float64)
    want = x.astype(np.float64)
    big = np.abs(want) > 65504
    assert np.all(np.isinf(got[big]))  # beyond fp16's range: inf, as an IEEE cast
    small = ~big
    assert np.all(np.abs(got[small] - want[small]) <= np.abs(want[small]) * 2.0**-11 + 2.0**-25)


@settings(max_examples=60, deadline=None)
@given(finite32)
def test_bf16_round_trip_bound(x: np.ndarray) -> None:
    got = roundtrip("bf16", x).astype(np.float64)
    want = x.astype(np.float64)
    assert np.all(np.abs(got - want) <= np.abs(want) * 2.0**-8 + 1.2e-38)  # (subnormals: absolute)


@settings(max_examples=60, deadline=None)
@given(finite32)
def test_int8_round_trip_bound_per_block(x: np.ndarray) -> None:
    got = roundtrip("int8", x).astype(np.float64)
    want = x.astype(np.float64)
    for a in range(0, x.size, INT8_BLOCK):
        block = want[a : a + INT8_BLOCK]
        bound = np.abs(block).max() / 254 * (1 + 1e-6) + 1e-30
        assert np.abs(got[a : a + INT8_BLOCK] - block).max() <= bound


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8"])
def test_every_float_dtype_round_trips_close(codec: str, dtype: object) -> None:
    x = np.random.default_rng(1).standard_normal((3, 700)).astype(dtype)
    got = roundtrip(codec, x)
    assert got.dtype == x.dtype and got.shape == x.shape
    tol = {"fp16": 2e-3, "bf16": 1e-2, "int8": 0.02}[codec]
    if dtype is BFLOAT16 and codec == "fp16":
        tol = 1e-2
    np.testing.assert_allclose(got.astype(np.float64), x.astype(np.float64), atol=tol * 4, rtol=tol)


def test_lossless_when_the_input_is_already_the_wire_type() -> None:
    h = np.random.default_rng(2).standard_normal(999).astype(np.float16)
    b = np.random.default_rng(3).standard_normal(999).astype(BFLOAT16)
    assert np.array_equal(roundtrip("fp16", h), h)
    assert np.array_equal(roundtrip("bf16", b).view(np.uint16), b.view(np.uint16))


def test_sizes() -> None:
    assert encoded_nbytes("fp16", np.dtype(np.float32), 1000) == 2000
    assert encoded_nbytes("bf16", np.dtype(np.float64), 1000) == 2000
    # int8: one byte per element plus a float32 scale per block (float64 for float64)
    assert encoded_nbytes("int8", np.dtype(np.float32), 1 << 20) == (1 << 20) + 4 * ((1 << 20) // INT8_BLOCK)
    assert encoded_nbytes("int8", np.dtype(np.float64), INT8_BLOCK + 1) == INT8_BLOCK + 1 + 2 * 8
    assert encoded_nbytes("int8", np.dtype(np.float32), 0) == 0
    assert INT8_BLOCK * 8 <= 4096  # a block is at most 4 KiB of input, float64 included
    ratio = encoded_nbytes("int8", np.dtype(np.float32), 1 << 20) / (4 << 20)
    assert ratio <= 0.26


def test_zeros_and_empty() -> None:
    z = np.zeros(3 * INT8_BLOCK, np.float32)
    for codec in ("fp16", "bf16", "int8"):
        assert np.array_equal(roundtrip(codec, z), z)
        assert roundtrip(codec, np.zeros(0, np.float32)).size == 0


def test_int8_keeps_the_block_maximum_and_signs() -> None:
    x = np.array([1.0, -2.0, 0.5, 127.0], np.float32)
    got = roundtrip("int8", x)
    assert got[3] == 127.0 and got[1] == -2.0 and got[0] == 1.0


def test_non_finite_values() -> None:
    x = np.ones(2 * INT8_BLOCK, np.float32)
    x[3], x[INT8_BLOCK + 1] = np.inf, np.nan
    for codec in ("fp16", "bf16"):  # kept as they are
        got = roundtrip(codec, x)
        assert got[3] == np.inf and np.isnan(got[INT8_BLOCK + 1]) and np.all(got[4:INT8_BLOCK] == 1)
    got = roundtrip("int8", x)  # a block with any non-finite value decodes to NaN, whole
    assert np.all(np.isnan(got))
    y = np.ones(2 * INT8_BLOCK, np.float32)
    y[0] = -np.inf
    got = roundtrip("int8", y)
    assert np.all(np.isnan(got[:INT8_BLOCK])) and np.all(got[INT8_BLOCK:] == 1)


def test_decode_checks_the_size() -> None:
    with pytest.raises(ValueError, match="encode to"):
        decode("int8", np.zeros(10, np.uint8), np.empty(10, np.float32))


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint16, np.bool_, np.complex64])
def test_non_float_dtypes_are_refused(dtype: object) -> None:
    with pytest.raises(ValueError, match="compression='int8' needs a float"):
        check_codec("int8", np.dtype(dtype), "all_reduce")
    check_codec("none", np.dtype(dtype), "all_reduce")  # no codec: any dtype


def test_names_and_env_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_compression("FP16 ") == "fp16"
    with pytest.raises(ValueError, match="compression must be one of none, fp16, bf16, int8"):
        parse_compression("zstd")
    monkeypatch.delenv("NETCOLL_COMPRESSION", raising=False)
    assert default_compression() == "none" and resolve(None) == ("none", False)
    monkeypatch.setenv("NETCOLL_COMPRESSION", "int8")
    assert resolve(None) == ("int8", False) and resolve("bf16") == ("bf16", True)
    monkeypatch.setenv("NETCOLL_COMPRESSION", "int4")
    with pytest.raises(ValueError, match="NETCOLL_COMPRESSION must be one of"):
        resolve(None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_int8_decodes_each_code_times_its_scale_rounded_once(dtype: object) -> None:
    n = 300 * INT8_BLOCK + 77  # several of the decoder's row groups and a partial block
    x = np.random.default_rng(3).standard_normal(n).astype(dtype)
    data = encode("int8", x)
    sdt = np.float64 if dtype == np.float64 else np.float32
    nb = -(-n // INT8_BLOCK)
    scales, codes = data[: nb * np.dtype(sdt).itemsize].view(sdt), data[nb * np.dtype(sdt).itemsize :].view(np.int8)
    want = (codes.astype(sdt) * np.repeat(scales, INT8_BLOCK)[:n]).astype(dtype)
    got = decode("int8", data, np.empty(n, dtype))
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("codec", ["none", "fp16", "bf16", "int8"])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.MAX])
def test_fold_is_decode_then_reduce(codec: str, op: ReduceOp) -> None:
    rng = np.random.default_rng(4)
    n = 2 * FOLD + 3 * INT8_BLOCK + 5  # pieces of FOLD elements, the last one short
    x, acc = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    want = acc.copy()
    reduce_into(op, want, decode(codec, encode(codec, x), np.empty(n, np.float32)))
    fold(codec, op, acc, encode(codec, x), np.empty(FOLD, np.float32))
    assert np.array_equal(acc.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="decode: "):
        fold(codec, op, acc, encode(codec, x[:-1]), np.empty(FOLD, np.float32))


@pytest.mark.parametrize("codec", ["none", "fp16", "bf16", "int8"])
def test_fold_of_nothing_is_nothing(codec: str) -> None:
    """An empty contribution (a zero-element all_reduce, an empty shard) folds to nothing."""
    acc = np.empty(0, np.float32)
    fold(codec, ReduceOp.SUM, acc, encode(codec, acc), np.empty(0, np.float32))
    assert acc.size == 0
