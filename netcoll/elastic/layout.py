"""A heal's *layout*: what a state holds, as one canonical list of entries that
every rank can compare (by a digest) and a live member can send to a joiner.

A state is a mapping of ``str`` keys to numpy arrays, CPU torch tensors, small
scalars (``int`` (64-bit), ``float``, ``bool``, ``str``, ``bytes``, ``None``;
numpy scalars count as their Python value) or mappings of the same, nested up
to :data:`MAX_DEPTH` levels. Entries are sorted by path (the keys from the
top), so two states with the same contents have the same layout whatever the
insertion order. An entry is an array (dtype and shape; ``"tensor"`` when it
was a torch tensor), a scalar (its value travels in the layout) or an empty
mapping. The arrays' bytes, in entry order, C order, make the *stream* that
:mod:`.stream` cuts into slices.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from ..arrays import describe, dtype_from_wire, dtype_to_wire
from ..errors import NetcollError
from ..limits import DEFAULT, Limits
from ..tensors import is_tensor, to_numpy
from .errors import HealError

#: mappings nested deeper than this are refused (the top-level mapping is depth 1)
MAX_DEPTH = 8
#: at most this many dimensions per array (numpy's own limit)
MAX_NDIM = 64
SCALARS = (bool, int, float, str, bytes, type(None))
KINDS = ("array", "tensor", "value", "dict")

Path = tuple[str, ...]


@dataclass(frozen=True)
class Entry:
    """One leaf of a state: ``kind`` one of :data:`KINDS`; arrays have ``dtype`` and
    ``shape``, scalars ``value``."""

    path: Path
    kind: str
    dtype: np.dtype[Any] | None = None
    shape: tuple[int, ...] = ()
    value: Any = None

    @property
    def nbytes(self) -> int:
        """Bytes of this entry in the stream (0 for scalars and mappings)."""
        return 0 if self.dtype is None else math.prod(self.shape) * self.dtype.itemsize

    def wire(self) -> list[Any]:
        dtype = None if self.dtype is None else dtype_to_wire(self.dtype)
        return [list(self.path), self.kind, dtype, list(self.shape), self.value]

    def show(self) -> str:
        """``array float32[3,4]``, ``12``, ``{}``: what an entry holds, as errors show it."""
        if self.dtype is not None:
            return f"{self.kind} {describe(self.dtype, self.shape)}"
        return "{}" if self.kind == "dict" else repr(self.value)


def _scalar(x: Any) -> tuple[bool, Any]:
    """(True, the value as msgpack takes it) for a supported scalar, else (False, None)."""
    if isinstance(x, np.generic) and not isinstance(x, np.void):
        x = x.item()
    if isinstance(x, SCALARS) and not (isinstance(x, numbers.Integral) and not -(1 << 63) <= int(x) < 1 << 64):
        return True, x
    return False, None


def flatten(state: Any, *, strict: bool) -> tuple[list[Entry], dict[Path, np.ndarray]]:
    """A state's entries (sorted by path) and its arrays by path (numpy, over the memory of
    tensors). ``strict`` (a live member): an unsupported value is a ``TypeError`` naming its
    path; otherwise (a joiner, whose state is only where the result may land) it is skipped."""
    if not isinstance(state, Mapping):
        raise TypeError(f"heal: state must be a mapping (str -> arrays, tensors, scalars), got {type(state).__name__}")
    entries: list[Entry] = []
    arrays: dict[Path, np.ndarray] = {}
    _walk(state, (), strict, entries, arrays)
    entries.sort(key=lambda e: e.path)
    return entries, arrays


def _walk(
    node: Mapping[Any, Any], at: Path, strict: bool, entries: list[Entry], arrays: dict[Path, np.ndarray]
) -> None:
    if len(at) >= MAX_DEPTH:
        if strict:
            raise TypeError(f"heal: state nested deeper than {MAX_DEPTH} levels at {'/'.join(at)}")
        return
    for key, x in node.items():
        if not isinstance(key, str):
            if strict:
                raise TypeError(f"heal: state keys must be str, got {key!r} in {'/'.join(at) or 'the state'}")
            continue
        path = (*at, key)
        entry, arr = _leaf(path, x, strict)
        if isinstance(x, Mapping) and x:
            _walk(x, path, strict, entries, arrays)
        elif entry is not None:
            entries.append(entry)
            if arr is not None:
                arrays[path] = arr


def _leaf(path: Path, x: Any, strict: bool) -> tuple[Entry | None, np.ndarray | None]:
    if isinstance(x, Mapping):
        return Entry(path, "dict"), None
    try:
        if is_tensor(x):
            arr = to_numpy(x, "/".join(path))
            return Entry(path, "tensor", arr.dtype, tuple(arr.shape)), arr
        if isinstance(x, np.ndarray):
            dtype_from_wire(dtype_to_wire(x.dtype))  # a dtype netcoll moves
            return Entry(path, "array", x.dtype, tuple(x.shape)), x
    except (TypeError, NetcollError) as exc:
        if strict:
            raise TypeError(f"heal: {'/'.join(path)}: {exc}") from None
        return None, None
    ok, value = _scalar(x)
    if ok:
        return Entry(path, "value", value=value), None
    if strict:
        raise TypeError(
            f"heal: {'/'.join(path)} is of type {type(x).__name__}; a state holds numpy arrays, CPU torch tensors, "
            "int/float/bool/str/bytes/None and mappings of them"
        )
    return None, None


def encode(entries: list[Entry]) -> bytes:
    """The layout as bytes (msgpack): what is digested and sent to joiners."""
    out: bytes = msgpack.packb([e.wire() for e in entries], use_bin_type=True)
    return out


def digest(layout: bytes) -> bytes:
    """16 bytes naming a layout (BLAKE2b)."""
    return hashlib.blake2b(layout, digest_size=16).digest()


def decode(layout: bytes, *, sender: int, limits: Limits = DEFAULT) -> list[Entry]:
    """A peer's layout, checked: ``HealError`` naming ``sender`` when malformed, when an
    array is over ``limits.max_array_bytes`` or an unusable dtype (nothing allocated)."""
    try:
        raw = msgpack.unpackb(layout, raw=False, strict_map_key=True)
        if not isinstance(raw, list):
            raise TypeError("not a list")
        entries = [_entry(item, limits) for item in raw]
    except (ValueError, TypeError, NetcollError, msgpack.UnpackException) as exc:
        raise HealError(f"rank {sender} sent a malformed state layout: {exc}") from None
    if [e.path for e in entries] != sorted({e.path for e in entries}):
        raise HealError(f"rank {sender} sent a state layout out of order or with repeated paths")
    return entries


def _entry(item: Any, limits: Limits) -> Entry:
    if not (isinstance(item, list) and len(item) == 5):
        raise ValueError(f"entry {str(item)[:80]}")
    path, kind, dtype, shape, value = item
    if not (isinstance(path, list) and 0 < len(path) <= MAX_DEPTH and all(isinstance(k, str) for k in path)):
        raise ValueError(f"path {str(path)[:80]}")
    if kind not in KINDS:
        raise ValueError(f"kind {str(kind)[:20]}")
    if kind in ("value", "dict"):
        if not _scalar(value)[0] or (kind == "dict" and value is not None):
            raise ValueError(f"value of {'/'.join(path)}")
        return Entry(tuple(path), kind, value=value)
    if not (isinstance(shape, list) and len(shape) <= MAX_NDIM):
        raise ValueError(f"shape of {'/'.join(path)}")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ValueError(f"shape of {'/'.join(path)}")
    dt = dtype_from_wire(dtype)
    if math.prod(shape) * dt.itemsize > limits.max_array_bytes:
        raise ValueError(f"{'/'.join(path)} is over max_array_bytes ({limits.max_array_bytes})")
    return Entry(tuple(path), kind, dt, tuple(shape))


def difference(a: list[Entry], b: list[Entry]) -> str:
    """The first entry where two layouts differ, as a phrase (``"model/w: array float32[4]
    against array float32[8]"``, ``"step: 12 against (missing)"``)."""
    by_a, by_b = {e.path: e for e in a}, {e.path: e for e in b}
    for path in sorted(by_a.keys() | by_b.keys()):
        x, y = by_a.get(path), by_b.get(path)
        if x is None or y is None or x.wire() != y.wire():
            left = "(missing)" if x is None else x.show()
            right = "(missing)" if y is None else y.show()
            return f"{'/'.join(path)}: {left} against {right}"
    return "the same entries (in a different encoding)"


__all__ = ["MAX_DEPTH", "Entry", "Path", "decode", "difference", "digest", "encode", "flatten"]
