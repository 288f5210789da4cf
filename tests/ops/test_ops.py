"""Tests for netcoll.ops: reduction ops and dtype rules."""

from __future__ import annotations

import tracemalloc
import warnings

import ml_dtypes
import numpy as np
import pytest

import netcoll.ops as ops_mod
from netcoll.ops import (
    BFLOAT16,
    SUPPORTED_DTYPES,
    ReduceOp,
    check_dtype,
    check_op_dtype,
    finalize,
    identity,
    parse_op,
    reduce_into,
    reduce_reference,
)

ALL_OPS = list(ReduceOp)
DTYPE_IDS = [str(dt) for dt in SUPPORTED_DTYPES]
FLOAT_LIKE = [np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64)]
COMPLEX = [np.dtype(np.complex64), np.dtype(np.complex128)]


def category(dt: np.dtype) -> str:
    if dt == np.bool_:
        return "bool"
    if dt.kind in "iu":
        return "int"
    if dt.kind == "c":
        return "complex"
    return "float"


def is_valid(op: ReduceOp, dt: np.dtype) -> bool:
    cat = category(dt)
    if op is ReduceOp.AVG:
        return cat in ("float", "complex")
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        return cat in ("int", "bool")
    if op in (ReduceOp.MIN, ReduceOp.MAX):
        return cat != "complex"
    return True


def make_arrays(dt: np.dtype, n: int, shape=(3, 5), seed=0) -> list[np.ndarray]:
    """Small integer-valued data, so every float fold below is exact."""
    rng = np.random.default_rng(seed)
    cat = category(dt)
    out = []
    for _ in range(n):
        if cat == "bool":
            a = rng.integers(0, 2, size=shape).astype(bool)
        elif dt.kind == "u":
            a = rng.integers(0, 8, size=shape).astype(dt)
        elif cat == "complex":
            re, im = rng.integers(-3, 4, size=(2, *shape))
            a = np.asarray(re + 1j * im).astype(dt)  # 0-d arithmetic yields a scalar
        else:
            a = rng.integers(-3, 4, size=shape).astype(dt)
        out.append(a)
    return out


def plain_numpy(op: ReduceOp, arrays: list[np.ndarray]) -> np.ndarray:
    """Independent expectation: reduce over axis 0 in a wide dtype, cast back."""
    dt = arrays[0].dtype
    stack = np.stack(arrays)
    n = len(arrays)
    if dt == np.bool_:
        return {
            ReduceOp.SUM: np.any,
            ReduceOp.MAX: np.any,
            ReduceOp.BOR: np.any,
            ReduceOp.PROD: np.all,
            ReduceOp.MIN: np.all,
            ReduceOp.BAND: np.all,
            ReduceOp.BXOR: lambda s, axis: s.sum(axis=axis) % 2 == 1,
        }[op](stack, axis=0)
    wide = {"int": np.int64, "float": np.float64, "complex": np.complex128}[category(dt)]
    w = stack.astype(wide)
    if op is ReduceOp.AVG:
        s = w.sum(axis=0)
        res = s.real / n + 1j * (s.imag / n) if np.iscomplexobj(s) else s / n
    else:
        res = {
            ReduceOp.SUM: lambda: w.sum(axis=0),
            ReduceOp.PROD: lambda: w.prod(axis=0),
            ReduceOp.MIN: lambda: w.min(axis=0),
            ReduceOp.MAX: lambda: w.max(axis=0),
            ReduceOp.BAND: lambda: np.bitwise_and.reduce(w, axis=0),
            ReduceOp.BOR: lambda: np.bitwise_or.reduce(w, axis=0),
            ReduceOp.BXOR: lambda: np.bitwise_xor.reduce(w, axis=0),
        }[op]()
    return np.asarray(res).astype(dt)


def assert_identical(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    assert a.tobytes() == b.tobytes(), (a, b)


def fold(op, arrays):
    acc = arrays[0].copy()
    for a in arrays[1:]:
        reduce_into(op, acc, a)
    finalize(op, acc, len(arrays))
    return acc


# --------------------------------------------------------------------------- ops x dtypes


@pytest.mark.parametrize("dt", SUPPORTED_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", ALL_OPS, ids=[o.value for o in ALL_OPS])
def test_every_op_every_dtype(op, dt):
    arrays = make_arrays(dt, 4)
    if not is_valid(op, dt):
        with pytest.raises(TypeError, match=op.value) as ei:
            check_op_dtype(op, dt)
        assert str(dt) in str(ei.value)
        with pytest.raises(TypeError):
            reduce_into(op, arrays[0].copy(), arrays[1])
        with pytest.raises(TypeError):
            finalize(op, arrays[0].copy(), 4)
        with pytest.raises(TypeError):
            reduce_reference(op, arrays)
        with pytest.raises(TypeError):
            identity(op, dt)
        return
    check_op_dtype(op, dt)
    check_op_dtype(op.value.upper(), dt)
    copies = [a.copy() for a in arrays]
    got = fold(op, arrays)
    assert_identical(got, reduce_reference(op, arrays))
    assert_identical(got, plain_numpy(op, arrays))
    # string ops behave like the enum
    assert_identical(fold(op.value, arrays), got)
    for a, c in zip(arrays, copies, strict=True):  # inputs untouched
        assert_identical(a, c)


@pytest.mark.parametrize("dt", SUPPORTED_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", ALL_OPS, ids=[o.value for o in ALL_OPS])
def test_identity_is_neutral(op, dt):
    if not is_valid(op, dt):
        return
    e = identity(op, dt)
    assert np.asarray(e).dtype == dt and np.ndim(e) == 0
    a = make_arrays(dt, 1, seed=7)[0]
    acc = a.copy()
    reduce_into(op, acc, np.full(a.shape, e, dtype=dt))
    assert_identical(acc, a)
    acc = np.full(a.shape, e, dtype=dt)
    reduce_into(op, acc, a)
    assert_identical(acc, a)


def test_identity_values():
    assert identity("band", np.uint8) == 255
    assert identity("band", np.int16) == -1
    assert identity("band", bool) == np.True_
    assert identity("min", np.int32) == np.iinfo(np.int32).max
    assert identity("max", np.uint64) == 0
    assert identity("min", BFLOAT16) == np.inf
    assert identity("max", np.float16) == -np.inf
    assert identity("prod", np.complex64) == 1
    assert identity("max", bool) == np.False_


@pytest.mark.parametrize("dt", SUPPORTED_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3)], ids=["0d", "empty", "empty3d"])
def test_zero_d_and_empty(dt, shape):
    for op in ALL_OPS:
        if not is_valid(op, dt):
            continue
        arrays = make_arrays(dt, 3, shape=shape)
        got = fold(op, arrays)
        assert got.shape == shape
        assert_identical(got, reduce_reference(op, arrays))
        if shape == ():
            assert_identical(got, plain_numpy(op, arrays))


# --------------------------------------------------------------------------- avg rounding


@pytest.mark.parametrize("dt", FLOAT_LIKE + COMPLEX, ids=str)
@pytest.mark.parametrize("n", [2, 3, 7, 1000, 3001])
def test_avg_finalize_correctly_rounded(dt, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(4096) * 50
    if dt.kind == "c":
        x = x + 1j * rng.standard_normal(4096) * 50
    acc = x.astype(dt)
    wide = acc.astype(np.complex128 if dt.kind == "c" else np.float64)
    if dt.kind == "c":  # componentwise, each exactly rounded
        expected = (wide.real / n + 1j * (wide.imag / n)).astype(dt)
    else:
        expected = (wide / n).astype(dt)
    finalize("avg", acc, n)
    assert_identical(acc, expected)


def test_avg_world_size_one_and_other_ops_noop():
    a = np.arange(6, dtype=np.float32)
    finalize("avg", a, 1)
    assert_identical(a, np.arange(6, dtype=np.float32))
    for op in ("sum", "prod", "min", "max"):
        finalize(op, a, 5)
        assert_identical(a, np.arange(6, dtype=np.float32))


# --------------------------------------------------------------------------- bfloat16 / fp16


def test_bfloat16_basics():
    assert np.dtype(ml_dtypes.bfloat16) == BFLOAT16
    assert check_dtype(ml_dtypes.bfloat16) == BFLOAT16
    assert check_dtype("bfloat16") == BFLOAT16
    a = np.array([1.5, -2.0, 256.0], dtype=BFLOAT16)
    b = np.array([0.25, 3.0, 1.0], dtype=BFLOAT16)
    acc = a.copy()
    reduce_into("sum", acc, b)
    # 257 is not representable in bfloat16 (8-bit significand): rounds to even, 256
    assert acc.astype(np.float32).tolist() == [1.75, 1.0, 256.0]
    acc = a.copy()
    reduce_into("max", acc, b)
    assert acc.astype(np.float32).tolist() == [1.5, 3.0, 256.0]


@pytest.mark.parametrize("dt", FLOAT_LIKE, ids=str)
def test_min_max_propagate_nan_without_warnings(dt):
    a = np.array([np.nan, 1.0, 2.0], dtype=dt)
    b = np.array([0.0, np.nan, 1.0], dtype=dt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for op, last in (("min", 1.0), ("max", 2.0)):
            acc = a.copy()
            reduce_into(op, acc, b)
            vals = acc.astype(np.float64)
            assert np.isnan(vals[0]) and np.isnan(vals[1]) and vals[2] == last


# --------------------------------------------------------------------------- overflow


def test_integer_overflow_wraps_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc = np.array([127, -128], dtype=np.int8)
        reduce_into("sum", acc, np.array([1, -1], dtype=np.int8))
        assert acc.tolist() == [-128, 127]
        acc = np.array(200, dtype=np.uint8)  # 0-d: numpy would warn for scalars
        reduce_into("prod", acc, np.array(2, dtype=np.uint8))
        assert int(acc) == 144
        acc = np.array([np.iinfo(np.int64).max], dtype=np.int64)
        reduce_into("sum", acc, np.array([1], dtype=np.int64))
        assert acc[0] == np.iinfo(np.int64).min


@pytest.mark.parametrize("dt", [np.dtype(np.float16), BFLOAT16, np.dtype(np.float32)], ids=str)
def test_float_overflow_to_inf_silently(dt):
    big = np.array([ml_dtypes.finfo(dt).max] * 2, dtype=dt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc = big.copy()
        reduce_into("sum", acc, big)
        assert np.isinf(acc.astype(np.float64)).all()
        reduce_into("sum", acc, -acc)  # inf + -inf -> nan, no "invalid" warning
        assert np.isnan(acc.astype(np.float64)).all()


@pytest.mark.parametrize("quiet", [True, False], ids=["errstate-variable", "np.errstate"])
def test_float_reductions_leave_the_callers_error_state_alone(quiet, monkeypatch):
    """reduce_into silences float warnings for itself only (numpy's error-state
    variable set and reset, or np.errstate where that variable is not there)."""
    if quiet:
        assert ops_mod._QUIET is not None  # the numpy we install keeps its error state in a variable
    else:
        monkeypatch.setattr(ops_mod, "_QUIET", None)
    big = np.array([np.finfo(np.float32).max] * 3, dtype=np.float32)
    with np.errstate(over="raise", invalid="call", divide="print"):
        before = np.geterr()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            acc = big.copy()
            reduce_into("sum", acc, big)
            reduce_into("min", acc, np.array([np.nan] * 3, dtype=np.float32))
        assert np.geterr() == before
        with pytest.raises(FloatingPointError):
            big + big  # the caller's own "raise" still holds
    assert np.isnan(acc).all()


# --------------------------------------------------------------------------- in place


@pytest.mark.parametrize("dt", SUPPORTED_DTYPES, ids=DTYPE_IDS)
def test_in_place_on_acc_buffer(dt):
    a, b = make_arrays(dt, 2, shape=(4, 6), seed=3)
    parent = a.copy()
    acc = parent[::2, 1::2]  # strided view: the parent's buffer must change, nothing else
    before = parent.copy()
    other = b[::2, 1::2]
    other_before = other.copy()
    ptr = acc.__array_interface__["data"][0]
    op = "bor" if category(dt) in ("int", "bool") else "sum"
    if category(dt) == "bool":
        acc[...] = False
        before = parent.copy()
    expected = reduce_reference(op, [acc.copy(), other])
    assert reduce_into(op, acc, other) is None
    assert acc.__array_interface__["data"][0] == ptr
    assert_identical(acc, expected)
    assert_identical(parent[::2, 1::2], expected)
    mask = np.ones(parent.shape, bool)
    mask[::2, 1::2] = False
    assert parent[mask].tobytes() == before[mask].tobytes()
    assert_identical(other, other_before)


@pytest.mark.parametrize(
    "dt",
    [
        np.dtype(np.float32),
        np.dtype(np.int64),
        BFLOAT16,
        np.dtype(np.float16),
        np.dtype(np.bool_),
        np.dtype(np.complex128),
    ],
    ids=str,
)
def test_reduce_into_allocates_no_temporary(dt):
    n = 1 << 18
    acc = np.ones(n, dtype=dt)
    other = np.ones(n, dtype=dt)
    op = "prod" if dt == np.bool_ else "sum"
    reduce_into(op, acc, other)  # warm caches
    tracemalloc.start()
    try:
        reduce_into(op, acc, other)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < acc.nbytes // 8, peak


@pytest.mark.parametrize("dt", [np.dtype(np.float16), BFLOAT16], ids=str)
def test_half_avg_finalize_has_no_full_size_temporary(dt):
    acc = np.ones(1 << 18, dtype=dt)
    tracemalloc.start()
    try:
        finalize("avg", acc, 3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < acc.nbytes, peak  # a float32 copy would be 2x acc.nbytes


# --------------------------------------------------------------------------- parse_op


def test_parse_op():
    assert parse_op("sum") is ReduceOp.SUM
    assert parse_op("SUM") is ReduceOp.SUM
    assert parse_op("Avg") is ReduceOp.AVG
    assert parse_op(ReduceOp.BXOR) is ReduceOp.BXOR
    assert ReduceOp.MIN == "min" and str(ReduceOp.MIN) == "min"
    assert [o.value for o in ReduceOp] == ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor"]


@pytest.mark.parametrize("bad", ["mean", "", "add", "sum2"])
def test_parse_op_unknown(bad):
    with pytest.raises(ValueError) as ei:
        parse_op(bad)
    msg = str(ei.value)
    assert repr(bad) in msg
    for name in ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor"):
        assert name in msg


@pytest.mark.parametrize("bad", [None, 1, b"sum", np.add])
def test_parse_op_wrong_type(bad):
    with pytest.raises(TypeError):
        parse_op(bad)


# --------------------------------------------------------------------------- dtypes


def test_supported_dtypes_list():
    names = [str(dt) for dt in SUPPORTED_DTYPES]
    assert names == [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ]
    assert all(dt.isnative for dt in SUPPORTED_DTYPES)


@pytest.mark.parametrize(
    "spec",
    [np.float32, "float32", "f4", np.dtype("=f4"), bool, "?", np.longlong, np.intc, np.uint64, "c8", "|i1", ">u1"],
)
def test_check_dtype_accepts(spec):
    dt = check_dtype(spec)
    assert isinstance(dt, np.dtype) and dt in SUPPORTED_DTYPES


UNSUPPORTED = [object, "U4", "S3", "M8[ns]", "m8[s]", "V4", np.dtype([("a", "f4")]), np.dtype(("f4", (2,)))]
if np.dtype(np.longdouble) != np.dtype(np.float64):
    UNSUPPORTED += [np.longdouble, np.clongdouble]


@pytest.mark.parametrize("spec", UNSUPPORTED, ids=str)
def test_check_dtype_refuses(spec):
    dt = np.dtype(spec)
    with pytest.raises(TypeError) as ei:
        check_dtype(spec)
    msg = str(ei.value)
    assert str(dt) in msg
    assert "float32" in msg and "bfloat16" in msg  # lists what is supported
    # and every entry point refuses it too
    with pytest.raises(TypeError):
        check_op_dtype("sum", dt)
    arr = np.zeros(3, dtype=dt)
    if arr.dtype == dt:  # a sub-array dtype dissolves into the array's shape
        with pytest.raises(TypeError):
            reduce_into("sum", arr, arr.copy())


@pytest.mark.parametrize("spec", [None, "notadtype", 42, object()])
def test_check_dtype_not_a_dtype(spec):
    with pytest.raises(TypeError, match="supported dtypes"):
        check_dtype(spec)


@pytest.mark.parametrize("dt", [d for d in SUPPORTED_DTYPES if d.itemsize > 1 and d != BFLOAT16], ids=str)
def test_non_native_byte_order_refused(dt):
    swapped = dt.newbyteorder("S")
    with pytest.raises(TypeError, match=r"newbyteorder\('='\)") as ei:
        check_dtype(swapped)
    assert "byte order" in str(ei.value)
    arr = np.zeros(2, dtype=swapped)
    with pytest.raises(TypeError):
        reduce_into("sum", arr, arr.copy())
    # the advice works
    assert check_dtype(arr.astype(arr.dtype.newbyteorder("=")).dtype) == dt


# --------------------------------------------------------------------------- argument errors


def test_reduce_into_argument_errors():
    a = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="dtype mismatch"):
        reduce_into("sum", a, np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="shape mismatch"):
        reduce_into("sum", a, np.zeros(5, np.float32))
    with pytest.raises(TypeError):
        reduce_into("sum", [0.0] * 4, a)
    with pytest.raises(TypeError):
        reduce_into(3, a, a.copy())
    with pytest.raises(ValueError, match="unknown"):
        reduce_into("mean", a, a.copy())
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        reduce_into("sum", ro, a)


def test_finalize_argument_errors():
    a = np.ones(4, np.float32)
    with pytest.raises(ValueError):
        finalize("avg", a, 0)
    with pytest.raises(TypeError):
        finalize("avg", a, 2.0)
    with pytest.raises(TypeError):
        finalize("avg", a, True)
    with pytest.raises(TypeError, match="avg"):
        finalize("avg", np.ones(4, np.int32), 2)
    finalize("avg", a, np.int64(2))
    assert a.tolist() == [0.5] * 4


def test_reduce_reference_errors_and_order():
    with pytest.raises(ValueError):
        reduce_reference("sum", [])
    with pytest.raises(ValueError):
        reduce_reference("sum", [np.zeros(2, np.float32), np.zeros(3, np.float32)])
    # left fold in list order: (1e8 + 1) - 1e8 == 0 in float32, 1e8 + (1 - 1e8) != that
    xs = [np.array([1e8], np.float32), np.array([1.0], np.float32), np.array([-1e8], np.float32)]
    assert reduce_reference("sum", xs)[0] == 0.0
    assert_identical(fold("sum", xs), reduce_reference("sum", xs))
    single = np.arange(3, dtype=np.float64)
    out = reduce_reference("avg", [single])
    assert_identical(out, single)
    assert out is not single


def test_a_fold_reduces_piece_by_piece_with_the_bits_of_reduce_to() -> None:
    from netcoll.ops import Fold, reduce_to

    rng = np.random.default_rng(3)
    own, incoming = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    whole = np.empty_like(own)
    reduce_to(ReduceOp.SUM, whole, own, incoming)
    for first in (False, True):
        out = np.zeros_like(own)
        fold = Fold(ReduceOp.SUM, out, own, incoming_first=first)
        raw = memoryview(incoming.tobytes())
        for a, b in ((0, 400), (400, 404), (404, 4000)):
            assert not fold.complete
            fold.apply(raw[a:b])
        assert fold.complete and out.tobytes() == whole.tobytes()


def test_a_fold_refuses_partial_elements_and_bytes_past_its_end() -> None:
    from netcoll.ops import Fold

    out = np.zeros(4, np.float64)
    fold = Fold(ReduceOp.MAX, out, np.ones(4))
    with pytest.raises(ValueError, match="whole elements"):
        fold.apply(memoryview(bytes(12)))
    fold.apply(memoryview(np.full(4, 2.0).tobytes()))
    assert fold.complete and out.tolist() == [2.0] * 4
    with pytest.raises(ValueError, match="whole elements"):
        fold.apply(memoryview(bytes(8)))
    with pytest.raises(ValueError):
        Fold(ReduceOp.SUM, np.zeros(4, np.float32), np.zeros(5, np.float32))
