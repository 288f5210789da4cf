"""Error feedback for compressed gradient averaging: what a codec dropped from one step's
contribution is added to the next step's, so nothing is lost for good.

A compressed all_reduce (:mod:`netcoll.algorithms.compressed`) cuts a rank's input into
``world_size`` shards (:func:`shards`, the same cut), encodes every shard but its own
(shard ``rank``, which it reduces as it is) and sends it; the reduction then sums the
decoded values. :class:`ErrorFeedback` computes locally, with the same pure codec
functions (:mod:`netcoll.compression`), what the wire will carry of a contribution, and
keeps the difference, the *residual*, per key (a DDP bucket's index, a parameter's name)::

    feedback = ErrorFeedback("int8", rank=comm.rank, world_size=comm.world_size)
    g = feedback.compensate("grads", g)          # g + last step's residual; remembers the new one
    g = comm.all_reduce(g, op="avg", compression="int8")

Algebra (tested): over any number of steps, the sum of what the wire carried of a key's
contributions plus its final residual equals the sum of the inputs (up to float rounding
of the additions). The collective's second encoding (each reduced shard, before the
all_gather) is the same on every rank and is not fed back.

Memory: one residual per key, the size and dtype of its input (for DDP: one per bucket, so
the gradients' size once more). CPU: one encode and one decode of the input per step, on
top of the collective's own. A key whose size or dtype changes starts over from a zero
residual (DDP rebuilds its buckets after the first step).
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from .compression import check_codec, decode, encode, parse_compression

__all__ = ["ErrorFeedback", "shards", "transmitted"]


def shards(n: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of the ``parts`` shards a compressed all_reduce cuts ``n``
    elements into (the first ``n % parts`` one longer; the collective's own cut)."""
    q, rem = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + q + (1 if i < rem else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def transmitted(codec: str, x: np.ndarray, rank: int = 0, world_size: int = 1) -> np.ndarray:
    """What a compressed all_reduce of ``world_size`` ranks takes of rank ``rank``'s
    contribution ``x``: every shard through the codec (``decode(encode(shard))``), shard
    ``rank`` as it is. A new flat array of ``x``'s dtype."""
    flat = np.ascontiguousarray(x).reshape(-1)
    out = flat.copy()
    if codec == "none" or world_size == 1:
        return out
    for k, (a, b) in enumerate(shards(flat.size, world_size)):
        if k != rank and b > a:
            decode(codec, encode(codec, flat[a:b]), out[a:b])
    return out


class ErrorFeedback:
    """Residuals of compressed contributions, per key, for rank ``rank`` of
    ``world_size`` under ``codec`` (see the module docstring)."""

    def __init__(self, codec: str, *, rank: int = 0, world_size: int = 1) -> None:
        self.codec = parse_compression(codec)
        if not 0 <= rank < world_size:
            raise ValueError(f"ErrorFeedback: rank must be in [0, world_size={world_size}), not {rank}")
        self.rank, self.world_size = rank, world_size
        self._residuals: dict[Hashable, np.ndarray] = {}

    def compensate(self, key: Hashable, x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
        """``x`` plus ``key``'s residual (zero the first time, or after ``x``'s size or
        dtype changed), into ``out`` when given (``x`` itself may be ``out``), else a new
        array of ``x``'s shape; the new residual (that sum minus what the wire will carry
        of it) replaces the old one."""
        check_codec(self.codec, x.dtype, "ErrorFeedback")
        dst = np.array(x, copy=True) if out is None else out
        if dst.shape != x.shape or dst.dtype != x.dtype or not dst.flags.c_contiguous:
            raise ValueError(
                f"ErrorFeedback: out must be a contiguous {x.dtype}{list(x.shape)} like x, "
                f"not {dst.dtype}{list(dst.shape)}"
            )
        flat = dst.reshape(-1)  # a view (dst is contiguous: new, or a buffer the caller owns)
        if out is not None and x is not out:
            flat[...] = x.reshape(-1)
        old = self._residuals.get(key)
        if old is not None and old.size == flat.size and old.dtype == flat.dtype:
            flat += old
        sent = transmitted(self.codec, flat, self.rank, self.world_size)
        self._residuals[key] = np.subtract(flat, sent, out=sent)  # reuses sent's memory
        return dst

    def residual(self, key: Hashable) -> np.ndarray | None:
        """``key``'s residual (flat), if it has one."""
        return self._residuals.get(key)

    def held(self) -> list[Hashable]:
        """The keys that have a residual."""
        return list(self._residuals)

    def discard(self, key: Hashable) -> None:
        """Forget ``key``'s residual (if any)."""
        self._residuals.pop(key, None)

    def reset(self) -> None:
        """Forget every residual."""
        self._residuals.clear()

    @property
    def nbytes(self) -> int:
        """Bytes the residuals hold."""
        return sum(r.nbytes for r in self._residuals.values())
