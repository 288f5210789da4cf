"""What every collective's plan shares: root checks, call
fingerprints, and the array helpers that keep inputs unmodified and results
in the caller's buffers.

A *plan* (one function per collective in :mod:`.reducing`, :mod:`.moving`,
:mod:`.p2p`) checks the arguments — raising ``ValueError``/``TypeError``
before any byte is sent — and returns either a :class:`~netcoll.engine.Call`
to issue or :class:`Done` (nothing to communicate, e.g. a group of one).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ranks, resultpool
from ..arrays import as_array, check_out
from ..engine import Call, Engine
from ..ops import BFLOAT16
from ..selection import Choice

FP_CACHE_MAX = 256


@dataclass(slots=True)
class Done:
    """A call that needs no communication: its result."""

    value: Any


Plan = Call | Done


@dataclass(slots=True)
class Ran:
    """What a broadcast ran (:attr:`~netcoll.engine.Call.ran`), for the model and the stats: a
    broadcast is planned as 0 bytes, since only its root knows the size, and ``sized`` as
    neither shape, since only the root chooses; once it has run, every rank knows both."""

    choice: Choice | None
    nbytes: int = -1  # the size, once the call has it
    shape: str | None = None  # what a sized broadcast ran (told by the algorithm)
    predicted: float | None = None  # the root's prediction for it

    def tell(self, shape: str) -> None:
        self.shape = shape

    def __call__(self) -> Choice | None:
        if self.choice is None or self.nbytes < 0:
            return self.choice
        name, algo, _, seg, predicted = self.choice
        if algo == "sized":
            if self.shape is None:
                return self.choice
            algo, predicted = self.shape, self.predicted
        return (name, algo, self.nbytes, seg, predicted)


def pick_v(name: str, algorithm: str, only: str) -> str:
    """The algorithm of an uneven ("v") collective: there is one, ``only``."""
    if algorithm not in ("auto", only):
        raise ValueError(
            f"{name} of uneven sizes (a list / uneven=True) has no algorithm {algorithm!r}; choose 'auto' or {only!r}"
        )
    return only


def check_root(e: Engine, root: Any) -> int:
    return ranks.check_root(root, e.world_size)


def fp(e: Engine, name: str, *, segmented: bool = True, segment: int | None = None, **parts: Any) -> str:
    """The call's fingerprint, sent with every frame. ``segmented``: the
    message pattern depends on ``segment_bytes`` (``segment``, else the
    communicator's), so it is part of it (ranks with different segment sizes
    would otherwise exchange mis-cut messages)."""
    if segmented:
        parts["segment_bytes"] = e.segment_bytes if segment is None else segment
    return _format_fp(name, tuple(parts.items()))


@functools.lru_cache(maxsize=1024)
def _format_fp(name: str, parts: tuple[tuple[str, Any], ...]) -> str:
    return f"{name}({', '.join(f'{k}={v}' for k, v in parts)})"


def flat_bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def is_list(x: Any) -> bool:
    """Uneven ("v") input: a list or tuple of per-rank arrays."""
    return isinstance(x, (list, tuple))


def dtype_name(dt: np.dtype) -> str:
    return "bfloat16" if dt == BFLOAT16 else dt.name


def contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` itself when C-contiguous (it is only read), else a C-contiguous copy."""
    return a if a.flags.c_contiguous else np.array(a, order="C", copy=True)


def result(out: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The caller's ``out`` (checked) or a new array for a collective's result."""
    if out is None:
        return resultpool.empty(shape, dtype)
    return check_out(out, shape, dtype)


def unaliased(x: np.ndarray, out: np.ndarray, in_place: np.ndarray | None = None) -> np.ndarray:
    """``x``, or a copy of it if it overlaps ``out`` (other than being exactly
    ``in_place``, the part of ``out`` it belongs in): an input the result
    would overwrite while it is still being sent."""
    if not np.may_share_memory(x, out):
        return x
    if (
        in_place is not None
        and x.shape == in_place.shape
        and x.strides == in_place.strides
        and x.__array_interface__["data"][0] == in_place.__array_interface__["data"][0]
    ):
        return x
    return np.array(x, order="C", copy=True)


def array_list(x: Any, world_size: int, what: str) -> list[np.ndarray]:
    """Check an uneven ("v") argument: ``world_size`` arrays of one supported
    dtype (any shapes). Raises before any byte is sent."""
    arrs = [as_array(a, f"{what}[{k}]") for k, a in enumerate(x)]
    if len(arrs) != world_size:
        raise ValueError(f"{what} needs one array per rank: a list of world_size={world_size} arrays, got {len(arrs)}")
    dtypes = sorted({dtype_name(a.dtype) for a in arrs})
    if len(dtypes) > 1:
        raise TypeError(f"{what}: every array of the list must have the same dtype, got {', '.join(dtypes)}")
    return [contiguous(a) for a in arrs]


def shapes(arrs: list[np.ndarray]) -> str:
    """The shapes of a list for a fingerprint (a digest when long: the
    fingerprint rides on every frame)."""
    text = ";".join(f"[{','.join(map(str, a.shape))}]" for a in arrs)
    if len(text) <= 200:
        return text
    return f"{len(arrs)} shapes sha1:{hashlib.sha1(text.encode()).hexdigest()[:16]}"


def check_uneven(uneven: Any) -> bool:
    if not isinstance(uneven, bool):
        raise TypeError(f"uneven must be True or False, got {uneven!r}")
    return uneven
