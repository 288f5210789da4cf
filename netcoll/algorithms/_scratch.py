"""How every rank cuts the same buffer the same way, and the algorithms' scratch memory
(no networking).

* :func:`split` / :func:`num_segments` — a pure function of sizes, so senders and
  receivers agree without talking; :data:`DEFAULT_SEGMENT_BYTES` is a message's largest
  payload unless a call says otherwise.
* :func:`scratch_depth` / :func:`slice_segments` — how many scratch segments (receives
  posted ahead) a reduction uses, and how much of a chunk a ring runs at once.
* :data:`SCRATCH_POOL` / :func:`scratch` — reusable, already-mapped scratch arrays.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any, Final

import numpy as np

#: Largest payload of one message, unless a call says otherwise (Gloo's
#: ``kMaxSegmentSize``). Every rank of one operation must use the same value.
#: Measured: 4 MiB beats 1 MiB and 256 KiB at 2, 4, 8 ranks (2026-11; git history of benchmarks.md).
DEFAULT_SEGMENT_BYTES: Final = 4 << 20

#: Reducing algorithms receive into scratch segment buffers used round-robin;
#: at least this many, so two receives stay posted while one is reduced.
MIN_SCRATCH_SEGMENTS: Final = 3
#: ... and at most this many bytes of them, however many they would want.
SCRATCH_BUDGET_BYTES: Final = 32 << 20


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` bounds of ``parts`` nearly equal pieces of ``range(n)``
    (the first ``n % parts`` pieces are one longer, like ``np.array_split``)."""
    q, rem = divmod(n, parts)
    bounds = []
    start = 0
    for i in range(parts):
        stop = start + q + (1 if i < rem else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def num_segments(nbytes: int, segment_bytes: int) -> int:
    """Segments needed to move ``nbytes`` in pieces of at most ``segment_bytes``
    (at least one, so that even an empty message is a message)."""
    return max(1, -(-nbytes // segment_bytes))


def scratch_depth(want: int, segment_nbytes: int) -> int:
    """How many scratch segments (= receives posted ahead) to use: ``want``,
    clamped to ``[MIN_SCRATCH_SEGMENTS, SCRATCH_BUDGET_BYTES / segment]``."""
    cap = max(MIN_SCRATCH_SEGMENTS, SCRATCH_BUDGET_BYTES // max(1, segment_nbytes))
    return max(MIN_SCRATCH_SEGMENTS, min(want, cap))


def slice_segments(segments: int, segment_nbytes: int) -> int:
    """How many of each chunk's ``segments`` a ring reduction runs at once (a *slice*;
    NCCL loops over a large buffer the same way): at most the scratch budget less two,
    so that a slice's ``S+2`` receives posted ahead cover a whole step. With a whole
    chunk at once and fewer receives posted, a rank's next-step send waits for a
    receive its neighbour posts only after receiving more from this rank: a cycle once
    the receive window is full (issue 38: 300 MiB at 4 ranks, 64 MiB window)."""
    return max(1, min(segments, scratch_depth(segments + 2, segment_nbytes) - 2))


class _ScratchPool:
    """Reusable scratch memory for the algorithms of this process. Fresh large
    arrays cost a page fault per 4 KiB on first touch, every call; pooled ones
    are already mapped. Buffers are taken for one algorithm run and given back."""

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self.free: list[np.ndarray] = []
        self.lock = threading.Lock()  # event loops in several threads may share the process

    def take(self, nbytes: int) -> np.ndarray:
        with self.lock:
            fits = [i for i, b in enumerate(self.free) if b.nbytes >= nbytes]
            if fits:
                return self.free.pop(min(fits, key=lambda i: self.free[i].nbytes))
        return np.empty(nbytes, dtype=np.uint8)

    def after_fork(self) -> None:
        """In a forked child: a new lock (another thread may have held the old one)."""
        self.lock = threading.Lock()

    def give(self, buf: np.ndarray) -> None:
        with self.lock:
            self.free.append(buf)
            self.free.sort(key=lambda b: -b.nbytes)
            while sum(b.nbytes for b in self.free) > self.keep_bytes:
                self.free.pop(0)  # drop the largest first


SCRATCH_POOL: Final = _ScratchPool(keep_bytes=2 * SCRATCH_BUDGET_BYTES)
os.register_at_fork(after_in_child=SCRATCH_POOL.after_fork)


@contextlib.contextmanager
def scratch(depth: int, count: int, dtype: Any) -> Iterator[list[np.ndarray]]:
    """``depth`` scratch arrays of ``count`` elements of ``dtype``, from the pool."""
    dt = np.dtype(dtype)
    seg = count * dt.itemsize
    raw = SCRATCH_POOL.take(depth * seg)
    try:
        yield [raw[i * seg : (i + 1) * seg].view(dt) for i in range(depth)]
    finally:
        SCRATCH_POOL.give(raw)


__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "MIN_SCRATCH_SEGMENTS",
    "SCRATCH_BUDGET_BYTES",
    "SCRATCH_POOL",
    "num_segments",
    "scratch",
    "scratch_depth",
    "slice_segments",
    "split",
]
