"""The int8 codec's kernels fused in numba (the optional extra ``netcoll[numba]``): one pass
per block for encoding, one for decoding, one for a SUM fold, on float32 and float64.

The same bytes and bits as :mod:`netcoll.compression`'s numpy path (and :mod:`netcoll.casts`'
torch path), for every input, so ranks may mix paths: each value goes through the very IEEE
operations of those paths, in the work dtype (float32 for float32, float64 for float64), one
rounding each, no fastmath and no FMA contraction (numba's default). A block's largest ``|x|``
is the largest of its elements' bits with the sign cleared (the order of non-negative IEEE
values is that of their bits): at or above infinity's bits the block holds an inf or a NaN and
gets a NaN scale and zero codes, as ``np.where(np.isfinite(absmax), absmax / 127, np.nan)``
does; a scale that is not positive (0 or NaN) zeroes the codes; a subnormal scale whose inverse
overflows gets its codes from ``rint(x / scale)`` in float64, clipped to 127 (``_tiny_rows``).
float16 and bfloat16 stay on numpy's path (numba has no such arithmetic).

CPU time per element of 4 Mi float32 on this project's VM (2 cores, AVX-512; best of 7, load
2 to 4, other processes running; ``python3 -m bench.int8kernels``)::

    kernel        numba         torch (casts)   numpy
    encode        0.31-0.32 ns  1.29-1.48 ns    1.38-1.71 ns
    decode        0.20-0.21 ns  0.42-0.51 ns    0.49-0.56 ns
    fold (SUM)    0.19-0.20 ns  0.57-0.69 ns    0.86-0.90 ns   (decode then add, a piece at a time)

Used when numba can be imported and ``NETCOLL_NUMBA_KERNELS`` is not ``0``. numba is imported
and the kernels compiled on a process's first int8 use: ``cache=True`` compiles them once into
numba's cache (``__pycache__`` beside this file, or numba's cache directory), about 2.2 s; later
processes import numba (0.3-0.8 s) and load them (0.4-1.1 s) on that first call. The process's
resident memory grows by about 130 MB then (numba and LLVM, most of it shared library pages).
Each function returns False when it did nothing (no numba, turned off, another dtype, an array
that is not contiguous): the caller then runs numpy's or torch's path.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Final

import numpy as np

from . import settings
from .observe import TRACE, now

__all__ = ["available", "decode", "encode", "fold_sum"]

#: Elements per block: netcoll.compression.INT8_BLOCK (checked there).
BLOCK: Final = 512

#: per work dtype: (the unsigned integer of its bits, the sign's mask cleared, infinity's bits)
_BITS: Final = {
    np.dtype(np.float32): (np.uint32, np.uint32(0x7FFFFFFF), np.uint32(0x7F800000)),
    np.dtype(np.float64): (np.uint64, np.uint64(0x7FFFFFFFFFFFFFFF), np.uint64(0x7FF0000000000000)),
}

log = logging.getLogger(__name__)

_kernels: dict[str, Any] | None = None  # name -> compiled kernel, once loaded
_failed = False  # numba is missing or did not compile: never try again in this process


def _compile() -> dict[str, Any]:
    """numba's kernels, compiled for their argument types only (raises ImportError without numba)."""
    numba = importlib.import_module("numba")
    nt, options = numba.types, {"cache": True, "nogil": True, "boundscheck": False, "error_model": "numpy"}

    def arr(dtype: Any, writeable: bool = False) -> Any:  # unaligned (and read-only): any array converts
        return nt.Array(numba.from_dtype(np.dtype(dtype)), 1, "C", readonly=not writeable, aligned=False)

    def jit(fn: Any, *signatures: tuple[Any, ...]) -> Any:
        return numba.njit([nt.none(*a) for a in signatures], **options)(fn)

    def encoder(uint: Any, real: Any) -> Any:
        def encode(x: Any, bits: Any, scales: Any, codes: Any, mask: Any, inf: Any) -> None:
            one, c127, nan, n = real(1), real(127), real(np.nan), x.size
            for b in range(scales.size):
                lo = b * BLOCK
                hi = min(lo + BLOCK, n)
                xs, cs = x[lo:hi], codes[lo:hi]  # (slices: the loops vectorize)
                ws, m = bits[lo:hi], uint(bits[lo] & mask)
                for k in range(1, ws.size):
                    m = max(m, uint(ws[k] & mask))  # the largest |x|'s bits
                if m >= inf:  # an inf or NaN in the block
                    scales[b] = nan
                    cs[:] = 0
                    continue
                s = uint(m).view(real) / c127
                scales[b] = s
                if not s > 0:
                    cs[:] = 0
                    continue
                inv = one / s
                if inv == np.inf:  # a subnormal scale: float64's rint(x / scale), clipped
                    for k in range(xs.size):
                        q = np.rint(np.float64(xs[k]) / np.float64(s))
                        cs[k] = np.int8(min(max(q, -127.0), 127.0))
                else:
                    for k in range(xs.size):
                        cs[k] = np.int8(np.rint(xs[k] * inv))

        word = numba.from_dtype(np.dtype(uint))
        return jit(encode, (arr(real), arr(uint), arr(real, True), arr(np.int8, True), word, word))

    def decode(scales: Any, codes: Any, out: Any) -> None:
        for b in range(scales.size):
            lo = b * BLOCK
            s, cs, ys = scales[b], codes[lo : lo + BLOCK], out[lo : lo + BLOCK]
            for k in range(ys.size):
                ys[k] = cs[k] * s

    def fold_sum(scales: Any, codes: Any, out: Any) -> None:
        for b in range(scales.size):
            lo = b * BLOCK
            s, cs, ys = scales[b], codes[lo : lo + BLOCK], out[lo : lo + BLOCK]
            for k in range(ys.size):
                v = cs[k] * s  # rounded to the work dtype, then added: decode's bits, then add's
                ys[k] = ys[k] + v

    both = [(arr(real), arr(np.int8), arr(real, True)) for real in (np.float32, np.float64)]
    return {
        "encode32": encoder(np.uint32, np.float32),
        "encode64": encoder(np.uint64, np.float64),
        "decode": jit(decode, *both),
        "fold_sum": jit(fold_sum, *both),
    }


def _get() -> dict[str, Any] | None:
    """The kernels when they may be used (compiled on the first call), else None."""
    global _kernels, _failed
    if _kernels is None and not _failed and settings.numba_kernels():
        try:
            _kernels = _compile()
        except ImportError:
            _failed = True
        except Exception:  # a numba that cannot build these kernels (logged, exc_info): numpy's path
            _failed = True
            log.warning("netcoll: numba's int8 kernels did not compile; the int8 codec runs numpy's", exc_info=True)
    return _kernels if _kernels is not None and settings.numba_kernels() else None


def available() -> bool:
    """Whether the kernels are in use (numba importable, ``NETCOLL_NUMBA_KERNELS`` not ``0``)."""
    return _get() is not None


def _plain(*arrays: np.ndarray) -> bool:
    return all(a.ndim == 1 and a.flags.c_contiguous for a in arrays)


def encode(flat: np.ndarray, scales: np.ndarray, codes: np.ndarray) -> bool:
    """``scales`` (one a block, the work dtype) and int8 ``codes`` of the flat float32 or
    float64 ``flat`` (a partial last block as if padded with zeros); False when not done."""
    got = _BITS.get(flat.dtype)
    if got is None or scales.dtype != flat.dtype or codes.dtype != np.int8 or not _plain(flat, scales, codes):
        return False
    kernels = _get()
    if kernels is None or not flat.size:
        return kernels is not None
    kind, mask, inf = got
    kernels[f"encode{flat.dtype.itemsize * 8}"](flat, flat.view(kind), scales, codes, mask, inf)
    return True


def _decodable(scales: np.ndarray, codes: np.ndarray, out: np.ndarray) -> dict[str, Any] | None:
    if out.dtype not in _BITS or scales.dtype != out.dtype or codes.dtype != np.int8:
        return None
    if not _plain(scales, codes, out) or not out.flags.writeable:
        return None
    return _get()


def decode(scales: np.ndarray, codes: np.ndarray, out: np.ndarray) -> bool:
    """``out = codes * scale`` per block (flat float32 or float64 ``out``, its dtype's
    ``scales``, int8 ``codes`` of ``out``'s size); False when not done."""
    kernels = _decodable(scales, codes, out)
    if kernels is not None:
        kernels["decode"](scales, codes, out)
    return kernels is not None


def fold_sum(scales: np.ndarray, codes: np.ndarray, out: np.ndarray) -> bool:
    """``out += codes * scale`` per block (the product rounded, then the sum: the bits of
    :func:`decode` then numpy's add), traced as ops' reductions are; False when not done."""
    kernels = _decodable(scales, codes, out)
    if kernels is not None:
        trace = TRACE.get()
        start = 0.0 if trace is None else now()
        kernels["fold_sum"](scales, codes, out)
        if trace is not None:
            trace.add("reduce", "reduce", start, now(), {"bytes": out.nbytes, "op": "sum"})
    return kernels is not None
