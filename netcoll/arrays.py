"""Array argument checks and array metadata on the wire (no networking).

Everything here runs before a collective sends its first byte, so bad input
is a ``TypeError``/``ValueError`` on the caller's rank only.

Sizes are checked before any work is sized by them. An array argument's
*logical* size (``x.nbytes``: elements x itemsize, whatever its strides) over
``max_array_bytes`` (:mod:`netcoll.limits`, 16 GiB by default) is a
``ValueError`` from :func:`as_array`, before anything is copied: a stride-0
view (``np.broadcast_to(np.float32(1), 2**33)``) takes a few bytes of memory
but would make a collective copy, send and reduce all of its logical bytes.
Array metadata from a peer (:func:`array_from_meta`) is checked the same way
(``LimitExceeded``) before an array is allocated for it.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import numpy as np

from . import resultpool
from .errors import LimitExceeded, MismatchError
from .escape import escape
from .limits import DEFAULT, ENV_PREFIX, Limits
from .ops import BFLOAT16, check_dtype

MAX_NDIM = 64  # numpy's own limit (NPY_MAXDIMS)


def _over_limit(nbytes: int, limits: Limits) -> str | None:
    if nbytes <= limits.max_array_bytes:
        return None
    size = f"{nbytes}" if nbytes.bit_length() <= 64 else f"about 2**{nbytes.bit_length() - 1}"
    return (
        f"{size} bytes, over the limit max_array_bytes={limits.max_array_bytes} "
        f"(set {ENV_PREFIX}MAX_ARRAY_BYTES to change it)"
    )


def check_size(arr: np.ndarray, what: str = "x", limits: Limits = DEFAULT) -> np.ndarray:
    """``arr``, or ValueError when its logical size is over ``limits.max_array_bytes``."""
    over = _over_limit(int(arr.size) * arr.dtype.itemsize, limits)
    if over is not None:
        strided = "" if arr.flags.c_contiguous else f" (a non-contiguous view with strides {arr.strides})"
        raise ValueError(f"{what}: a {describe(arr.dtype, arr.shape)} array{strided} is {over}")
    return arr


def as_array(x: Any, what: str = "x", limits: Limits = DEFAULT) -> np.ndarray:
    """``x`` as a numpy array of a supported dtype (array-likes are converted)
    whose logical size is within ``limits.max_array_bytes`` (ValueError, before
    any copy is made)."""
    if x is None:
        raise TypeError(f"{what} must be a numpy array, not None")
    arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    try:
        check_dtype(arr.dtype)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None
    return check_size(arr, what, limits)


def contiguous_copy(x: np.ndarray, out: np.ndarray | None = None, what: str = "out") -> np.ndarray:
    """A C-contiguous array holding ``x``: ``out`` (checked, then filled) or a new one."""
    if out is None:
        check_size(x, "x")  # a new array of x's logical size: never over the limit
        new = resultpool.empty(x.shape, x.dtype)
        np.copyto(new, x)
        return new
    check_out(out, x.shape, x.dtype, what)
    if out is not x:
        np.copyto(out, x)
    return out


def check_out(out: Any, shape: tuple[int, ...], dtype: np.dtype, what: str = "out") -> np.ndarray:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, not {type(out).__name__}")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"{what} must have shape {tuple(shape)} and dtype {dtype}, got {out.shape} {out.dtype}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{what} must be C-contiguous and writeable")
    return out


def leading_ranks(x: np.ndarray, world_size: int, what: str) -> None:
    if x.ndim == 0 or x.shape[0] != world_size:
        raise ValueError(f"{what} needs an array whose leading axis is world_size={world_size}, got shape {x.shape}")


def dtype_to_wire(dt: np.dtype) -> str:
    return "bfloat16" if dt == BFLOAT16 else dt.str


def dtype_from_wire(s: Any) -> np.dtype:
    try:
        dt = BFLOAT16 if s == "bfloat16" else np.dtype(s)
        return check_dtype(dt)
    except (TypeError, ValueError) as exc:
        raise MismatchError(f"peer sent an unusable dtype {s!r}: {exc}") from None


@functools.lru_cache(maxsize=1024)
def describe(dt: np.dtype, shape: tuple[int, ...]) -> str:
    """``float32[3,4]``: how a call's array shows in fingerprints and errors."""
    name = "bfloat16" if dt == BFLOAT16 else dt.name
    return f"{name}[{','.join(map(str, shape))}]"


def meta_of(x: np.ndarray, torch: bool = False) -> dict[str, Any]:
    """What a receiver needs to know of ``x`` (``torch``: it was a torch tensor,
    so a receiver that passed none gets one back: :func:`netcoll.tensors.from_peer`)."""
    meta = {"dtype": dtype_to_wire(x.dtype), "shape": list(x.shape), "nbytes": x.nbytes}
    if torch:
        meta["torch"] = True
    return meta


def _dim(s: Any) -> int:
    if isinstance(s, bool):
        raise TypeError("a bool")
    n = operator.index(s)  # ints and numpy integers; TypeError for anything else
    if n < 0:
        raise ValueError("negative")
    return n


def array_from_meta(meta: Any, payload: memoryview | None = None, limits: Limits = DEFAULT) -> np.ndarray:
    """An array for a peer's ``meta`` (over ``payload`` if given, else newly
    allocated). The declared shape is checked first: ``MismatchError`` when
    malformed, ``LimitExceeded`` over ``limits.max_array_bytes`` (nothing allocated)."""
    if not isinstance(meta, dict) or not isinstance(meta.get("shape"), list):
        raise MismatchError(f"peer sent malformed array metadata {_show(meta)}")
    raw = meta["shape"]
    if len(raw) > MAX_NDIM:
        raise MismatchError(f"peer sent an array of {len(raw)} dimensions (at most {MAX_NDIM})")
    try:
        shape = tuple(_dim(s) for s in raw)
    except (TypeError, ValueError):
        raise MismatchError(f"peer sent a malformed array shape {_show(raw)}") from None
    dt = dtype_from_wire(meta.get("dtype"))
    count = math.prod(shape)  # exact (Python ints): no overflow
    over = _over_limit(count * dt.itemsize, limits)
    if over is not None:
        raise LimitExceeded(f"peer declared a {dt} array of {len(shape)} dimensions and {over}")
    # a 0 elsewhere keeps the count small, but numpy still needs the other sizes' strides to fit
    if math.prod(n for n in shape if n) * dt.itemsize >= 1 << 63:
        raise MismatchError(f"peer sent an array shape numpy cannot hold {_show(raw)}")
    if payload is None:
        return resultpool.empty(shape, dt)
    if payload.nbytes != count * dt.itemsize:
        raise MismatchError(f"peer sent {payload.nbytes} bytes for a {describe(dt, shape)} array")
    return np.frombuffer(payload, dtype=dt, count=count).reshape(shape)


def _show(value: Any) -> str:
    """A peer's value for an error message: bounded, escaped, never raising."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - e.g. an int over 4300 digits
        text = f"<{type(value).__name__}>"
    return escape(text, 120)
