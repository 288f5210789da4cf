"""Codecs of compressed collectives: pure functions from a float array to raw bytes and back.

A compressed collective (``compression=`` on all_reduce, reduce_scatter, all_gather,
broadcast and reduce) sends each contribution through one of these codecs; the bytes
travel like any other chunk (msgpack header + raw payload, never pickled). Receivers
decode into the input's dtype and reduce there (never in fp16 unless the input is fp16).

============  ==================================================  ===========================
codec         payload of ``n`` elements                            bytes per float32 element
============  ==================================================  ===========================
``"none"``    the input itself (today's path, unchanged)            4
``"fp16"``    IEEE half, round to nearest even                      2
``"bf16"``    bfloat16, round to nearest even (``ml_dtypes``)       2
``"int8"``    per block of :data:`INT8_BLOCK` elements: a scale     1 + 4/512
              (``absmax / 127``; float64 for float64 input, else
              float32), then the ``int8`` codes
              ``round(x / scale)`` in ``[-127, 127]``
============  ==================================================  ===========================

Inputs: float16, bfloat16, float32, float64 (:func:`check_codec` refuses integer, bool
and complex dtypes with a ValueError). Decoding ``encode(x)`` gives ``x`` back within:

* ``fp16``: relative ``2**-11`` for ``|x|`` in ``[6.1e-5, 65504]``, absolute ``2**-25``
  below; beyond ``65504`` a value becomes ``inf`` (as an IEEE cast does: use ``bf16`` for
  wide-range data). An fp16 input is sent as it is (lossless).
* ``bf16``: relative ``2**-8`` over float32's normal range (absolute ``1.2e-38`` among
  subnormals, which may flush to zero). A bf16 input is lossless.
* ``int8``: absolute ``scale / 2`` = ``absmax(block) / 254`` per element (a block's
  largest value is exact up to the scale's rounding).

Non-finite values: ``fp16`` and ``bf16`` keep ``inf`` and ``nan`` as they are. ``int8``
cannot represent them: a block holding any ``inf`` or ``nan`` gets a NaN scale, so its
whole block of :data:`INT8_BLOCK` elements decodes to NaN (a diverged value stays
visible after the reduction, as it would in an uncompressed sum). Zeros decode to zeros
exactly (an all-zero block has scale +0).
"""

from __future__ import annotations

from typing import Any, Final, Literal, NamedTuple, get_args

import numpy as np

from . import casts, half, int8kernels, settings
from .ops import BFLOAT16, ReduceOp, reduce_into

__all__ = [
    "CODECS",
    "INT8_BLOCK",
    "NONE",
    "Compression",
    "Requested",
    "check_codec",
    "decode",
    "default_compression",
    "encode",
    "encoded_nbytes",
    "error_bound",
    "fold",
    "parse_compression",
    "resolve",
]

Compression = Literal["none", "fp16", "bf16", "int8"]
CODECS: Final[tuple[str, ...]] = get_args(Compression)

#: Elements per int8 block (one scale each): 512 elements are at most 4 KiB of input for
#: every dtype (float64: 4096 bytes), 512 bytes of codes.
INT8_BLOCK: Final = 512

#: The dtypes a codec takes (float16, bfloat16, float32, float64).
FLOATS: Final = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64))

ENV: Final = "NETCOLL_COMPRESSION"


def parse_compression(value: object, what: str = "compression") -> str:
    """``value`` as a codec name; a ValueError naming ``what`` for anything else."""
    if not isinstance(value, str) or value.strip().lower() not in CODECS:
        raise ValueError(f"{what} must be one of {', '.join(CODECS)}, not {value!r}")
    return value.strip().lower()


def default_compression() -> str:
    """The codec of a call that passes none: ``NETCOLL_COMPRESSION``, else ``"none"``."""
    return settings.compression()


class Requested(NamedTuple):
    """The codec a call asks for: its own ``compression=`` (``explicit``: refusals are
    strict), or ``NETCOLL_COMPRESSION``'s default (which applies only where it can:
    :func:`netcoll.calls.compressed.applies`)."""

    codec: str
    explicit: bool


#: no compression (today's path)
NONE: Final = Requested("none", True)


def resolve(value: object) -> Requested:
    """What a call asks for: its ``compression=`` (``None``: the default)."""
    if value is None:
        return Requested(default_compression(), False)
    return Requested(parse_compression(value), True)


def compressible(dtype: np.dtype) -> bool:
    """Whether the codecs take ``dtype`` (float16, bfloat16, float32, float64)."""
    return np.dtype(dtype) in FLOATS


def check_codec(codec: str, dtype: np.dtype, what: str) -> None:
    """A ValueError unless ``codec`` can compress ``dtype`` (any for ``"none"``)."""
    if codec != "none" and np.dtype(dtype) not in FLOATS:
        raise ValueError(
            f"{what}: compression={codec!r} needs a float16, bfloat16, float32 or float64 input, "
            f"not {np.dtype(dtype)} (integer, bool and complex data are sent uncompressed: compression='none')"
        )


#: the largest error of one encoding, relative to the block's (int8) or the value's magnitude
UNIT: Final = {"none": 0.0, "fp16": 2.0**-11, "bf16": 2.0**-8, "int8": 1 / 254}


def error_bound(codec: str, magnitude: float, contributions: int) -> float:
    """The largest error the codec adds to a reduction of ``contributions`` values of
    magnitude at most ``magnitude`` (one encoding of each, one of the result; fp16 within
    its range): ``2 n UNIT[codec] magnitude``. Rounding of the additions in the input
    dtype comes on top (none for the small integers of generated data)."""
    return 2 * contributions * UNIT[codec] * magnitude


def _wire_dtype(codec: str) -> np.dtype:
    return np.dtype(np.float16) if codec == "fp16" else BFLOAT16


def _scale_dtype(dtype: np.dtype) -> np.dtype:
    """int8's scales and arithmetic: float64 for float64, else float32 (exact for float16, bfloat16)."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _blocks(n: int) -> int:
    return -(-n // INT8_BLOCK)


def encoded_nbytes(codec: str, dtype: np.dtype, n: int) -> int:
    """Bytes of ``n`` elements of ``dtype`` encoded by ``codec`` (a function of sizes
    only, so every rank sizes the same buffers the same way)."""
    dtype = np.dtype(dtype)
    if codec in ("fp16", "bf16"):
        return 2 * n
    if codec == "int8":
        return n + _blocks(n) * _scale_dtype(dtype).itemsize
    if codec == "none":
        return n * dtype.itemsize
    raise ValueError(f"unknown codec {codec!r}")


def encode(codec: str, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``x`` (any shape; read as flat) encoded: a ``uint8`` array of
    :func:`encoded_nbytes` bytes (written into ``out`` when given)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    size = encoded_nbytes(codec, flat.dtype, flat.size)
    dst = np.empty(size, np.uint8) if out is None else out
    if dst.dtype != np.uint8 or dst.size != size:
        raise ValueError(f"encode: out must be {size} uint8 bytes, not {dst.size} {dst.dtype}")
    if codec == "none":
        dst[...] = flat.view(np.uint8)
    elif codec in ("fp16", "bf16"):
        _encode_half(codec, flat, dst.view(_wire_dtype(codec)))
    else:
        _encode_int8(flat, dst)
    return dst


def _encode_half(codec: str, flat: np.ndarray, wire: np.ndarray) -> None:
    """fp16 or bf16: torch's cast when loaded (:mod:`netcoll.casts`), else :mod:`netcoll.half`
    (float32 to fp16) or numpy's cast: the same bits."""
    if casts.cast(flat, wire):
        return
    if codec == "fp16" and flat.dtype == np.float32:
        half.encode(flat, wire.view(np.uint16))
        return
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        wire[...] = flat


def decode(codec: str, data: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Decode the bytes ``data`` into the flat array ``out`` (whose dtype and size say
    what was encoded); returns ``out``."""
    raw = _checked(codec, data, out)
    if codec == "int8":
        nb = _blocks(out.size) * _scale_dtype(out.dtype).itemsize
        _decode_int8(raw[:nb].view(_scale_dtype(out.dtype)), raw[nb:].view(np.int8), out)
    else:
        _decode_plain(codec, raw, out)
    return out


def _checked(codec: str, data: Any, out: np.ndarray) -> np.ndarray:
    """``data`` as flat bytes, checked to be the encoding of ``out``'s size and dtype."""
    raw = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    size = encoded_nbytes(codec, out.dtype, out.size)
    if raw.size != size:
        raise ValueError(f"decode: {raw.size} bytes, but {out.size} {out.dtype} elements encode to {size}")
    return raw


def _decode_plain(codec: str, raw: np.ndarray, out: np.ndarray) -> None:
    """none, fp16 or bf16 bytes into ``out`` (fp16 and bf16: torch's cast when loaded, else
    :mod:`netcoll.half` for fp16 into float32, else numpy's: the same bits)."""
    if codec == "none":
        out.view(np.uint8)[...] = raw
        return
    wire = raw.view(_wire_dtype(codec))
    if out.flags.c_contiguous and casts.cast(wire, out):
        return
    if codec == "fp16" and out.dtype == np.float32 and out.flags.c_contiguous:
        half.decode(raw.view(np.uint16), out.reshape(-1))
        return
    with np.errstate(over="ignore", invalid="ignore"):
        out[...] = wire


#: Elements :func:`fold` decodes at a time (512 KiB of float32: still in cache when reduced).
FOLD: Final = 1 << 17


def fold(codec: str, op: Any, out: np.ndarray, data: Any, scratch: np.ndarray) -> None:
    """``out = out (op) decode(data)`` (``op`` a :class:`~netcoll.ops.ReduceOp`): the
    bits of :func:`decode` into a copy then :func:`~netcoll.ops.reduce_into`, but decoded
    :data:`FOLD` elements at a time into ``scratch`` (flat, ``out``'s dtype, at least
    ``min(FOLD, out.size)`` elements), so each decoded piece is reduced from cache (int8's
    SUM of float32 or float64: numba's fused pass when it can, :mod:`netcoll.int8kernels`)."""
    raw, flat = _checked(codec, data, out), out.reshape(-1)
    n, step = flat.size, min(FOLD, flat.size) or 1  # an empty input: no piece
    nb = _blocks(n) * _scale_dtype(out.dtype).itemsize if codec == "int8" else 0
    scales = raw[:nb].view(_scale_dtype(out.dtype))
    if nb and op in (ReduceOp.SUM, ReduceOp.AVG) and int8kernels.fold_sum(scales, raw[nb:].view(np.int8), flat):
        return  # numba's SUM fold in one pass (float32, float64)
    each = 1 if codec == "int8" else encoded_nbytes(codec, out.dtype, 1)
    fast = _fold_caster(codec, raw, nb, n, scratch[:step])
    whole = n // INT8_BLOCK * INT8_BLOCK if codec == "int8" else n
    for i in range(0, n, step):
        j = min(n, i + step)
        part = scratch[: j - i]
        if fast is not None and j <= whole and codec == "int8":
            fast(i // INT8_BLOCK, j // INT8_BLOCK)  # torch's, over tensors made once (FOLD: whole blocks)
        elif codec == "int8":
            _decode_int8(scales[i // INT8_BLOCK : _blocks(j)], raw[nb + i : nb + j].view(np.int8), part)
        elif fast is not None:
            fast(i, j)  # torch's cast of fp16 or bf16, over tensors made once
        else:
            _decode_plain(codec, raw[i * each : j * each], part)
        reduce_into(op, flat[i:j], part)


def _fold_caster(codec: str, raw: np.ndarray, nb: int, n: int, scratch: np.ndarray) -> casts.Caster | None:
    """torch's kernels over all of ``raw`` and ``scratch`` for :func:`fold` (fp16 or bf16 into
    float32, float16 or bfloat16; int8's whole blocks into float32), or None (numpy's)."""
    if codec in ("fp16", "bf16"):
        return casts.caster(raw.view(_wire_dtype(codec)), scratch)
    whole = n // INT8_BLOCK * INT8_BLOCK
    if codec != "int8" or scratch.dtype != np.float32 or not whole or scratch.size % INT8_BLOCK:
        return None
    if raw.ctypes.data % 4:  # scales not aligned for a float32 tensor: numpy's (as decode copies them)
        return None
    codes = raw[nb : nb + whole].view(np.int8).reshape(-1, INT8_BLOCK)
    rows = scratch.reshape(-1, INT8_BLOCK)
    return casts.int8_scaler(codes, raw[:nb].view(np.float32)[: whole // INT8_BLOCK], rows)


#: Blocks the int8 codec handles at a time (512 KiB of float32: its scratch stays in cache).
ROWS: Final = 256
#: Blocks whose scales torch's int8 path computes at once (2 MiB of float32, :data:`TORCH_ROWS`
#: at a time: the numpy of the scales once per group, not per chunk).
GROUP: Final = 1024
#: Blocks torch's int8 encoding handles at a time (256 KiB of float32: 1.33-1.42 ns an element
#: against 256 blocks' 1.39-1.60, 64's 1.8, 512's 1.7-1.96; CPU time, 2 MiB inputs, loaded VM).
TORCH_ROWS: Final = 128


def _encode_int8(flat: np.ndarray, dst: np.ndarray) -> None:
    """Per :data:`ROWS` blocks (:data:`GROUP` through torch): their scales, then codes
    ``rint(x * (1 / scale))`` through a scratch that stays in cache, rounded and cast
    straight into the codes."""
    n, nb = flat.size, _blocks(flat.size)
    sdt = _scale_dtype(flat.dtype)
    scales, codes = dst[: nb * sdt.itemsize].view(sdt), dst[nb * sdt.itemsize :].view(np.int8)
    if not n or int8kernels.encode(flat, scales, codes):  # numba's fused kernel: float32, float64
        return
    work = sdt.type
    pad = nb * INT8_BLOCK - n
    blocks = (flat if not pad else np.concatenate([flat, np.zeros(pad, flat.dtype)])).reshape(nb, INT8_BLOCK)
    out = (codes if not pad else np.empty(nb * INT8_BLOCK, np.int8)).reshape(nb, INT8_BLOCK)
    scratch = np.empty((min(ROWS, nb), INT8_BLOCK), work)
    kernels = casts.int8_rows(blocks, out, scratch[:TORCH_ROWS])
    with np.errstate(invalid="ignore", over="ignore", divide="ignore", under="ignore"):
        for i in range(0, nb, ROWS if kernels is None else GROUP):
            if kernels is None:
                j = min(nb, i + ROWS)
                _scale_rows(blocks[i:j], scales[i:j], out[i:j], scratch, work)
            else:
                j = min(nb, i + GROUP)
                _scale_rows_torch(kernels, i, j, scales[i:j], out[i:j], work)
                _tiny_rows(blocks[i:j], scales[i:j], kernels.inverse[i:j], out[i:j])
    if pad:
        codes[...] = out.reshape(-1)[:n]


def _scales(
    absmax: np.ndarray, scales: np.ndarray, work: Any, inverse: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Some blocks' ``scales`` from their ``absmax`` (NaN where not finite), and the inverse
    of each (0 where the scale is 0 or NaN, whose block's codes are all 0; into ``inverse``
    when given); with the mask of the blocks whose scale is usable. (The scale dtype is the
    work dtype: as the receiver sees it.)"""
    scales[...] = np.where(np.isfinite(absmax), absmax / work(127), np.nan)
    usable = scales > 0  # NaN is not
    if inverse is None:
        inverse = np.zeros(scales.shape, work)
    else:
        inverse[...] = 0
    np.divide(work(1), scales, out=inverse, where=usable)
    return inverse, usable


def _scale_rows_torch(
    kernels: casts.Int8Rows, i: int, j: int, scales: np.ndarray, codes: np.ndarray, work: Any
) -> None:
    """:func:`_scale_rows` of blocks ``i:j`` through torch's kernels (the same bits)."""
    _, usable = _scales(kernels.absmax(i, j), scales, work, kernels.inverse[i:j])
    kernels.encode(i, j)
    if not usable.all():
        codes[~usable] = 0


def _scale_rows(rows: np.ndarray, scales: np.ndarray, codes: np.ndarray, scratch: np.ndarray, work: Any) -> None:
    """The scales and codes of some whole blocks (a block holding inf or NaN: a NaN
    scale and zero codes; an all-zero block: scale 0, zero codes)."""
    tmp = scratch[: rows.shape[0]]
    np.abs(rows, out=tmp)  # (in cache: half the time of a max and a min over the rows)
    inverse, usable = _scales(tmp.max(axis=1), scales, work)  # inf or NaN: non-finite
    np.multiply(rows, inverse[:, None], out=tmp)
    np.rint(tmp, out=codes, casting="unsafe")  # |x / scale| <= 127
    if not usable.all():
        codes[~usable] = 0
    _tiny_rows(rows, scales, inverse, codes)


def _tiny_rows(rows: np.ndarray, scales: np.ndarray, inverse: np.ndarray, codes: np.ndarray) -> None:
    """Blocks whose scale is so small (subnormal) that its inverse overflowed to inf: their
    codes again, ``rint(x / scale)`` in float64 (finite, at most 127 in magnitude), instead
    of ``inf * x`` cast to int8 (undefined in C: 0 on x86, other bytes elsewhere, and the
    block decoded as zeros, outside the codec's error bound)."""
    tiny = np.isinf(inverse) & (scales > 0)
    if not tiny.any():
        return
    exact = rows[tiny].astype(np.float64) / scales[tiny].astype(np.float64)[:, None]
    codes[tiny] = np.clip(np.rint(exact), -127, 127).astype(np.int8)


def _decode_int8(scales: np.ndarray, codes: np.ndarray, out: np.ndarray) -> None:
    """``codes * scale`` per block (``scales`` one per block of ``codes``), cast into
    ``out`` in one pass."""
    flat, n = out.reshape(-1), out.size
    if not n or int8kernels.decode(scales, codes, flat):  # numba's fused kernel: float32, float64
        return
    work = _scale_dtype(out.dtype).type
    whole = n // INT8_BLOCK * INT8_BLOCK
    per = scales.astype(work)
    with np.errstate(invalid="ignore", over="ignore"):
        if whole and flat.dtype == work:
            rows = flat[:whole].reshape(-1, INT8_BLOCK)
            _scale_codes(codes[:whole].reshape(-1, INT8_BLOCK), per[: rows.shape[0]], rows)
        elif whole:
            rows = flat[:whole].reshape(-1, INT8_BLOCK)
            np.multiply(
                codes[:whole].reshape(-1, INT8_BLOCK),
                per[: whole // INT8_BLOCK, None],
                out=rows,
                dtype=work,
                casting="unsafe",
            )
        if whole < n:
            flat[whole:] = codes[whole:].astype(work) * per[-1]


def _scale_codes(codes: np.ndarray, per: np.ndarray, rows: np.ndarray) -> None:
    """``rows = codes * per`` (one scale per row), :data:`ROWS` rows at a time: the codes cast
    into the rows (exact), then scaled in place while still in cache (one rounding, as
    a product in ``rows``' dtype: the bits of a mixed multiply, without its buffering)."""
    if casts.scale_codes(codes, per, rows, ROWS):
        return
    for i in range(0, rows.shape[0], ROWS):
        part = rows[i : i + ROWS]
        part[...] = codes[i : i + ROWS]
        np.multiply(part, per[i : i + ROWS, None], out=part)
