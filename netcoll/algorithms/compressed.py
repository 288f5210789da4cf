"""Compressed reductions: all_reduce, reduce and reduce_scatter with every
contribution sent through a codec (:mod:`netcoll.compression`), reduced in the
input's dtype (as torchft's quantized all-reduce: a quantized all-to-all, a reduction
in full precision, a quantized all-gather).

How it works, ``P`` ranks, ``N`` elements cut into ``P`` shards (:func:`split`):

1. *Exchange* (a reduce-scatter by all-to-all): rank ``r`` encodes shard ``k`` of its
   input into slot ``k`` of a byte buffer (every slot sized for the largest shard) and
   an all_to_all (``exchange``: :mod:`.pairwise` or :mod:`.linear`, the caller's choice)
   hands slot ``r`` of every rank to rank ``r``. Rank ``r`` decodes each into the input
   dtype and reduces the ``P`` contributions **in rank order** ``0, 1, ..., P-1``, its own
   taken as it is (not encoded).
2. ``all_reduce``: rank ``r`` encodes its reduced shard and a ring all_gather
   (:mod:`.ring`) hands every encoded shard to every rank, which decodes all of them, its
   own included: every rank decodes the same bytes, so the result is **bit-identical on
   every rank** (and is the round trip of each reduced shard through the codec).
   With ``average`` (op avg, as :mod:`netcoll.calls.compressed` asks) each decoded shard
   is divided by ``P`` right after its decode, from cache (:func:`divider`: the bits of
   :func:`~netcoll.ops.finalize` after the decode), not in a pass over the result at the end.
   ``reduce_scatter`` is step 1 alone, its ``P`` blocks the shards.

``reduce`` is a direct gather (:mod:`.direct`) of every rank's encoded input to the
root, which reduces them in rank order (its own as it is): ``(P-1) c N`` bytes in all,
``c`` times what the uncompressed tree sends (and less than the ring's), but all into
the root. (A tree of re-encoded partial sums would spread that load at the cost of one
codec error per level: not done.)

Phase 2 runs on the same operation with its steps shifted by :data:`PHASE_STEP`
(:class:`Shifted`), so its messages never meet phase 1's.

An all_reduce runs in *pieces* (:func:`pieces`, :mod:`._pieces`): piece ``j`` is elements
``x_j`` to ``y_j`` of every shard (full pieces of ``S`` = :data:`PIECE_BYTES` of input, a
multiple of :data:`~netcoll.compression.INT8_BLOCK` elements, and :data:`TAPER` pieces of
``S/8, S/4, S/2`` ramping up at the start and down at the end), and runs both phases on its
own steps (shifted by ``j`` :data:`PIECE_SHIFT`); up to :data:`WINDOW` pieces are in their
exchange and :data:`DEPTH` under way at once, so one piece's encoding, reduction and
decoding run while another's bytes cross the links. Every piece starts on an int8 block, so
its encoding is that part of its whole shard's encoding and the result has the bits of one
piece (tested). A message too short for the ramps is cut evenly. Measured on emulated
1 Gbit/s links (4 ranks on 2 cores; docs/emulated-network.md, "Compression, weighted shares
and DDP against Gloo"; 64 MiB of float32, ``python3 -m bench.wire --codecs fp16,int8``,
medians of 3 calls, interleaved runs on a machine loaded 2 to 9 by other benchmarks and
tests): fp16 in 2 MiB pieces, 4 at once as one window, took 499 to 570 ms (6 runs); ramps
alone or 8 under way alone did not help (561-564, 542-553 ms); both, 3 ramping pieces and
4 exchanges of 8 pieces under way, 461 to 492 ms (6 runs; Gloo 846 ms in one of them:
1.76x its bus bandwidth). int8 took 344 to 461 ms in 4 MiB pieces two at once (4 runs),
299 to 321 ms on this schedule (6 runs; two more at 435 and 546 ms while other tests ran,
load 3.6). Traced per rank (fp16): with one window of 4, the links ran at 75-85% of their
rate, idle for 20-30 ms at the start and between waves of pieces (the next piece waited for
the oldest one's all_gather); with this schedule at 90-97% from the first 20 ms, half idle
in the last 20 ms. It costs CPU: 146 ms per call and rank against 122-135, spread over the
interpreter, the kernel's TCP and scheduling (perf, one loaded run; no more memory copies).

Cost, ``N`` bytes of input and a codec of ratio ``c`` (:func:`~netcoll.compression.encoded_nbytes`
over input bytes: fp16 0.5, int8 about 0.25 for float32): all_reduce ``2 (P-1)/P c N``
bytes sent per rank (the ring's volume times ``c``) in ``2(P-1)`` steps; reduce_scatter
``(P-1)/P c N``; reduce ``c N`` per non-root, ``(P-1) c N`` into the root. Each contribution is
encoded once and (all_reduce) each reduced shard once, so the error is one codec error
per contribution (plus one for the all_reduce's result).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, NamedTuple

import numpy as np

from ..compression import FOLD, decode, encode, encoded_nbytes, fold
from ..mesh.channel import Channel
from ..ops import BFLOAT16, ReduceOp, reduce_into
from . import _pieces, direct, ring
from ._args import flat
from ._pieces import pieces
from ._scratch import DEFAULT_SEGMENT_BYTES, SCRATCH_POOL, split

__all__ = ["PHASE_STEP", "Schedule", "Shifted", "all_reduce", "pieces", "reduce", "reduce_scatter"]

#: Phase 2's steps are phase 1's plus this (no algorithm of phase 1 runs as many steps).
PHASE_STEP: Final = 1 << 24
#: Piece ``j`` of an all_reduce runs its steps shifted by ``j`` times this (both phases).
PIECE_SHIFT: Final = 2 * PHASE_STEP
#: Input bytes of every shard in one full piece of an all_reduce (:func:`pieces`).
PIECE_BYTES: Final = 2 << 20
#: Pieces of an all_reduce in their exchange at once.
WINDOW: Final = 4
#: Pieces of an all_reduce under way at once (in their exchange or their all_gather).
DEPTH: Final = 8
#: Pieces ramping up and down at each end of an all_reduce (:func:`~._pieces.schedule`).
TAPER: Final = 3


class Schedule(NamedTuple):
    """How an all_reduce runs in pieces (:mod:`._pieces`)."""

    piece_bytes: int
    window: int
    depth: int
    taper: int


#: A codec's own schedule, where it differs from :data:`PIECE_BYTES`, :data:`WINDOW`,
#: :data:`DEPTH` and :data:`TAPER` (none does: int8's former 4 MiB pieces, two at once, took
#: 364 and 461 ms, its 4 MiB pieces tapered with 2 exchanges of 4 under way 326 and 450 ms,
#: the common schedule 312 and 313 ms; medians of 3 calls, load 2.9-4).
PIECES: Final[dict[str, Schedule]] = {}

Exchange = Callable[..., Any]  # an all_to_all of ALGORITHMS["all_to_all"]


class Shifted(Channel):
    """``ch`` with every step shifted by ``shift``: a second phase of one operation."""

    __slots__ = ("shift",)

    def __init__(self, ch: Channel, shift: int) -> None:
        super().__init__(ch.mesh, ch.op)
        self.shift = shift

    async def send(self, peer: int, data: Any, *, step: int, chunk: int = 0, meta: Any = None) -> None:
        await super().send(peer, data, step=step + self.shift, chunk=chunk, meta=meta)

    def post(self, peer: int, *, step: int, chunk: int = 0, out: Any = None, fold: Any = None) -> Any:
        return super().post(peer, step=step + self.shift, chunk=chunk, out=out, fold=fold)

    def post_either(self, sources: Sequence[tuple[int, int]], *, chunk: int = 0, out: Any = None) -> Any:
        raise NotImplementedError("a shifted phase posts from one source at a time")

    def unpost(self, peer: int, *, step: int, chunk: int = 0) -> None:
        super().unpost(peer, step=step + self.shift, chunk=chunk)

    def lend_from(self, step: int) -> None:
        super().lend_from(step + self.shift)

    def sync_from(self, step: int) -> None:
        super().sync_from(step + self.shift)

    def lends(self, peer: int, nbytes: int, *, step: int) -> bool:
        return super().lends(peer, nbytes, step=step + self.shift)

    async def recv(self, peer: int, *, step: int, chunk: int = 0, out: Any = None) -> memoryview:
        return await super().recv(peer, step=step + self.shift, chunk=chunk, out=out)

    async def recv_meta(self, peer: int, *, step: int, chunk: int = 0, out: Any = None) -> Any:
        return await super().recv_meta(peer, step=step + self.shift, chunk=chunk, out=out)


def _slots(codec: str, dtype: np.dtype, bounds: list[tuple[int, int]]) -> int:
    """Bytes of one slot: the encoding of the largest shard."""
    return encoded_nbytes(codec, dtype, max(b - a for a, b in bounds))


def _take(nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Scratch memory from the algorithms' pool (already mapped: no page faults): the block
    to :func:`_give` back once the run succeeded, and its first ``nbytes`` bytes to use."""
    block = SCRATCH_POOL.take(nbytes)
    return block, block[:nbytes]


def _give(*blocks: np.ndarray) -> None:
    """Blocks of :func:`_take` back to the pool, after a run that succeeded (after a failure
    they are dropped: a late frame of the failed operation must not land in a reused block)."""
    for block in blocks:
        SCRATCH_POOL.give(block)


def _encode_into(codec: str, parts: Sequence[np.ndarray], slot: int, skip: int, buf: np.ndarray) -> None:
    """``parts`` encoded into ``buf``'s consecutive slots of ``slot`` bytes (their padding
    zeroed: it is sent), but for part ``skip``: this rank's own, never sent nor read (the
    reduction takes the part itself; an all_reduce encodes its result there), so its slot
    is left as it was (not zeroed: a megabyte per piece of fp16)."""
    for k, part in enumerate(parts):
        if k == skip:
            continue
        n = encoded_nbytes(codec, part.dtype, part.size)
        encode(codec, part, buf[k * slot : k * slot + n])
        buf[k * slot + n : (k + 1) * slot] = 0


async def _exchange(
    ch: Channel,
    parts: Sequence[np.ndarray],
    op: ReduceOp,
    out: np.ndarray,
    codec: str,
    exchange: Exchange,
    segment_bytes: int,
) -> np.ndarray:
    """Step 1: ``out`` = the reduction, in rank order, of every rank's ``parts[ch.rank]``
    (each encoded by ``codec`` on the wire; this rank's own taken as it is). Returns the
    scratch block the encoded parts were sent from (``len(parts)`` slots of the largest
    part's encoding), the caller's to reuse or :func:`_give` back."""
    r = ch.rank
    slot = max(encoded_nbytes(codec, out.dtype, p.size) for p in parts)
    (mine, send), (theirs, recv) = _take(len(parts) * slot), _take(len(parts) * slot)
    _encode_into(codec, parts, slot, r, send)
    await exchange(ch, send, recv, segment_bytes=segment_bytes, own=False)  # slot r is neither encoded nor read
    scratch = np.empty(min(FOLD, out.size), out.dtype)  # fold's
    for k in range(ch.size):
        _reduce_one(codec, op, parts, r, recv, slot, out, k, scratch)
        await asyncio.sleep(0)  # let the loop breathe between large decodes
    _give(theirs)
    return mine


def _reduce_one(
    codec: str,
    op: ReduceOp,
    parts: Sequence[np.ndarray],
    r: int,
    recv: np.ndarray,
    slot: int,
    out: np.ndarray,
    k: int,
    theirs: np.ndarray,
) -> None:
    """Contribution ``k`` into ``out`` (rank order: the first one is copied or decoded into it)."""
    raw = recv[k * slot : k * slot + encoded_nbytes(codec, out.dtype, out.size)]
    if k == 0 and r == 0:
        out[...] = parts[r]
    elif k == 0:
        decode(codec, raw, out)
    elif k == r:
        reduce_into(op, out, parts[r])
    else:
        fold(codec, op, out, raw, theirs)


async def reduce_scatter(
    ch: Channel,
    buf: np.ndarray,
    op: ReduceOp,
    out: np.ndarray,
    *,
    codec: str,
    exchange: Exchange,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> None:
    """``out`` = the reduction of block ``ch.rank`` of every rank's ``buf`` (``P`` blocks)."""
    data, dst = flat(buf, writeable=False), flat(out, "out")
    if data.size != ch.size * dst.size:
        raise ValueError(f"reduce_scatter: buf has {data.size} elements, not {ch.size} blocks of {dst.size}")
    parts = [data[k * dst.size : (k + 1) * dst.size] for k in range(ch.size)]
    _give(await _exchange(ch, parts, op, dst, codec, exchange, segment_bytes))


async def all_reduce(
    ch: Channel,
    buf: np.ndarray,
    op: ReduceOp,
    *,
    codec: str,
    exchange: Exchange,
    src: np.ndarray | None = None,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    piece_bytes: int | None = None,
    window: int | None = None,
    depth: int | None = None,
    taper: int | None = None,
    average: bool = False,
) -> None:
    """``buf`` = the reduction of every rank's input (``src``, else ``buf``'s contents),
    decoded from the same bytes on every rank, in pieces (:func:`pieces`, ``taper`` pieces
    ramping at each end) of which up to ``window`` are in their exchange and ``depth`` under
    way at once (None: the codec's :class:`Schedule`). ``average`` with ``op`` avg: the
    result divided by the group's size as it is decoded (:func:`_decode_all`: the bits of
    :func:`~netcoll.ops.finalize` after the decoding, without a pass of its own); else avg
    leaves the sum, the caller's to finalize."""
    data = flat(buf)
    mine = data if src is None else flat(src, "src", writeable=False)
    own = PIECES.get(codec) or Schedule(PIECE_BYTES, WINDOW, DEPTH, TAPER)
    size = (piece_bytes or own.piece_bytes) // data.dtype.itemsize
    cuts = pieces(split(data.size, ch.size), size, own.taper if taper is None else taper)

    divisor = ch.size if average and op is ReduceOp.AVG else 1

    def piece(j: int, exchanged: Callable[[], None]) -> Awaitable[None]:
        shift = j * PIECE_SHIFT
        return _piece(ch, shift, data, mine, cuts[j], op, codec, exchange, segment_bytes, exchanged, divisor)

    await _pieces.run(len(cuts), piece, window or own.window, depth or own.depth)


async def _piece(
    ch: Channel,
    shift: int,
    data: np.ndarray,
    mine: np.ndarray,
    ranges: list[tuple[int, int]],
    op: ReduceOp,
    codec: str,
    exchange: Exchange,
    segment_bytes: int,
    exchanged: Callable[[], None],
    divisor: int = 1,
) -> None:
    """One piece: the exchange and reduction of every rank's ``ranges`` (then
    ``exchanged()``, also on failure), then the all_gather of the encoded reductions,
    decoded into ``data`` and divided by ``divisor`` (its steps shifted by ``shift``)."""
    a, b = ranges[ch.rank]
    block, raw = _take((b - a) * data.dtype.itemsize)
    shard = raw.view(data.dtype)
    first = ch if shift == 0 else Shifted(ch, shift)
    try:
        held = await _exchange(first, [mine[x:y] for x, y in ranges], op, shard, codec, exchange, segment_bytes)
    finally:
        exchanged()
    slot = _slots(codec, data.dtype, ranges)
    gathered = held[: ch.size * slot]  # the exchange's: every slot but this rank's is received whole
    n = encoded_nbytes(codec, data.dtype, shard.size)
    encode(codec, shard, gathered[ch.rank * slot : ch.rank * slot + n])
    gathered[ch.rank * slot + n : (ch.rank + 1) * slot] = 0
    await ring.all_gather(Shifted(ch, shift + PHASE_STEP), gathered, segment_bytes=segment_bytes)
    _decode_all(codec, gathered, slot, data, ranges, divisor)
    _give(block, held)


async def reduce(
    ch: Channel,
    buf: np.ndarray | None,
    op: ReduceOp,
    root: int,
    *,
    codec: str,
    src: np.ndarray,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> None:
    """The root's ``buf`` = the reduction, in rank order, of every rank's ``src``: each
    non-root's encoded whole (a direct gather), the root's own as it is (others pass
    ``buf=None``)."""
    mine = flat(src, "src", writeable=False)
    slot = encoded_nbytes(codec, mine.dtype, mine.size)
    send = encode(codec, mine)
    whole = np.empty(ch.size * slot, np.uint8) if ch.rank == root else None
    await direct.gather(ch, send, whole, root, segment_bytes=segment_bytes)
    if whole is None:
        return
    if buf is None:
        raise ValueError("reduce: the root must pass a buffer")
    out, theirs = flat(buf), np.empty(min(FOLD, mine.size), mine.dtype)  # fold's scratch
    for k in range(ch.size):
        raw = whole[k * slot : (k + 1) * slot]
        if k == root == 0:
            out[...] = mine
        elif k == root:
            reduce_into(op, out, mine)
        elif k == 0:
            decode(codec, raw, out)
        else:
            fold(codec, op, out, raw, theirs)
        await asyncio.sleep(0)


def _decode_all(
    codec: str, slots: np.ndarray, slot: int, data: np.ndarray, bounds: list[tuple[int, int]], divisor: int = 1
) -> None:
    """Each shard ``k`` of ``data`` (``bounds[k]``, one piece's: at most :data:`PIECE_BYTES`)
    decoded from slot ``k`` of ``slots``, then divided by ``divisor`` (1: not) while still
    in cache. Elementwise, so the bits of a decode of the whole then
    :func:`~netcoll.ops.finalize` (avg) of the whole (:func:`divider`). (Decoding in smaller
    blocks cost more than it saved: a torch cast costs microseconds a call.)"""
    divide = divider(data.dtype, divisor)
    with np.errstate(all="ignore"):
        for k, (a, b) in enumerate(bounds):
            decode(codec, slots[k * slot : k * slot + encoded_nbytes(codec, data.dtype, b - a)], data[a:b])
            divide(data[a:b])


def divider(dtype: np.dtype, divisor: int) -> Callable[[np.ndarray], None]:
    """``x /= divisor`` in place for arrays of ``dtype`` with the bits of
    :func:`~netcoll.ops.finalize`'s avg (float16 and bfloat16 computed in float32 and
    rounded back) but without its checks, for a caller that calls it per block (numpy's
    error state is the caller's); a power of two multiplies by its inverse instead (the
    same exact quotient, correctly rounded alike: the same bits, half a division's CPU);
    1 leaves ``x`` as it is (as finalize: a signalling NaN is not quietened)."""
    if divisor == 1:
        return lambda x: None
    half = dtype in (np.dtype(np.float16), BFLOAT16)
    work = np.float64 if dtype == np.float64 else np.float32
    exact = divisor & (divisor - 1) == 0
    by, ufunc = (work(1 / divisor), np.multiply) if exact else (work(divisor), np.divide)
    if half:
        return lambda x: ufunc(x, by, out=x, dtype=np.float32, casting="unsafe")
    return lambda x: ufunc(x, by, out=x)
