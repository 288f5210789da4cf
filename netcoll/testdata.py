"""Deterministic, checkable data for benchmarks and generated-data jobs.

Rank ``k``'s data is element ``i`` = ``T[(i + 7919 k) mod 65521]`` for a fixed
pseudo-random table ``T`` of small integers, with values chosen per reduction
and dtype so that sums, products, min/max, averages and bitwise ops over many
ranks stay exact in every dtype, bfloat16 included — in any reduction order, so
a correct result compares equal, element for element, to a numpy reference.

Because every buffer is periodic, inputs and expected outputs are made from one
period, in chunks: checking a result costs a compare per element and a few MiB
of memory, never a second full-size array.

This module knows nothing of collectives; :mod:`netcoll.collectives` says
which rank's pattern (or the reduction of all of them) belongs where in each
collective's input and output.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

import numpy as np

from .ops import reduce_reference

__all__ = ["CHUNK", "MAX_ABS", "PERIOD", "RANK_SHIFT", "Pattern", "TestData"]

PERIOD: Final = 65521  # prime, so no power-of-two segment or block size is a multiple of it
RANK_SHIFT: Final = 7919  # rank k's data is the table rotated by k * RANK_SHIFT
CHUNK: Final = 4 * PERIOD  # elements per fill / compare step
#: Rank patterns kept at once (each is a few MiB): verifying an all_gather of many ranks
#: walks through them in order, so memory stays bounded whatever the world size.
CACHED_PATTERNS: Final = 8

_TABLE = np.random.default_rng(20240604).integers(-8, 9, size=PERIOD, dtype=np.int64)
#: the largest magnitude of a float rank's data (compressed checks scale their tolerance by it)
MAX_ABS: Final = 8


def _values(redop: str, dt: np.dtype) -> np.ndarray:
    """The table as exact values of ``dt`` that keep ``redop`` exact over many ranks."""
    t = _TABLE
    if dt.kind == "b":
        return (t % 2).astype(bool)
    if redop == "prod":  # products of {-1, 1, 2} (unsigned: {1, 2}) stay small
        pick = np.array([1, 2, 1] if dt.kind == "u" else [-1, 1, 2], dtype=np.int64)
        return pick[t % 3].astype(dt)
    if dt.kind == "u":
        return (t + 8).astype(dt)
    return t.astype(np.float32).astype(dt) if dt.kind not in "iuc" else t.astype(dt)


class Pattern:
    """A periodic flat buffer with period ``len(base)``: element ``i`` is ``base[i % P]``."""

    def __init__(self, base: np.ndarray) -> None:
        self.period = len(base)
        self.ext = np.tile(base, CHUNK // self.period + 2)  # any window of CHUNK from any phase

    def window(self, start: int, m: int) -> np.ndarray:
        off = start % self.period
        return self.ext[off : off + m]

    def fill(self, out: np.ndarray, start: int = 0) -> None:
        """``out[i] = pattern[start + i]`` (``out`` is flat)."""
        for s in range(0, len(out), CHUNK):
            m = min(CHUNK, len(out) - s)
            out[s : s + m] = self.window(start + s, m)

    def count_wrong(self, got: np.ndarray, start: int = 0, atol: float = 0.0) -> int:
        """Elements of flat ``got`` that differ from ``pattern[start:]`` (by more than
        ``atol``, when given: a lossy compressed collective's result; NaN is wrong)."""
        wrong = 0
        for s in range(0, len(got), CHUNK):
            m = min(CHUNK, len(got) - s)
            want = self.window(start + s, m)
            if atol:
                near = np.abs(got[s : s + m].astype(np.float64) - want.astype(np.float64)) <= atol
                wrong += m - int(np.count_nonzero(near))
            else:
                wrong += int(np.count_nonzero(got[s : s + m] != want))
        return wrong


class TestData:
    """Every rank's pattern and their reduction, for one (reduction, dtype, world size).

    Patterns are built on first use and the last few are cached; :meth:`forget`
    drops them between sizes of a sweep.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, redop: str, dtype: np.dtype, world_size: int) -> None:
        self.redop, self.dtype, self.world_size = redop, np.dtype(dtype), world_size
        self._values = _values(redop, self.dtype)
        self._patterns: OrderedDict[int, Pattern] = OrderedDict()
        self._reduced: Pattern | None = None

    def base(self, rank: int) -> np.ndarray:
        """One period of rank ``rank``'s data."""
        return np.roll(self._values, -(rank * RANK_SHIFT) % PERIOD)

    def pattern(self, rank: int) -> Pattern:
        """Rank ``rank``'s pattern."""
        pattern = self._patterns.get(rank)
        if pattern is None:
            pattern = self._patterns[rank] = Pattern(self.base(rank))
            while len(self._patterns) > CACHED_PATTERNS:
                self._patterns.popitem(last=False)
        else:
            self._patterns.move_to_end(rank)
        return pattern

    def reduced(self) -> Pattern:
        """The reduction over all ranks (in rank order, then finalized, as the reference does)."""
        if self._reduced is None:
            self._reduced = Pattern(reduce_reference(self.redop, [self.base(k) for k in range(self.world_size)]))
        return self._reduced

    def array(self, shape: tuple[int, ...], rank: int) -> np.ndarray:
        """A new array of ``shape`` holding rank ``rank``'s pattern from element 0 on."""
        x = np.empty(shape, dtype=self.dtype)
        self.pattern(rank).fill(x.reshape(-1))
        return x

    def forget(self) -> None:
        """Drop the cached patterns (they are rebuilt on demand)."""
        self._patterns.clear()
        self._reduced = None
