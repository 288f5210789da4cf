"""Memory for large collective results, reused once the caller drops them.

A collective called without ``out=`` returns a new array. Below
:data:`POOL_MIN` bytes that is plain ``np.empty``: glibc serves it from its
heap and reuses freed memory. Above glibc's largest ``mmap`` threshold (32
MiB on 64-bit Linux) every ``malloc`` is a fresh ``mmap`` and every ``free``
an ``munmap``, so each call zero-fills its result in the kernel, page by page,
before a byte arrives: measured at 64 MiB over shared-memory links, 950 page
faults and 28 ms of system time per call and rank, a quarter of the CPU the
call costs (``clear_page_erms``, docs/performance.md). Gloo and MPI
benchmarks reuse one buffer; a training loop that calls us the same way each
step should not pay that either.

So results of at least :data:`POOL_MIN` bytes come from blocks this pool
keeps: a block goes back to the pool when the last array using it is gone
(the result, every view of it, any ``torch.from_numpy`` of it), never before.
That is tracked by a small ctypes object over the block that every such array
holds (numpy's views all keep it alive); a ``weakref.finalize`` on it returns
the block. Free blocks are kept up to :data:`DEFAULT_KEEP` bytes in all, the largest
dropped first; ``NETCOLL_RESULT_POOL`` sets that (``0`` turns pooling off), read
when a communicator is made (a malformed value fails that, not a collective).
Closing a communicator drops the free blocks, and so does a rank daemon after
each job: memory is kept for reuse only while collectives run.

What a caller sees: the same dtype, shape and C order as ``np.empty``, writable,
with undefined contents until the collective fills them; ``owndata`` is false,
so ``ndarray.resize`` in place is refused (``np.resize`` works).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import weakref
from typing import Any, Final

import numpy as np

from . import settings

#: results of at least this many bytes are pooled (glibc's DEFAULT_MMAP_THRESHOLD_MAX)
POOL_MIN: Final = 32 << 20
#: blocks are sized in steps of this (a transparent huge page), so nearby sizes share them
GRAIN: Final = 2 << 20
#: free bytes kept by default
DEFAULT_KEEP: Final = 256 << 20
ENV: Final = settings.registry.RESULT_POOL.name


def keep_from_env(env: Any = None) -> int:
    """``NETCOLL_RESULT_POOL`` (a size: ``0``, ``512M``…) or the default; ValueError if malformed."""
    keep = settings.result_pool(env)
    return DEFAULT_KEEP if keep is None else keep


class ResultPool:
    """Blocks of memory for large results; see the module docstring."""

    def __init__(self, keep_bytes: int = DEFAULT_KEEP, min_bytes: int = POOL_MIN) -> None:
        self.keep_bytes = 0
        self.min_bytes = min_bytes
        self._free: dict[int, list[np.ndarray]] = {}  # capacity -> free blocks
        self._lock = threading.Lock()  # finalizers run in whichever thread drops the last reference
        self.held = 0  # bytes of free blocks
        self.lent = 0  # blocks out now
        self.reused = 0  # results served from a free block
        self.made = 0  # blocks allocated
        self.configure(keep_bytes)

    def configure(self, keep_bytes: int) -> None:
        """Keep at most ``keep_bytes`` of free blocks (0: pool nothing from now on)."""
        if isinstance(keep_bytes, bool) or not isinstance(keep_bytes, int) or keep_bytes < 0:
            raise ValueError(f"the result pool's size must be an int of at least 0 bytes, got {keep_bytes!r}")
        with self._lock:
            self.keep_bytes = keep_bytes
            self._trim()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array, as ``np.empty(shape, dtype)``."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        if nbytes < self.min_bytes or not self.keep_bytes:
            return np.empty(shape, dtype=dt)
        capacity = -(-nbytes // GRAIN) * GRAIN
        block = self._take(capacity)
        holder = (ctypes.c_char * capacity).from_buffer(block)  # (ctypes keeps a type per length: few)
        weakref.finalize(holder, self._give, block).atexit = False
        return np.frombuffer(holder, dtype=dt, count=nbytes // dt.itemsize).reshape(shape)

    def _take(self, capacity: int) -> np.ndarray:
        with self._lock:
            self.lent += 1
            free = self._free.get(capacity)
            if free:
                self.held -= capacity
                self.reused += 1
                return free.pop()
            self.made += 1
        return np.empty(capacity, dtype=np.uint8)

    def _give(self, block: np.ndarray) -> None:
        capacity = block.nbytes
        with self._lock:
            self.lent -= 1
            self._free.setdefault(capacity, []).append(block)
            self.held += capacity
            self._trim()

    def _trim(self) -> None:
        while self.held > self.keep_bytes:  # drop the largest first
            largest = max(c for c, blocks in self._free.items() if blocks)
            self._free[largest].pop()
            self.held -= largest

    def after_fork(self) -> None:
        """In a forked child: a new lock (another thread may have held the old one)."""
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Drop every free block (lent ones come back as usual)."""
        with self._lock:
            self._free.clear()
            self.held = 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"held_bytes": self.held, "lent": self.lent, "reused": self.reused, "made": self.made}


#: the process's pool; every communicator sets its size from ``NETCOLL_RESULT_POOL`` when made
RESULTS: Final = ResultPool()
os.register_at_fork(after_in_child=RESULTS.after_fork)


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A result array from the process's pool (:data:`RESULTS`)."""
    return RESULTS.empty(shape, dtype)


__all__ = ["ResultPool", "RESULTS", "empty", "POOL_MIN", "GRAIN", "DEFAULT_KEEP", "keep_from_env"]
