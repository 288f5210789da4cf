"""The *stream* of a heal: the bytes of a state's arrays one after another
(entry order, C order), cut into *slices* (each sent by one live member and
checked by one checksum) and slices into *chunks* (each one message).

Slices: ``k`` sources share a stream of ``T`` bytes in ``n = k * ceil(T / (k
* slice_bytes))`` slices of ``ceil(T / n)`` bytes (rounded up to
:data:`ALIGN`; the last ones shorter or empty), slice ``i`` sent by source
``i mod k``: every source sends the same share, and no slice is over
``slice_bytes`` by more than the rounding. A chunk is at most ``chunk_bytes``
of a slice; one that lies inside one array is sent as a view of it (no copy),
one that spans arrays as a copy of its pieces (at most ``chunk_bytes``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

import numpy as np

#: slice sizes are rounded up to a multiple of this (pages: views stay aligned)
ALIGN = 4096


def slices(total: int, sources: int, slice_bytes: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` byte ranges of the slices of a stream of ``total`` bytes."""
    if total == 0:
        return []
    n = sources * _ceil(total, sources * slice_bytes)
    size = _ceil(_ceil(total, n), ALIGN) * ALIGN
    return [(min(i * size, total), min((i + 1) * size, total)) for i in range(n)]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def chunks(start: int, end: int, chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """``[start, end)`` in pieces of at most ``chunk_bytes``."""
    for a in range(start, end, chunk_bytes):
        yield a, min(a + chunk_bytes, end)


class Stream:
    """A state's arrays seen as one byte stream: :meth:`read` a range (a view when it lies
    inside one array), :meth:`write` bytes at an offset (into the arrays)."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self._bytes = [_bytes_of(a) for a in arrays if a.nbytes]
        self._starts = [0]
        for b in self._bytes:
            self._starts.append(self._starts[-1] + b.nbytes)

    @property
    def nbytes(self) -> int:
        return self._starts[-1]

    def _pieces(self, a: int, b: int) -> Iterator[tuple[int, int, int]]:
        """``(array index, start in it, end in it)`` covering stream bytes ``[a, b)``."""
        if not 0 <= a <= b <= self.nbytes:
            raise ValueError(f"stream range [{a}, {b}) outside [0, {self.nbytes})")
        k = bisect.bisect_right(self._starts, a) - 1
        while a < b:
            base = self._starts[k]
            stop = min(b, self._starts[k + 1])
            yield k, a - base, stop - base
            a, k = stop, k + 1

    def read(self, a: int, b: int) -> np.ndarray:
        """Stream bytes ``[a, b)`` as a flat uint8 array: a view when inside one array, else a copy."""
        pieces = [self._bytes[k][x:y] for k, x, y in self._pieces(a, b)]
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.empty(0, np.uint8)

    def write(self, a: int, data: np.ndarray) -> None:
        """Copy ``data`` (flat uint8) to stream bytes ``[a, a + len(data))``."""
        at = 0
        for k, x, y in self._pieces(a, a + data.nbytes):
            self._bytes[k][x:y] = data[at : at + y - x]
            at += y - x


def _bytes_of(a: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array (a C-order copy of any other)."""
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)


__all__ = ["ALIGN", "Stream", "chunks", "slices"]
