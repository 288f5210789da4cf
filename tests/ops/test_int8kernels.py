"""netcoll.int8kernels: numba's fused int8 kernels give the bytes of numpy's encoding and the
bits of its decoding and SUM fold, on random, heavy-tailed, zero, non-finite, subnormal and
tiny-scale blocks, partial last blocks, unaligned and read-only buffers, every float dtype;
``NETCOLL_NUMBA_KERNELS=0`` and a missing numba fall back to numpy's path."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np
import pytest

from netcoll import compression, int8kernels
from netcoll.compression import FOLD, INT8_BLOCK
from netcoll.errors import ConfigError
from netcoll.ops import BFLOAT16, ReduceOp, reduce_into
from netcoll.settings import numba_kernels

pytest.importorskip("numba")

SIZES = [1, 77, INT8_BLOCK, INT8_BLOCK + 1, 9 * INT8_BLOCK + 300]


@pytest.fixture(autouse=True)
def _numpy_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_TORCH_CASTS", "0")  # the reference: numpy's path (torch's is tested equal to it)


def _by(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_NUMBA_KERNELS", "1" if path == "numba" else "0")
    assert int8kernels.available() == (path == "numba")


def _inputs(dtype: object, n: int) -> Iterator[np.ndarray]:
    """Arrays of ``n`` elements of ``dtype`` with every kind of block."""
    with np.errstate(over="ignore"):  # float16 and bfloat16: large values become inf
        yield from _kinds(dtype, n)


def _kinds(dtype: object, n: int) -> Iterator[np.ndarray]:
    rng, dt = np.random.default_rng(n), np.dtype(dtype)
    tiny = np.finfo(np.float64 if dt == np.float64 else np.float32).smallest_subnormal
    yield rng.standard_normal(n).astype(dt)
    yield (rng.standard_t(2, n) * 1e3).astype(dt)
    yield np.zeros(n, dt)
    yield -np.zeros(n, dt)
    for special in (np.nan, np.inf, -np.inf):
        x = rng.standard_normal(n).astype(dt)
        x[rng.integers(0, n, 1 + n // 700)] = special
        yield x
    for scale in (1.0, 200.0, 3e4, 1.5e8, 1e9, 5e16):  # subnormal blocks: scales 0, subnormal (inverse inf or finite)
        yield (rng.integers(-5, 6, n) * tiny * scale).astype(dt)
    yield np.full(n, np.finfo(np.float32).max, dt) if dt.itemsize >= 4 else np.ones(n, dt)
    if dt.itemsize in (4, 8):  # random bit patterns in a few blocks: NaN payloads of both signs, infs
        x = rng.standard_normal(n).astype(dt)
        pick = rng.random(n) < 0.002
        bits = rng.integers(0, np.iinfo(np.int64).max, n, dtype=np.int64).astype(f"u{dt.itemsize}")
        x.view(bits.dtype)[pick] = bits[pick]
        yield x
    blocks = rng.standard_normal(n).astype(dt)  # blocks of very different magnitudes
    blocks *= np.repeat(10.0 ** rng.integers(-30, 30, -(-n // INT8_BLOCK)), INT8_BLOCK)[:n].astype(dt)
    yield blocks


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(f"u{a.itemsize}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BFLOAT16])
@pytest.mark.parametrize("n", SIZES)
def test_same_bytes_and_decoded_bits_as_numpy(dtype: object, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for x in _inputs(dtype, n):
        got = {}
        for path in ("numba", "numpy"):
            _by(path, monkeypatch)
            data = compression.encode("int8", x)
            out = compression.decode("int8", data, np.empty(n, x.dtype))
            got[path] = data, _bits(out)
        assert np.array_equal(got["numba"][0], got["numpy"][0]), (x[:4], n)
        assert np.array_equal(got["numba"][1], got["numpy"][1]), (x[:4], n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [*SIZES, FOLD + 3 * INT8_BLOCK + 5])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX])
def test_fold_is_numpys_decode_then_add(dtype: object, n: int, op: ReduceOp, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    for x in _inputs(dtype, n):
        acc = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e30], n)).astype(dtype)
        acc[rng.integers(0, n, 2)] = [np.inf, np.nan]
        data = compression.encode("int8", x)
        _by("numpy", monkeypatch)
        want = acc.copy()
        reduce_into(op, want, compression.decode("int8", data, np.empty(n, acc.dtype)))
        _by("numba", monkeypatch)
        compression.fold("int8", op, acc, data, np.empty(min(n, FOLD), acc.dtype))
        assert np.array_equal(_bits(acc), _bits(want)), (x[:4], n)


def test_unaligned_and_read_only_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 5 * INT8_BLOCK + 3
    x = np.random.default_rng(8).standard_normal(n).astype(np.float32)
    got = {}
    for path in ("numba", "numpy"):
        _by(path, monkeypatch)
        shifted = np.empty(x.nbytes + 1, np.uint8)[1:].view(np.float32)  # unaligned input
        shifted[...] = x
        shifted.flags.writeable = False
        size = compression.encoded_nbytes("int8", x.dtype, n)
        raw = np.zeros(size + 1, np.uint8)
        compression.encode("int8", shifted, raw[1:])  # unaligned output
        data = bytes(raw[1:])  # read-only
        acc = np.ones(n, np.float32)
        compression.fold("int8", ReduceOp.SUM, acc, data, np.empty(n, np.float32))
        got[path] = data, _bits(compression.decode("int8", data, np.empty(n, np.float32))), _bits(acc)
    for a, b in zip(got["numba"], got["numpy"], strict=True):
        assert np.array_equal(np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8))


def test_kernels_refuse_what_they_do_not_take(monkeypatch: pytest.MonkeyPatch) -> None:
    _by("numba", monkeypatch)
    x = np.ones(2 * INT8_BLOCK, np.float16)
    scales, codes = np.empty(2, np.float32), np.empty(x.size, np.int8)
    assert not int8kernels.encode(x, scales, codes)  # float16: numpy's path
    assert not int8kernels.encode(np.ones(x.size, np.float32)[::-1][::-1][::2], scales[:1], codes[:INT8_BLOCK])
    assert not int8kernels.decode(scales, codes, np.empty(x.size, np.float64))  # scales of another dtype
    assert int8kernels.encode(np.ones(x.size, np.float32), scales, codes)
    assert np.array_equal(scales, np.full(2, np.float32(1) / np.float32(127))) and (codes == 127).all()


def test_off_and_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert numba_kernels({}) is True and numba_kernels({"NETCOLL_NUMBA_KERNELS": "0"}) is False
    with pytest.raises(ConfigError, match="NETCOLL_NUMBA_KERNELS"):
        numba_kernels({"NETCOLL_NUMBA_KERNELS": "yes"})
    _by("numpy", monkeypatch)  # turned off: numpy's path
    assert not int8kernels.decode(np.ones(1, np.float32), np.ones(1, np.int8), np.empty(1, np.float32))
    monkeypatch.setenv("NETCOLL_NUMBA_KERNELS", "1")
    monkeypatch.setattr(int8kernels, "_kernels", None)  # (both restored after the test)
    monkeypatch.setattr(int8kernels, "_failed", False)
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    x = np.random.default_rng(9).standard_normal(3 * INT8_BLOCK).astype(np.float32)
    assert not int8kernels.available()
    data = compression.encode("int8", x)  # numpy's path
    assert np.abs(compression.decode("int8", data, np.empty(x.size, np.float32)) - x).max() <= np.abs(x).max() / 254


def test_a_numba_that_cannot_compile_falls_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("no LLVM here")

    monkeypatch.setenv("NETCOLL_NUMBA_KERNELS", "1")
    monkeypatch.setattr(int8kernels, "_kernels", None)
    monkeypatch.setattr(int8kernels, "_failed", False)
    monkeypatch.setattr(int8kernels, "_compile", broken)
    x = np.arange(INT8_BLOCK + 3, dtype=np.float32)
    data = compression.encode("int8", x)  # numpy's path, once the warning is logged
    assert not int8kernels.available() and "did not compile" in caplog.text
    assert np.array_equal(compression.decode("int8", data, np.empty(x.size, np.float32))[[0, -1]], [0, x[-1]])


def test_the_fused_fold_records_its_reduction_span_when_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A traced job sees numba's fold as the ``reduce`` span ops' reductions record."""
    from netcoll.observe import TRACE, Recorder

    _by("numba", monkeypatch)
    x = np.random.default_rng(1).standard_normal(4 * INT8_BLOCK).astype(np.float32)
    acc, data = np.ones_like(x), compression.encode("int8", x)
    recorder = Recorder()
    token = TRACE.set(recorder)
    try:
        compression.fold("int8", ReduceOp.SUM, acc, data, np.empty(FOLD, np.float32))
    finally:
        TRACE.reset(token)
    assert [(name, args) for name, _, _, _, args in recorder.spans] == [("reduce", {"bytes": acc.nbytes, "op": "sum"})]
