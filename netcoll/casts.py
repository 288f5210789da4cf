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

__all__ = ["absmax_rows", "cast", "codes_of", "scale_codes", "torch"]

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


# -- int8's kernels (float32 only; the bits of compression's numpy path: one IEEE operation each)
def absmax_rows(rows: np.ndarray, tmp: np.ndarray) -> np.ndarray | None:
    """The largest ``|x|`` of each row of the float32 ``rows`` (NaN if the row holds one),
    through ``tmp`` (same shape); None when not done."""
    got = _tensors(rows, tmp) if rows.dtype == tmp.dtype == np.float32 else None
    if got is None:
        return None
    x, scratch = got
    result: np.ndarray = torch().abs(x, out=scratch).amax(dim=1).numpy()
    return result


def codes_of(rows: np.ndarray, inverse: np.ndarray, tmp: np.ndarray, codes: np.ndarray) -> bool:
    """``codes = rint(rows * inverse[:, None])`` (float32 in, int8 out, round half to even;
    rows whose product is not finite are the caller's to zero), through ``tmp``."""
    got = _tensors(rows, inverse, tmp, codes) if rows.dtype == inverse.dtype == np.float32 else None
    if got is None:
        return False
    x, inv, scratch, out = got
    t = torch()
    t.mul(x, inv.unsqueeze(1), out=scratch)
    t.round(scratch, out=scratch)
    out.copy_(scratch)
    return True


def scale_codes(codes: np.ndarray, per: np.ndarray, out: np.ndarray) -> bool:
    """``out = codes * per[:, None]`` (int8 codes, float32 scales and result: the codes cast
    exactly, then one rounding per product)."""
    got = _tensors(codes, per, out) if per.dtype == out.dtype == np.float32 else None
    if got is None:
        return False
    c, p, o = got
    o.copy_(c)
    o.mul_(p.unsqueeze(1))
    return True
