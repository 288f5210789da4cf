"""The codecs' kernels through a loaded torch's vectorized ones (F16C / AVX-512): float32
to float16 or bfloat16 and back, about 0.2 ns an element against numpy's 1.7 (float32 to
float16) and 1.0 (back) on this project's VM; int8's block maxima, codes and decoding of
float32 (numpy's int8-to-float32 cast is about 1 ns an element, torch's 0.2).

Used only when torch is already imported (``sys.modules``: this module never imports it,
contract "torch-optional") and ``NETCOLL_TORCH_CASTS`` is not ``0``. Every cast is IEEE
round to nearest even with subnormals, infinities and ties as numpy's (tested on every
half and bfloat16 value and on float32 edge cases; checked once on all 2**32 float32
values); only NaN bits may differ: a NaN stays a NaN (of its sign for float16; torch's
bfloat16 NaN may not keep the sign). torch uses its own intra-op threads
(``torch.set_num_threads``) for large arrays.

Each function returns False (or None) when it did nothing (no torch, turned off, a dtype it does
not take, a read-only source it cannot view): the caller then casts with numpy.
"""

from __future__ import annotations

import sys
from typing import Any, Final

import numpy as np

from . import settings
from .ops import BFLOAT16

__all__ = ["Caster", "Int8Rows", "cast", "caster", "feedback_loop", "int8_rows", "int8_scaler", "scale_codes", "torch"]

#: numpy dtype -> (the numpy dtype torch.from_numpy takes, torch dtype's name)
_VIEWS: Final[dict[np.dtype, tuple[np.dtype, str]]] = {
    np.dtype(np.float32): (np.dtype(np.float32), "float32"),
    np.dtype(np.float16): (np.dtype(np.float16), "float16"),
    BFLOAT16: (np.dtype(np.uint16), "bfloat16"),
    np.dtype(np.int8): (np.dtype(np.int8), "int8"),
}


def torch() -> Any:
    """The loaded torch module when the casts may use it, else None."""
    mod = sys.modules.get("torch")
    if mod is None or not hasattr(mod, "from_numpy") or not settings.torch_casts():
        return None
    return mod


def _tensor(t: Any, a: np.ndarray, name: str, view: np.dtype) -> Any:
    if not a.flags.writeable:  # torch.from_numpy warns on read-only arrays: a writeable view of the same memory
        a = a.view()
        a.flags.writeable = True  # ValueError when the memory itself is read-only
    return t.from_numpy(a.view(view)).view(getattr(t, name))


def _tensors(*arrays: np.ndarray) -> list[Any] | None:
    """torch tensors over ``arrays`` (C-contiguous, of the dtypes of :data:`_VIEWS`), or None."""
    t = torch()
    if t is None:
        return None
    out = []
    for a in arrays:
        view = _VIEWS.get(a.dtype)
        if view is None or not a.flags.c_contiguous:
            return None
        try:
            out.append(_tensor(t, a, view[1], view[0]))
        except ValueError:
            return None
    return out


def cast(src: np.ndarray, dst: np.ndarray) -> bool:
    """``dst[...] = src`` (flat, same size, C-contiguous; float32, float16 or bfloat16)
    through torch; False when not done (the caller casts with numpy)."""
    if src.dtype == np.int8 or dst.dtype == np.int8:
        return False
    got = _tensors(src.reshape(-1), dst.reshape(-1))
    if got is None:
        return False
    got[1].copy_(got[0])
    return True


def feedback_loop(
    wire: np.dtype, src: np.ndarray, flat: np.ndarray, res: np.ndarray, ranges: list[tuple[int, int]], chunk: int
) -> bool:
    """Error feedback's loop (:meth:`netcoll.feedback.ErrorFeedback.compensate`) over
    ``ranges``, ``chunk`` elements at a time, through torch on tensors made once per call:
    ``flat = src + res``, then ``res = flat - decode(encode(flat))`` with the codec's very
    casts to and from ``wire`` (float16 or bfloat16: the same bits as numpy's loop). Only
    float32 and a writeable ``src``; False when not done (the caller runs numpy's loop)."""
    if flat.dtype != np.float32 or wire not in (np.dtype(np.float16), BFLOAT16) or not src.flags.writeable:
        return False
    got = _tensors(src, flat, res)
    if got is None:
        return False
    t, (x, f, r) = torch(), got
    coded = t.empty(chunk, dtype=getattr(t, _VIEWS[wire][1]))
    for a, b in ranges:
        for i in range(a, b, chunk):
            j = min(i + chunk, b)
            fi, ri, w = f[i:j], r[i:j], coded[: j - i]
            t.add(x[i:j], ri, out=fi)
            w.copy_(fi)  # encode
            ri.copy_(w)  # decode
            t.sub(fi, ri, out=ri)
    return True


class Caster:
    """torch tensors over a whole flat ``src`` and ``dst`` (:func:`caster`): casts slices of
    one into the other without making tensors per slice (a few microseconds each)."""

    __slots__ = ("dst", "src")

    def __init__(self, src: Any, dst: Any) -> None:
        self.src, self.dst = src, dst

    def __call__(self, i: int, j: int, at: int = 0) -> None:
        """``dst[at : at + j - i] = src[i:j]``."""
        self.dst[at : at + j - i].copy_(self.src[i:j])


def caster(src: np.ndarray, dst: np.ndarray) -> Caster | None:
    """A :class:`Caster` from ``src`` to ``dst`` (flat, C-contiguous; float32, float16 or
    bfloat16), or None when torch cannot (the caller casts with numpy)."""
    if src.dtype == np.int8 or dst.dtype == np.int8:
        return None
    got = _tensors(src.reshape(-1), dst.reshape(-1))
    return None if got is None else Caster(*got)


# -- int8's kernels (float32 only; the bits of compression's numpy path: one IEEE operation each).
# Their tensors are made once per array (a tensor over a numpy array costs microseconds: once per
# chunk of a few hundred blocks it was a tenth of the codec's time) and sliced per chunk; so are the
# blocks' maxima and inverse scales, which the caller computes a group of chunks at a time.
class Int8Rows:
    """torch tensors over the float32 ``rows`` of an int8 encoding, their ``codes``, a ``tmp``
    of at least one chunk's rows, and per row its ``maxima`` and ``inverse`` scale (numpy
    arrays, tensors alike) (:func:`int8_rows`); methods over rows ``i:j``, a chunk at a time."""

    __slots__ = ("codes", "inverse", "maxima", "rows", "t", "tmp", "_inverse", "_maxima")

    def __init__(self, t: Any, rows: Any, codes: Any, tmp: Any) -> None:
        self.t, self.rows, self.codes, self.tmp = t, rows, codes, tmp
        self.maxima = np.empty(rows.shape[0], np.float32)
        self.inverse = np.empty(rows.shape[0], np.float32)
        self._maxima = t.from_numpy(self.maxima)
        self._inverse = t.from_numpy(self.inverse).unsqueeze(1)

    def absmax(self, i: int, j: int) -> np.ndarray:
        """``maxima[i:j]`` = the largest ``|x|`` of each of rows ``i:j`` (NaN if the row
        holds one), ``len(tmp)`` rows at a time; returns that slice of :attr:`maxima`."""
        t, step = self.t, self.tmp.shape[0]
        for a in range(i, j, step):
            b = min(j, a + step)
            t.amax(t.abs(self.rows[a:b], out=self.tmp[: b - a]), dim=1, out=self._maxima[a:b])
        return self.maxima[i:j]

    def encode(self, i: int, j: int) -> None:
        """``codes[i:j] = rint(rows[i:j] * inverse[i:j, None])`` (round half to even; rows
        whose product is not finite are the caller's to zero), ``len(tmp)`` rows at a time."""
        t, step = self.t, self.tmp.shape[0]
        for a in range(i, j, step):
            b = min(j, a + step)
            scratch = self.tmp[: b - a]
            t.mul(self.rows[a:b], self._inverse[a:b], out=scratch)
            t.round(scratch, out=scratch)
            self.codes[a:b].copy_(scratch)


def int8_rows(rows: np.ndarray, codes: np.ndarray, tmp: np.ndarray) -> Int8Rows | None:
    """:class:`Int8Rows` over float32 ``rows``, int8 ``codes`` (same shape) and float32
    ``tmp``, or None (no torch, other dtypes)."""
    if not rows.dtype == tmp.dtype == np.float32:
        return None
    got = _tensors(rows, codes, tmp)
    return None if got is None else Int8Rows(torch(), *got)


def scale_codes(codes: np.ndarray, per: np.ndarray, out: np.ndarray, rows: int) -> bool:
    """``out = codes * per[:, None]`` (int8 codes, float32 scales and result: the codes cast
    exactly, then one rounding per product), ``rows`` rows at a time (the cast still in cache
    when scaled); False when not done."""
    got = _tensors(codes, per, out) if per.dtype == out.dtype == np.float32 else None
    if got is None:
        return False
    c, p, o = got
    p = p.unsqueeze(1)
    for i in range(0, o.shape[0], rows):
        part = o[i : i + rows]
        part.copy_(c[i : i + rows])
        part.mul_(p[i : i + rows])
    return True


def int8_scaler(codes: np.ndarray, per: np.ndarray, out: np.ndarray) -> Caster | None:
    """A :class:`Caster` whose call ``(i, j)`` sets ``out[: j - i] = codes[i:j] * per[i:j, None]``
    (int8 rows of codes, float32 scales and rows: :func:`scale_codes`' bits, over tensors made
    once), or None."""
    got = _tensors(codes, per, out) if per.dtype == out.dtype == np.float32 else None
    return None if got is None else _Scaler(got[0], got[1].unsqueeze(1), got[2])


class _Scaler(Caster):
    __slots__ = ("per",)

    def __init__(self, codes: Any, per: Any, out: Any) -> None:
        super().__init__(codes, out)
        self.per = per

    def __call__(self, i: int, j: int, at: int = 0) -> None:
        part = self.dst[at : at + j - i]
        part.copy_(self.src[i:j])
        part.mul_(self.per[i:j])
