"""Reduction ops and dtype rules (pure numpy, no networking).

Every layer that combines or validates tensor data goes through this module, so
the rules live in one place:

* **Ops.** ``sum prod min max avg band bor bxor``, given as a :class:`ReduceOp`,
  a case-insensitive string or a ``torch.distributed.ReduceOp`` value
  (:func:`parse_op`; torch's ``PREMUL_SUM`` is a ``ValueError``).
* **Dtypes.** ``bool``, ``int8..int64``, ``uint8..uint64``, ``float16``,
  ``bfloat16`` (``ml_dtypes``), ``float32``, ``float64``, ``complex64`` and
  ``complex128``, in native byte order (:data:`SUPPORTED_DTYPES`,
  :func:`check_dtype`). ``longdouble``/``clongdouble`` are refused because their
  byte layout differs between platforms; object, string, datetime, void and
  structured dtypes are refused because they are not numbers. Anything refused
  is a ``TypeError``, raised before any byte is sent.
* **Op × dtype** (:func:`check_op_dtype`). ``avg`` needs a floating (incl.
  float16/bfloat16) or complex dtype; ``band bor bxor`` need an integer or bool
  dtype; ``min``/``max`` are undefined for complex. For bool, ``sum``/``max``
  are logical or and ``prod``/``min`` are logical and.
* **Semantics.** :func:`reduce_into` folds one contribution into an accumulator
  in place with a numpy ufunc (``out=acc``, no temporary array). Integers wrap
  on overflow and floats overflow to inf silently (no numpy warnings); ``min``
  and ``max`` propagate NaN. ``avg`` is reduced as ``sum`` and divided once by
  the world size in :func:`finalize`: float16/bfloat16 are divided in float32
  and rounded back (correctly rounded), complex values have their real and
  imaginary parts divided separately (numpy's complex-by-real division
  multiplies by a reciprocal and is off by an ulp about half the time).
* **Determinism.** Every function is a pure elementwise function of its inputs,
  so the same fold order gives bit-identical results on every rank. Float
  results (and the sign of zero / the NaN payload chosen by min/max) depend on
  the fold order, which is the algorithms' business.
"""

from __future__ import annotations

import enum
import functools
import importlib
import numbers
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import ml_dtypes
import numpy as np

from .observe import TRACE, now

__all__ = [
    "BFLOAT16",
    "ReduceOp",
    "SUPPORTED_DTYPES",
    "check_dtype",
    "check_op_dtype",
    "finalize",
    "identity",
    "parse_op",
    "reduce_into",
    "reduce_reference",
]


class ReduceOp(str, enum.Enum):
    """A reduction operator. The value is the wire / user-facing name."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    def __str__(self) -> str:
        return self.value


_OP_NAMES = ", ".join(op.value for op in ReduceOp)
_BY_NAME: dict[str, ReduceOp] = {op.value: op for op in ReduceOp}  # "sum" -> SUM without the enum's call


#: ``torch.distributed.ReduceOp`` names -> ours (PREMUL_SUM has no counterpart: a scale per call)
_TORCH_OPS = {"SUM": "sum", "PRODUCT": "prod", "MIN": "min", "MAX": "max", "AVG": "avg", "BAND": "band"}
_TORCH_OPS |= {"BOR": "bor", "BXOR": "bxor"}


def _torch_op(op: Any) -> ReduceOp:
    """Ours for a ``torch.distributed.ReduceOp`` (or its ``RedOpType``), by name
    (torch is not imported here: the caller already has it)."""
    name = getattr(getattr(op, "op", op), "name", None)  # ReduceOp(...).op is a RedOpType
    ours = _TORCH_OPS.get(name) if isinstance(name, str) else None
    if ours is None:
        raise ValueError(
            f"torch.distributed.ReduceOp.{name} is not supported; supported: {', '.join(_TORCH_OPS)} "
            "(for PREMUL_SUM, scale the tensor and use SUM)"
        )
    return ReduceOp(ours)


def parse_op(op: str | ReduceOp) -> ReduceOp:
    """Return the :class:`ReduceOp` for *op*: an enum member, a case-insensitive
    name, or a ``torch.distributed.ReduceOp`` value."""
    if isinstance(op, ReduceOp):
        return op
    hit = _BY_NAME.get(op) if op.__class__ is str else None
    if hit is not None:
        return hit
    if not isinstance(op, str):
        if type(op).__module__.startswith("torch."):
            return _torch_op(op)
        raise TypeError(f"op must be a str or ReduceOp, not {type(op).__name__}")
    try:
        return ReduceOp(op.strip().lower())
    except ValueError:
        raise ValueError(f"unknown reduction op {op!r}; valid ops: {_OP_NAMES}") from None


BFLOAT16: np.dtype = np.dtype(ml_dtypes.bfloat16)

#: Every dtype a collective accepts, in native byte order.
SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(t)
    for t in (
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.float16,
        BFLOAT16,
        np.float32,
        np.float64,
        np.complex64,
        np.complex128,
    )
)
_SUPPORTED_NAMES = ", ".join(str(dt) for dt in SUPPORTED_DTYPES)
_CHECKED: dict[np.dtype, np.dtype] = {}  # dtypes already accepted (the hot path's cache)


def check_dtype(dtype: Any) -> np.dtype:
    """Return ``np.dtype(dtype)`` if it is supported, else raise ``TypeError``."""
    hit = _CHECKED.get(dtype) if isinstance(dtype, np.dtype) else None
    if hit is not None:
        return hit
    if dtype is None:  # np.dtype(None) would silently mean float64
        raise TypeError(f"dtype must not be None; supported dtypes: {_SUPPORTED_NAMES}")
    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{dtype!r} is not a dtype ({exc}); supported dtypes: {_SUPPORTED_NAMES}") from None
    if dt in SUPPORTED_DTYPES:  # dtype equality: e.g. longlong == int64 where equivalent
        _CHECKED[dt] = dt
        return dt
    if not dt.isnative and dt.newbyteorder("=") in SUPPORTED_DTYPES:
        raise TypeError(
            f"dtype {dt.str!r} ({dt}) is not in native byte order; convert with .astype(dtype.newbyteorder('='))"
        )
    why = ""
    if dt.kind in "fc":  # only longdouble / clongdouble can get here
        why = " (longdouble/clongdouble have a platform-specific byte layout)"
    raise TypeError(f"unsupported dtype {dt}{why}; supported dtypes: {_SUPPORTED_NAMES}")


def _category(dt: np.dtype) -> str:
    if dt.kind == "b":
        return "bool"
    if dt.kind in "iu":
        return "int"
    if dt.kind == "c":
        return "complex"
    return "float"  # kind "f", or bfloat16 (kind "V")


_VALID_PAIRS: set[tuple[str, np.dtype]] = set()  # (op value, dtype) already accepted


def check_op_dtype(op: str | ReduceOp, dtype: Any) -> None:
    """Raise ``TypeError`` unless *op* is defined for *dtype* (see module docstring)."""
    if op.__class__ is ReduceOp and dtype.__class__ is not str and (op._value_, dtype) in _VALID_PAIRS:
        return
    op = parse_op(op)
    dt = check_dtype(dtype)
    cat = _category(dt)
    if op is ReduceOp.AVG and cat not in ("float", "complex"):
        raise TypeError(
            f"op 'avg' needs a floating or complex dtype, got {dt}; "
            f"use 'sum' and divide, or cast to a float dtype first"
        )
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and cat not in ("int", "bool"):
        raise TypeError(f"op {op.value!r} needs an integer or bool dtype, got {dt}")
    if op in (ReduceOp.MIN, ReduceOp.MAX) and cat == "complex":
        raise TypeError(f"op {op.value!r} is not defined for complex dtype {dt} (complex numbers are unordered)")
    if isinstance(dtype, np.dtype) and len(_VALID_PAIRS) < 1024:
        _VALID_PAIRS.add((op.value, dtype))


_UFUNCS: dict[ReduceOp, np.ufunc] = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,
    ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}
_BOOL_UFUNCS: dict[ReduceOp, np.ufunc] = {
    ReduceOp.SUM: np.logical_or,
    ReduceOp.PROD: np.logical_and,
    ReduceOp.MIN: np.logical_and,
    ReduceOp.MAX: np.logical_or,
}


@functools.lru_cache(maxsize=256)
def _ufunc(op: ReduceOp, dt: np.dtype) -> np.ufunc:
    check_op_dtype(op, dt)
    if dt.kind == "b":
        return _BOOL_UFUNCS.get(op, _UFUNCS[op])
    return _UFUNCS[op]


def _check_pair(acc: Any, other: Any) -> None:
    if not isinstance(acc, np.ndarray) or not isinstance(other, np.ndarray):
        raise TypeError(f"acc and other must be numpy arrays, not {type(acc).__name__} and {type(other).__name__}")
    if acc.dtype != other.dtype:
        raise TypeError(f"dtype mismatch: acc is {acc.dtype}, other is {other.dtype}")
    if acc.shape != other.shape:
        raise ValueError(f"shape mismatch: acc is {acc.shape}, other is {other.shape}")
    if not acc.flags.writeable:
        raise ValueError("acc is read-only")


_FAST: dict[tuple[ReduceOp, np.dtype], tuple[np.ufunc, bool]] = {}  # (op, dtype) -> (ufunc, quiet)


def _fast(op: ReduceOp, dt: np.dtype) -> tuple[np.ufunc, bool]:
    """The ufunc for ``op`` on ``dt`` and whether it can run without ``np.errstate``
    (integer and bool array ufuncs never warn: they wrap around silently)."""
    hit = _FAST.get((op, dt))
    if hit is None:
        hit = _FAST[(op, dt)] = (_ufunc(op, dt), dt.kind in "biu")
    return hit


def _errstate_var() -> tuple[ContextVar[Any], Any] | None:
    """numpy's error-state variable and an "ignore all" value for it, if this
    numpy keeps its state that way (checked): setting the variable is what
    ``np.errstate`` does, without building a new state object per call (that
    costs as much as the ufunc on a small array; docs/performance.md)."""
    try:
        config = importlib.import_module("numpy._core._ufunc_config")
        var, value = config._extobj_contextvar, config._make_extobj(all="ignore")
        token = var.set(value)
        try:
            works = set(np.geterr().values()) == {"ignore"}
        finally:
            var.reset(token)
    except Exception:  # noqa: BLE001 - another numpy: np.errstate it is
        return None
    return (var, value) if works else None


_QUIET = _errstate_var()


def _ignoring_errors(ufunc: np.ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``ufunc(a, b, out=out)`` under ``np.errstate(all="ignore")``."""
    if _QUIET is None:
        with np.errstate(all="ignore"):
            ufunc(a, b, out=out)
        return
    var, value = _QUIET
    token = var.set(value)
    try:
        ufunc(a, b, out=out)
    finally:
        var.reset(token)


def _fits(acc: Any, other: Any) -> bool:
    """Whether ``acc`` (writeable) and ``other`` are plain arrays of one dtype and shape."""
    return (
        acc.__class__ is np.ndarray
        and other.__class__ is np.ndarray
        and acc.dtype == other.dtype
        and acc.shape == other.shape
        and acc.flags.writeable
    )


def _reduce(op: ReduceOp, out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``out = a (op) b`` on checked arrays: float overflow and NaN compares stay quiet."""
    ufunc, quiet = _fast(op, out.dtype)
    trace = TRACE.get()
    start = 0.0 if trace is None else now()
    if quiet:
        ufunc(a, b, out=out)
    else:
        _ignoring_errors(ufunc, a, b, out)
    if trace is not None:
        trace.add("reduce", "reduce", start, now(), {"bytes": out.nbytes, "op": op.value})


def reduce_into(op: str | ReduceOp, acc: np.ndarray, other: np.ndarray) -> None:
    """In place: ``acc = acc (op) other`` elementwise. ``avg`` accumulates as ``sum``."""
    if op.__class__ is not ReduceOp:
        op = parse_op(op)
    if not _fits(acc, other):
        _check_pair(acc, other)  # raises with the reason (ndarray subclasses pass on)
    _reduce(op, acc, acc, other)


def reduce_to(op: str | ReduceOp, out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``out = a (op) b`` elementwise, the same bits as ``reduce_into`` on a copy
    of ``a`` (saves that copy when ``a`` must stay unmodified)."""
    if op.__class__ is not ReduceOp:
        op = parse_op(op)
    if not (_fits(out, a) and _fits(out, b)):
        _check_pair(out, a)
        _check_pair(out, b)
    _reduce(op, out, a, b)


def reduce_prechecked(op: ReduceOp, out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """:func:`reduce_to` without its checks, for a caller that made ``out``, ``a``
    and ``b`` itself as plain arrays of one dtype and shape (``out`` writeable):
    the per-message reduction of an algorithm, where the checks cost as much as
    a small add."""
    _reduce(op, out, a, b)


class Fold:
    """A receive that reduces its payload as it arrives: ``out = own (op)
    incoming`` (or ``incoming (op) own`` with ``incoming_first``), applied piece
    by piece by a link that reads the payload in pieces (a shared-memory ring:
    one pass over the bytes instead of a copy and then the reduction; a TCP
    socket, read through a piece that stays in cache).
    The same bits as :func:`reduce_to` on the whole payload. A link that cannot
    fold just fills the posted buffer; :attr:`complete` tells the two apart."""

    __slots__ = ("op", "out", "own", "incoming_first", "done")

    def __init__(self, op: ReduceOp, out: np.ndarray, own: np.ndarray, *, incoming_first: bool = False) -> None:
        _check_pair(out, own)
        self.op, self.out, self.own, self.incoming_first = op, out.reshape(-1), own.reshape(-1), incoming_first
        self.done = 0  # bytes folded so far, from the start

    @property
    def nbytes(self) -> int:
        return int(self.out.nbytes)

    @property
    def complete(self) -> bool:
        """Whether the whole payload has been folded into ``out``."""
        return self.done == self.nbytes

    def apply(self, data: memoryview) -> None:
        """Fold the next ``len(data)`` bytes of the payload. ValueError if they
        are not whole elements or run past the end (the caller's peer is broken)."""
        size, item = data.nbytes, self.out.itemsize
        if size % item or self.done + size > self.nbytes:
            raise ValueError(f"{size} bytes at {self.done} are not whole elements of a {self.nbytes}-byte buffer")
        e0, e1 = self.done // item, (self.done + size) // item
        incoming, own = np.frombuffer(data, dtype=self.out.dtype), self.own[e0:e1]
        if self.incoming_first:
            reduce_to(self.op, self.out[e0:e1], incoming, own)
        else:
            reduce_to(self.op, self.out[e0:e1], own, incoming)
        self.done += size


def finalize(op: str | ReduceOp, acc: np.ndarray, world_size: int) -> None:
    """In place: finish a reduction over *world_size* contributions (``avg`` divides)."""
    op = parse_op(op)
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral):
        raise TypeError(f"world_size must be an int, not {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not isinstance(acc, np.ndarray):
        raise TypeError(f"acc must be a numpy array, not {type(acc).__name__}")
    _ufunc(op, acc.dtype)  # validates op x dtype
    if op is not ReduceOp.AVG or world_size == 1:
        return
    if not acc.flags.writeable:
        raise ValueError("acc is read-only")
    n = int(world_size)
    with np.errstate(all="ignore"):
        if acc.dtype in (np.dtype(np.float16), BFLOAT16):
            # Divide in float32 (n exact, x/n rounded once to 24 bits) and round back;
            # 24 >= 2*11+2 so the double rounding is innocuous: correctly rounded.
            # The ufunc buffers the casts in small blocks: no full-size temporary.
            np.divide(acc, np.float32(n), out=acc, dtype=np.float32, casting="unsafe")
        elif acc.dtype.kind == "c":
            np.divide(acc.real, n, out=acc.real)
            np.divide(acc.imag, n, out=acc.imag)
        else:
            np.divide(acc, n, out=acc)


_REFERENCE_BINARY: dict[ReduceOp, Callable[[Any, Any], Any]] = {
    ReduceOp.SUM: lambda a, b: a + b,
    ReduceOp.AVG: lambda a, b: a + b,
    ReduceOp.PROD: lambda a, b: a * b,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: lambda a, b: a & b,
    ReduceOp.BOR: lambda a, b: a | b,
    ReduceOp.BXOR: lambda a, b: a ^ b,
}


def reduce_reference(op: str | ReduceOp, arrays: list[np.ndarray]) -> np.ndarray:
    """Plain out-of-place reference: left fold in list order, then :func:`finalize`."""
    op = parse_op(op)
    arrays = [np.asarray(a) for a in arrays]
    if not arrays:
        raise ValueError("reduce_reference needs at least one array")
    dt = arrays[0].dtype
    check_op_dtype(op, dt)
    for a in arrays[1:]:
        if a.dtype != dt or a.shape != arrays[0].shape:
            raise ValueError(f"arrays disagree: {arrays[0].shape}/{dt} vs {a.shape}/{a.dtype}")
    acc = arrays[0].copy()
    with np.errstate(all="ignore"):
        for a in arrays[1:]:
            acc = np.asarray(_REFERENCE_BINARY[op](acc, a))  # 0-d ops return scalars
            assert acc.dtype == dt, (op, dt, acc.dtype)
    acc = np.array(acc, copy=True)
    finalize(op, acc, len(arrays))
    return acc


def identity(op: str | ReduceOp, dtype: Any) -> Any:
    """The identity element of *op* for *dtype*, as a numpy scalar (for padding)."""
    op = parse_op(op)
    dt = check_dtype(dtype)
    check_op_dtype(op, dt)
    cat = _category(dt)
    value: Any
    if op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.BOR, ReduceOp.BXOR):
        value = 0
    elif op is ReduceOp.PROD:
        value = 1
    elif op is ReduceOp.BAND:
        value = True if cat == "bool" else np.iinfo(dt).max if dt.kind == "u" else -1
    elif op is ReduceOp.MIN:
        value = True if cat == "bool" else np.iinfo(dt).max if cat == "int" else np.inf
    else:  # MAX
        value = False if cat == "bool" else np.iinfo(dt).min if cat == "int" else -np.inf
    return np.array(value, dtype=dt)[()]
