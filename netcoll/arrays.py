"""Array argument checks and array metadata on the wire (no networking).

Everything here runs before a collective sends its first byte, so bad input
is a ``TypeError``/``ValueError`` on the caller's rank only.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .errors import MismatchError
from .ops import BFLOAT16, check_dtype


def as_array(x: Any, what: str = "x") -> np.ndarray:
    """``x`` as a numpy array of a supported dtype (array-likes are converted)."""
    if x is None:
        raise TypeError(f"{what} must be a numpy array, not None")
    arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    try:
        check_dtype(arr.dtype)
    except TypeError as exc:
        raise TypeError(f"{what}: {exc}") from None
    return arr


def contiguous_copy(x: np.ndarray, out: np.ndarray | None = None, what: str = "out") -> np.ndarray:
    """A C-contiguous array holding ``x``: ``out`` (checked, then filled) or a new one."""
    if out is None:
        return np.array(x, order="C", copy=True)
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


def meta_of(x: np.ndarray) -> dict[str, Any]:
    return {"dtype": dtype_to_wire(x.dtype), "shape": list(x.shape), "nbytes": x.nbytes}


def array_from_meta(meta: Any, payload: memoryview | None = None) -> np.ndarray:
    """An array for a peer's ``meta`` (over ``payload`` if given, else newly allocated)."""
    if not isinstance(meta, dict) or not isinstance(meta.get("shape"), list):
        raise MismatchError(f"peer sent malformed array metadata {meta!r}")
    dt = dtype_from_wire(meta.get("dtype"))
    shape = tuple(int(s) for s in meta["shape"])
    if payload is None:
        return np.empty(shape, dtype=dt)
    count = int(np.prod(shape, dtype=np.int64))
    if payload.nbytes != count * dt.itemsize:
        raise MismatchError(f"peer sent {payload.nbytes} bytes for a {describe(dt, shape)} array")
    return np.frombuffer(payload, dtype=dt, count=count).reshape(shape)
