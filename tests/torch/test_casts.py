"""netcoll.casts: the codecs' kernels through a loaded torch give the bits of the numpy path
(netcoll.half for float32 to fp16, numpy's casts otherwise) on every half and bfloat16
value and on float32 edge cases (subnormals, ties, the overflow edge, infinities); a NaN
stays a NaN (of its sign for fp16). compression.encode / decode / fold give the same
bytes and values with ``NETCOLL_TORCH_CASTS`` on and off."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from netcoll import casts, compression, half
from netcoll.errors import ConfigError
from netcoll.feedback import CHUNK, ErrorFeedback
from netcoll.ops import BFLOAT16, ReduceOp, reduce_into
from netcoll.settings import torch_casts

assert torch  # loaded: casts use it


@pytest.fixture
def numpy_only(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("NETCOLL_TORCH_CASTS", "0")
    monkeypatch.setenv("NETCOLL_NUMBA_KERNELS", "0")  # int8: torch's kernels against numpy's, not numba's
    return monkeypatch


def _torch_cast(src: np.ndarray, dtype: np.dtype) -> np.ndarray:
    dst = np.empty(src.size, dtype)
    assert casts.cast(src, dst)
    return dst


def _same_bits(got: np.ndarray, ref: np.ndarray, sign: bool = True) -> None:
    """Equal bits but for NaN payloads (a NaN both sides, of the same sign if ``sign``)."""
    nan = np.isnan(ref.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    width = np.uint16 if got.itemsize == 2 else np.uint32
    assert np.array_equal(got.view(width)[~nan], ref.view(width)[~nan])
    if sign:
        assert np.array_equal(np.signbit(got.astype(np.float32)[nan]), np.signbit(ref.astype(np.float32)[nan]))


def test_every_half_and_bfloat16_decodes_the_same() -> None:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ref = np.empty(bits.size, np.float32)
    half.decode(bits, ref)
    _same_bits(_torch_cast(bits.view(np.float16), np.dtype(np.float32)), ref)
    _same_bits(_torch_cast(bits.view(BFLOAT16), np.dtype(np.float32)), bits.view(BFLOAT16).astype(np.float32))


def _edges() -> np.ndarray:
    """float32 values around every half and bfloat16 value (the ties between neighbours
    and one float32 ulp either side), subnormals of both, the overflow edge, specials."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = [h.view(t).astype(np.float32).view(np.uint32) for t in (np.float16, BFLOAT16)]
    ties = [v[np.isfinite(v.view(np.float32))] for v in values]
    ties[0] = ties[0] + np.uint32(1 << 12)  # half's dropped 13 bits: 1000...0 is the tie (same sign)
    ties[1] = ties[1] + np.uint32(1 << 15)  # bfloat16's dropped 16 bits
    mids = np.concatenate(ties)
    special = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 1, 0x807FFFFF]
    special += [0x477FF000, 0x477FEFFF, 0x477FF001, 0x7F7FFFFF, 0x33000000, 0x33000001, 0x32FFFFFF]
    rng = np.random.default_rng(36)
    anything = rng.integers(0, 1 << 32, size=1 << 18, dtype=np.uint64).astype(np.uint32)
    near = [mids, mids - np.uint32(1), mids + np.uint32(1)]
    out = np.concatenate([*values, *near, np.array(special, np.uint32), anything])
    return out.view(np.float32)


def test_float32_encodes_the_same_bits() -> None:
    x = _edges()
    ref16 = np.empty(x.size, np.uint16)
    half.encode(x, ref16)
    _same_bits(_torch_cast(x, np.dtype(np.float16)), ref16.view(np.float16))
    with np.errstate(all="ignore"):
        ref_bf = x.astype(BFLOAT16)
    _same_bits(_torch_cast(x, BFLOAT16), ref_bf, sign=False)  # (torch's bfloat16 NaN is 0x7fc0)


@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8", "none"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16])
def test_the_codecs_give_the_same_bytes_either_way(codec: str, dtype: np.dtype, numpy_only: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    n = compression.FOLD + 1000  # several of fold's pieces, the last a partial int8 block
    x = (rng.standard_normal(n) * np.float32(1e-3)).astype(dtype)
    x[:4] = np.array([np.inf, -np.inf, 0.0, -0.0], np.float32).astype(dtype)
    x[3 * compression.INT8_BLOCK : 4 * compression.INT8_BLOCK] = 0  # an all-zero block
    if codec == "int8":  # (fp16 and bf16 may give other NaN bits)
        x[1000] = np.nan
    acc = rng.standard_normal(n).astype(dtype)
    runs = []
    for on in ("0", "1"):
        numpy_only.setenv("NETCOLL_TORCH_CASTS", on)
        wire = compression.encode(codec, x)
        out = compression.decode(codec, wire, np.empty(n, dtype))
        folded = acc.copy()
        compression.fold(codec, ReduceOp.SUM, folded, wire, np.empty(compression.FOLD, dtype))
        runs.append((wire, out, folded))
    (w0, o0, f0), (w1, o1, f1) = runs
    assert np.array_equal(w0, w1)
    assert np.array_equal(o0.view(np.uint8), o1.view(np.uint8))
    assert np.array_equal(f0.view(np.uint8), f1.view(np.uint8))
    want = acc.copy()
    reduce_into(ReduceOp.SUM, want, o0)  # fold: decode then reduce, bit for bit
    assert np.array_equal(f0.view(np.uint8), want.view(np.uint8))


def _awkward_int8_blocks() -> np.ndarray:
    """float32 blocks across more than one of int8's torch groups and chunks: ties of every
    code (scales 1 and 2), zero, negative-zero and mixed-zero blocks, NaN, +-inf, the largest
    float, subnormal scales (whose inverse overflows), NaN and zero blocks at chunk and group
    edges, a partial last block."""
    b = compression.INT8_BLOCK
    nb = compression.GROUP + compression.ROWS + 3
    x = (np.random.default_rng(36).standard_normal(nb * b) * 3).astype(np.float32).reshape(nb, b)
    x[0] = np.arange(b) % 254 - 127 + np.float32(0.5)
    x[0, 0] = 127  # scale 1: every x.5 a tie
    x[1] = (np.arange(b) % 127) * 2 + 1
    x[1, 0] = 254  # scale 2, odd values: ties
    x[2], x[3], x[4] = 0.0, -0.0, np.where(np.arange(b) % 2, 0.0, -0.0)
    x[5, 7], x[6, 9], x[7, 1], x[8] = np.nan, np.inf, -np.inf, np.nan
    x[9] = np.float32(3.4e38) * np.sign(x[9])
    x[10], x[11], x[12] = 1e-45, np.float32(1e-38) * np.sign(x[11]), np.float32(1.5e-43)
    x[13] = (np.arange(b) - 256) * np.float32(1e-40)
    x[compression.ROWS - 1, 3], x[compression.ROWS] = np.nan, -0.0
    x[compression.TORCH_ROWS - 1, 5], x[compression.TORCH_ROWS + 1] = np.inf, 0.0
    x[compression.GROUP - 1, 0], x[compression.GROUP] = np.nan, 0.0
    x[-1, -200] = -np.inf
    return x.reshape(-1)[:-100]


def test_int8_encodes_awkward_values_to_the_same_bytes(numpy_only: pytest.MonkeyPatch) -> None:
    x = _awkward_int8_blocks()
    ref = compression.encode("int8", x)
    numpy_only.setenv("NETCOLL_TORCH_CASTS", "1")
    assert np.array_equal(compression.encode("int8", x), ref)
    nb = -(-x.size // compression.INT8_BLOCK)
    scales, codes = ref[: 4 * nb].view(np.float32), ref[4 * nb :].view(np.int8)
    assert scales[0] == 1 and scales[1] == 2 and np.isnan(scales[5:9]).all()
    assert not np.signbit(scales[2:5]).any() and not codes[2 * 512 : 5 * 512].any()
    assert np.array_equal(codes[:8], np.rint(x[:8]).astype(np.int8))  # ties to even
    for start in (0, 37, compression.ROWS * 512 - 5):  # every slice of whole blocks: that part of the bytes
        part = x[start // 512 * 512 : start // 512 * 512 + 300 * 512]
        got = compression.encode("int8", part)
        numpy_only.setenv("NETCOLL_TORCH_CASTS", "0")
        assert np.array_equal(got, compression.encode("int8", part))
        numpy_only.setenv("NETCOLL_TORCH_CASTS", "1")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_int8_blocks_of_tiny_values_keep_the_error_bound(dtype: type, numpy_only: pytest.MonkeyPatch) -> None:
    """A block whose scale is subnormal (its inverse overflows): codes from ``x / scale``,
    not ``inf * x`` cast to int8 (undefined; all zeros here), within absmax / 254 of the
    input after the round trip, the same bytes through torch and numpy."""
    tiny = np.finfo(dtype).smallest_normal * 8
    rng = np.random.default_rng(7)
    x = (rng.uniform(-1, 1, 6 * compression.INT8_BLOCK) * tiny).astype(dtype)
    x[compression.INT8_BLOCK : 2 * compression.INT8_BLOCK] = 1.0  # an ordinary block between
    x[-compression.INT8_BLOCK :] = np.finfo(dtype).smallest_subnormal * np.arange(compression.INT8_BLOCK)
    step = float(np.finfo(dtype).smallest_subnormal)  # a subnormal scale's own rounding, times 127 codes
    got = []
    for on in ("0", "1"):
        numpy_only.setenv("NETCOLL_TORCH_CASTS", on)
        got.append(compression.encode("int8", x))
    assert np.array_equal(got[0], got[1])
    back = compression.decode("int8", got[0], np.empty_like(x))
    for block in range(6):
        part = slice(block * compression.INT8_BLOCK, (block + 1) * compression.INT8_BLOCK)
        bound = np.abs(x[part]).max() / 254 * (1 + 1e-6) + 128 * step
        assert np.abs(back[part] - x[part]).max() <= bound, block
    assert np.count_nonzero(back[: compression.INT8_BLOCK]) > compression.INT8_BLOCK // 2


@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("offset", [0, 1, 4])
def test_fold_of_whole_pieces_from_any_offset_is_the_same(
    codec: str, offset: int, numpy_only: pytest.MonkeyPatch
) -> None:
    """fold's tensors made once per array (several whole pieces, bytes at any alignment in a
    received buffer): the bits of numpy's path."""
    n = 2 * compression.FOLD + compression.INT8_BLOCK
    x = np.random.default_rng(offset).standard_normal(n).astype(np.float32)
    x[5], x[compression.FOLD + 7] = np.nan, -np.inf
    size = compression.encoded_nbytes(codec, x.dtype, n)
    received = np.zeros(size + 8, np.uint8)
    wire = received[offset : offset + size]
    compression.encode(codec, x, wire)
    acc = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    got = []
    for on in ("1", "0"):
        numpy_only.setenv("NETCOLL_TORCH_CASTS", on)
        folded = acc.copy()
        compression.fold(codec, ReduceOp.SUM, folded, wire, np.empty(compression.FOLD, np.float32))
        got.append(folded)
    assert np.array_equal(got[0].view(np.uint32), got[1].view(np.uint32))  # (NaN bits too: decoded from the same NaN)


def test_a_read_only_view_casts_through_torch() -> None:
    x = np.linspace(-2, 2, 1000, dtype=np.float32)
    view = x.view()
    view.flags.writeable = False  # as the algorithms pass an input they must not write
    assert np.array_equal(_torch_cast(view, np.dtype(np.float16)), x.astype(np.float16))
    frozen = np.frombuffer(x.tobytes(), np.float32)  # memory that cannot be written at all: numpy's cast
    assert not casts.cast(frozen, np.empty(frozen.size, np.float16))
    assert np.array_equal(compression.encode("fp16", frozen).view(np.float16), x.astype(np.float16))


def test_the_setting_turns_torch_off(numpy_only: pytest.MonkeyPatch) -> None:
    assert casts.torch() is None
    assert not casts.cast(np.zeros(4, np.float32), np.empty(4, np.float16))
    numpy_only.setenv("NETCOLL_TORCH_CASTS", "1")
    assert casts.torch() is torch
    assert not casts.cast(np.zeros(4, np.float64), np.empty(4, np.float16))  # float64: numpy's
    assert torch_casts({}) is True and torch_casts({"NETCOLL_TORCH_CASTS": "0"}) is False
    with pytest.raises(ConfigError, match="NETCOLL_TORCH_CASTS"):
        torch_casts({"NETCOLL_TORCH_CASTS": "yes"})


@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8"])
def test_error_feedback_keeps_the_same_residuals_either_way(codec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ErrorFeedback's round trip goes through the codec, so through torch here: the same
    compensated inputs and residuals as with numpy's casts, step after step."""
    fast = ErrorFeedback(codec, rank=1, world_size=3)
    plain = ErrorFeedback(codec, rank=1, world_size=3)
    rng = np.random.default_rng(5)
    for step in range(4):
        x = (rng.standard_normal(2 * CHUNK + 1001) * 1e-5).astype(np.float32)  # gradient-sized: subnormal halves
        a = fast.compensate(0, x)
        monkeypatch.setenv("NETCOLL_TORCH_CASTS", "0")
        b = plain.compensate(0, x)
        monkeypatch.delenv("NETCOLL_TORCH_CASTS")
        assert np.array_equal(a, b), (codec, step)
        ra, rb = fast.residual(0), plain.residual(0)
        assert ra is not None and rb is not None and np.array_equal(ra, rb), (codec, step)
        assert np.abs(ra).max() > 0
