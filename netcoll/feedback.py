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
the gradients' size once more), updated in place. CPU: one add, one round trip through the
codec and one subtraction per element and step, chunk by chunk in cache (:data:`CHUNK`), on
top of the collective's own encoding. Where torch is loaded (the DDP hook) and the codec
casts through it (:mod:`netcoll.casts`), float32 with fp16 or bf16 runs that loop with
torch's kernels on tensors made once per call, its very casts (the same bits): 22.4 M float32
gradients in about 23 ms of CPU (28 with torch's casts in numpy's loop, 135 through numpy
alone). A key whose size or dtype changes starts over from a zero residual (DDP rebuilds its
buckets after the first step).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Final

import numpy as np

from . import casts
from .compression import INT8_BLOCK, check_codec, decode, encode, encoded_nbytes, parse_compression
from .ops import BFLOAT16

__all__ = ["CHUNK", "ErrorFeedback", "Roundtrip", "codec_roundtrip", "shards", "transmitted"]


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


#: ``roundtrip(src, dst)``: ``decode(encode(src))`` written into ``dst`` (flat arrays of one
#: dtype and size)
Roundtrip = Callable[[np.ndarray, np.ndarray], None]

#: Elements compensated at a time (256 KiB of float32: each chunk's add, round trip and
#: subtraction run on data in cache); a multiple of INT8_BLOCK, so a chunk's int8 blocks
#: are those of its shard's encoding.
CHUNK: Final = 128 * INT8_BLOCK


def codec_roundtrip(codec: str, dtype: np.dtype) -> Roundtrip:
    """The codec's round trip (:func:`~netcoll.compression.encode` then
    :func:`~netcoll.compression.decode`) of inputs of ``dtype``, through one scratch of
    :data:`CHUNK` elements' encoding (a larger input gets its own). Where torch is loaded
    (the DDP hook) the codec casts through it (:mod:`netcoll.casts`): 0.2 ns an element."""
    scratch = np.empty(encoded_nbytes(codec, dtype, CHUNK), np.uint8)  # one per compensate call

    def roundtrip(src: np.ndarray, dst: np.ndarray) -> None:
        n = encoded_nbytes(codec, dtype, src.size)
        decode(codec, encode(codec, src, out=scratch[:n] if n <= scratch.size else None), dst)

    return roundtrip


#: the wire dtype of each codec error feedback may run through torch (:func:`netcoll.casts.feedback_loop`)
_WIRE: Final = {"fp16": np.dtype(np.float16), "bf16": BFLOAT16}


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
        array of ``x``'s shape, in one pass; the new residual (that sum minus what the wire
        will carry of it) replaces the old one, in the old one's memory. (The residual of
        shard ``rank``, sent as it is, stays zero.)"""
        check_codec(self.codec, x.dtype, "ErrorFeedback")
        dst = np.empty_like(x, order="C") if out is None else out
        if dst.shape != x.shape or dst.dtype != x.dtype or not dst.flags.c_contiguous:
            raise ValueError(
                f"ErrorFeedback: out must be a contiguous {x.dtype}{list(x.shape)} like x, "
                f"not {dst.dtype}{list(dst.shape)}"
            )
        flat, src = dst.reshape(-1), np.ascontiguousarray(x).reshape(-1)  # views (unless x is strided)
        in_place = src.ctypes.data == flat.ctypes.data
        if not in_place and np.may_share_memory(src, flat):  # overlapping otherwise: read a copy
            src = src.copy()
        res = self._residuals.get(key)
        if res is None or res.size != flat.size or res.dtype != flat.dtype:
            res = self._residuals[key] = np.zeros(flat.size, flat.dtype)  # calloc: pages zeroed as first touched
        bounds = shards(flat.size, self.world_size)
        drops = self.codec != "none" and self.world_size > 1
        coded = [ab for k, ab in enumerate(bounds) if drops and k != self.rank and ab[1] > ab[0]]
        if not in_place:  # the rest is sent as it is (shard ``rank``): its residual stays zero
            for a, b in bounds if not drops else [bounds[self.rank]]:
                flat[a:b] = src[a:b]
        wire = _WIRE.get(self.codec)
        if coded and (wire is None or not casts.feedback_loop(wire, src, flat, res, coded, CHUNK)):
            roundtrip = codec_roundtrip(self.codec, flat.dtype)
            for a, b in coded:
                for i in range(a, b, CHUNK):
                    j = min(i + CHUNK, b)
                    f, r = flat[i:j], res[i:j]
                    np.add(src[i:j], r, out=f)
                    roundtrip(f, r)
                    np.subtract(f, r, out=r)
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
