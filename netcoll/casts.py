"""The codecs' float casts through a loaded torch's vectorized kernels (F16C / AVX-512):
float32 to float16 or bfloat16 and back, about 0.2 ns an element against numpy's 1.7
(float32 to float16) and 1.0 (back) on this project's VM.

Used only when torch is already imported (``sys.modules``: this module never imports it,
contract "torch-optional") and ``NETCOLL_TORCH_CASTS`` is not ``0``. Every cast is IEEE
round to nearest even with subnormals, infinities and ties as numpy's (tested on every
half and bfloat16 value and on float32 edge cases; checked once on all 2**32 float32
values); only NaN bits may differ: a NaN stays a NaN (of its sign for float16; torch's
bfloat16 NaN may not keep the sign). torch uses its own intra-op threads
(``torch.set_num_threads``) for large arrays.

:func:`cast` returns False when it did nothing (no torch, turned off, a dtype it does
not take, a read-only source it cannot view): the caller then casts with numpy.
"""

from __future__ import annotations

import sys
from typing import Any, Final

import numpy as np

from . import settings
from .ops import BFLOAT16

__all__ = ["cast", "torch"]

#: numpy dtype -> (the numpy dtype torch.from_numpy takes, torch dtype's name)
_VIEWS: Final[dict[np.dtype, tuple[np.dtype, str]]] = {
    np.dtype(np.float32): (np.dtype(np.float32), "float32"),
    np.dtype(np.float16): (np.dtype(np.float16), "float16"),
    BFLOAT16: (np.dtype(np.uint16), "bfloat16"),
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


def cast(src: np.ndarray, dst: np.ndarray) -> bool:
    """``dst[...] = src`` (flat, same size, C-contiguous; float32, float16 or bfloat16)
    through torch; False when not done (the caller casts with numpy)."""
    t = torch()
    a, b = _VIEWS.get(src.dtype), _VIEWS.get(dst.dtype)
    if t is None or a is None or b is None or not (src.flags.c_contiguous and dst.flags.c_contiguous):
        return False
    try:
        s = _tensor(t, src.reshape(-1), a[1], a[0])
    except ValueError:
        return False
    _tensor(t, dst.reshape(-1), b[1], b[0]).copy_(s)
    return True
