"""Ring algorithms: all_reduce, reduce_scatter, reduce, all_gather, and the chain broadcast.

The ring all_reduce works as follows (Gloo's ``allreduce.cc``). The ranks form
a ring, rank ``r`` sending to ``r+1`` and receiving from ``r-1``. The buffer of
``N`` bytes is cut into ``P`` nearly equal *chunks* (element boundaries; sizes
need not divide), and every chunk into ``S`` *segments* of at most
``segment_bytes``. There are ``2(P-1)`` steps; at step ``t`` rank ``r`` sends
chunk ``r-t`` and receives chunk ``r-t-1`` (mod P):

* steps ``0..P-2`` are the reduce-scatter: the incoming segment is received
  into a scratch buffer and folded into ``buf`` (``buf = buf op incoming``),
  or, by a link that reads payloads in pieces (shared memory; TCP from 2 MiB),
  folded piece by piece as it arrives (:class:`~netcoll.ops.Fold`, same bits); after them
  rank ``r`` holds the fully reduced chunk ``r+1``;
* steps ``P-1..2P-3`` are the all-gather: the incoming segment is received
  straight into ``buf`` (the reduced chunk it replaces is final elsewhere).

It is pipelined per segment: a segment is sent on to the next step the moment
it has been reduced (or received), so the sends of step ``t+1`` overlap the
receives of step ``t``. Receives are *posted* (their destination handed to the
mailbox, so the payload lands in place) ahead of use: the reduce-scatter half
receives into ``D`` scratch segment buffers used round-robin, and ``D-1``
receives stay posted while one segment is reduced. A left neighbour runs about
one step (``S`` segments) ahead of us, so ``D = S+2``, at least 3 and within
``SCRATCH_BUDGET_BYTES`` (32 MiB) — Gloo's "two segments in flight" at the
minimum, a per-chunk scratch when it fits.

The message ``(step, chunk)`` of every segment is ``(t, j)``, unique per link.
All ranks must pass the same ``segment_bytes``.

Cost, for ``P`` ranks and ``N`` bytes (``S`` segments per chunk):

* ``all_reduce``: ``2(P-1)`` steps (``2(P-1)S`` messages per rank); bytes sent
  per rank ``2(P-1)/P * N``.
* ``reduce_scatter``: ``P-1`` steps (``(P-1)S`` messages); ``(P-1)/P * N``
  bytes sent per rank, ``N`` the input (all P blocks).
* ``all_gather``: ``P-1`` steps (``(P-1)S`` messages); ``(P-1)/P * N`` bytes
  sent per rank, ``N`` the output (all P blocks).
* ``broadcast`` (chain): ``P-1`` hops, ``P+S-2`` segment times pipelined;
  ``N`` bytes sent by every rank but the last in the chain.

Every rank also reduces ``(P-1)/P * N`` bytes (all_reduce, reduce_scatter).

Bits: each chunk of the all_reduce is reduced along the ring on one path and
then copied to everyone, so **all ranks end with bit-identical results**
(whatever the op, NaN payloads and signed zeros included). The reduction order
of chunk ``c`` is ``x[c+P-1] op (... op (x[c+1] op x[c]))`` (ranks mod P),
fixed for a given P, so repeated runs are bit-identical too. reduce_scatter's
block ``r`` is reduced in the fixed order ``((x[r+1] op x[r+2]) op ...) op x[r]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..ops import Fold, ReduceOp, check_op_dtype, parse_op, reduce_into, reduce_to
from ._args import check_root, check_segment_bytes, flat, gather_args, own_input, reduce_scatter_args, reduction_args
from ._common import RELAY_WINDOW, RecvWindow
from ._relay import relay
from ._scratch import DEFAULT_SEGMENT_BYTES, num_segments, scratch, slice_segments, split

if TYPE_CHECKING:
    from ..mesh.channel import Channel

__all__ = ["all_gather", "all_reduce", "broadcast", "chain_links", "reduce", "reduce_scatter"]


def _segments(bounds: list[tuple[int, int]], itemsize: int, segment_bytes: int) -> list[list[tuple[int, int]]]:
    """Cut each ``[start, stop)`` piece into the same number ``S`` of nearly
    equal segments, ``S`` set by the largest piece (element bounds)."""
    longest = max(b - a for a, b in bounds)
    nseg = num_segments(longest * itemsize, segment_bytes)
    return [[(a + s, a + e) for s, e in split(b - a, nseg)] for a, b in bounds]


async def all_reduce(
    ch: Channel,
    buf: np.ndarray,
    op: ReduceOp | str,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    src: np.ndarray | None = None,
) -> None:
    """Ring all_reduce of ``buf`` in place (``op`` folded with :func:`reduce_into`;
    ``avg`` is left as a sum for the caller to :func:`~netcoll.ops.finalize`).

    Args:
        ch: the operation's channel.
        buf: C-contiguous, writeable array, same shape and dtype on every rank.
        op: the reduction.
        segment_bytes: largest message payload (same on every rank).
        src: if given, this rank's input (same size and dtype, not overlapping
            ``buf``), read instead of ``buf``'s initial contents, which then
            need not be filled: saves the caller a full copy. Same bits.
    """
    op, data = reduction_args(buf, op, segment_bytes)
    P, r = ch.size, ch.rank
    src = own_input(src, data, "all_reduce")
    if P == 1:
        if src is not None:
            data[...] = src
        return
    segs = _segments(split(data.size, P), data.itemsize, segment_bytes)
    # Every send may be lent: a chunk sent at step t is not written again until a later step
    # receives it, and a lent send returns only once the peer has read it (measured faster
    # than the ring's copies here, docs/performance.md; the ring reduce and reduce_scatter
    # measured no better, and keep the ring)
    ch.lend_from(0)
    await _ring(ch, data, op, segs, first=r, reduce_steps=P - 1, total_steps=2 * (P - 1), src=src)


async def reduce(
    ch: Channel,
    buf: np.ndarray | None,
    op: ReduceOp | str,
    root: int,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    src: np.ndarray | None = None,
) -> None:
    """Ring reduce: a ring reduce-scatter of ``P`` nearly equal chunks (rank
    ``r`` ends with chunk ``r`` reduced), then every rank sends its chunk
    straight to ``root``. Bytes per rank: ``(P-1)/P N`` sent and reduced, plus
    ``N/P`` to the root, against the binomial tree's ``N`` per level at the
    root; non-roots need no ``N``-sized buffer.

    Args:
        buf: the root's result (C-contiguous, writeable; ``avg`` left as a
            sum). Elsewhere: the input, or ``None`` when ``src`` is given.
        src: this rank's input, read only (at the root: not overlapping
            ``buf``); default ``buf``, which the root then cannot use in place,
            so it copies it first.
    Bits: chunk ``c`` is reduced in the order ``((x[c+1] op x[c+2]) op ...) op
    x[c]`` (ranks mod P), as reduce_scatter's blocks.
    """
    op = parse_op(op)
    check_segment_bytes(segment_bytes)
    check_root(ch, root)
    P, r = ch.size, ch.rank
    if src is None:
        if buf is None:
            raise ValueError("reduce: pass buf, src or both")
        src = flat(buf, writeable=False)
        if r == root:
            src = src.copy()  # the result is written over it while it is still being read
    else:
        src = flat(src, "src", writeable=False)
    check_op_dtype(op, src.dtype)
    data = None
    if r == root:
        data = flat(buf, "buf") if buf is not None else None
        if (
            data is None
            or data.dtype != src.dtype
            or data.size != src.size
            or (data.size and np.may_share_memory(data, src))
        ):
            raise ValueError("reduce: the root's buf must match src in size and dtype and not overlap it")
    if P == 1:
        if data is not None:
            data[...] = src
        return
    chunks = _segments(split(src.size, P), src.itemsize, segment_bytes)
    S = len(chunks[0])
    senders = [k for k in range(P) if k != root]

    def plan(i: int) -> tuple[int, int, int, np.ndarray]:
        k, j = senders[i // S], i % S
        a, b = chunks[k][j]
        return k, P - 1, j, data[a:b]  # type: ignore[index]

    # The root posts the other chunks up front: they land in place.
    count = len(senders) * S if r == root else 0
    async with RecvWindow(ch, plan, count, count) as finals:
        await finals.start()
        lo, hi = chunks[r][0][0], chunks[r][-1][1]
        if data is not None:
            await _reduce_scatter_chunks(ch, src, data[lo:hi], op, chunks)
        else:
            with scratch(1, hi - lo, src.dtype) as (mine,):
                await _reduce_scatter_chunks(ch, src, mine, op, chunks)
                for j, (a, b) in enumerate(chunks[r]):
                    await ch.send(root, mine[a - lo : b - lo], step=P - 1, chunk=j)
        for i in range(count):
            await finals.get(i)


async def all_gather(ch: Channel, buf: np.ndarray, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
    """Ring all_gather in place.

    Args:
        buf: flat (any C-contiguous array; handled as bytes) of ``P`` equal
            blocks, block ``ch.rank`` already filled; the others are filled.
    """
    data, block = gather_args(ch, buf, segment_bytes, "all_gather")
    P, r = ch.size, ch.rank
    if P == 1:
        return
    segs = _segments([(c * block, (c + 1) * block) for c in range(P)], 1, segment_bytes)
    # Step t sends block r-t (own block first) and receives block r-t-1.
    await _ring(ch, data, None, segs, first=r, reduce_steps=0, total_steps=P - 1)


async def reduce_scatter(
    ch: Channel, buf: np.ndarray, op: ReduceOp | str, out: np.ndarray, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> None:
    """Ring reduce_scatter: ``out = op over ranks of block ch.rank of buf``.

    Args:
        buf: flat (any C-contiguous array) of ``P`` equal blocks; block ``k``
            is this rank's contribution to rank ``k``. Not modified.
        out: C-contiguous writeable array with one block's elements, same
            dtype, not overlapping ``buf``; receives the reduced block
            (``avg`` left as a sum).
    """
    op, data, dst = reduce_scatter_args(ch, buf, op, out, segment_bytes)
    P = ch.size
    B = dst.size
    if P == 1:
        dst[...] = data
        return
    chunks = _segments([(c * B, (c + 1) * B) for c in range(P)], data.itemsize, segment_bytes)
    await _reduce_scatter_chunks(ch, data, dst, op, chunks)


async def _reduce_scatter_chunks(
    ch: Channel, data: np.ndarray, dst: np.ndarray, op: ReduceOp, chunks: list[list[tuple[int, int]]]
) -> None:
    longest = max(b - a for chunk in chunks for a, b in chunk)
    per = slice_segments(len(chunks[0]), longest * data.itemsize)
    with scratch(per + 2, longest, data.dtype) as bufs:
        origin = chunks[ch.rank][0][0]  # dst[0] is data element ``origin`` (block rank's first)
        for j0 in range(0, len(chunks[0]), per):
            part = [chunk[j0 : j0 + per] for chunk in chunks]
            await _reduce_scatter_steps(ch, data, dst, op, part, bufs, origin, j0)


async def _reduce_scatter_steps(
    ch: Channel,
    data: np.ndarray,
    dst: np.ndarray,
    op: ReduceOp,
    chunks: list[list[tuple[int, int]]],
    scratch: list[np.ndarray],
    base: int,
    first_segment: int,
) -> None:
    """One slice of the reduce-scatter: ``chunks[c]`` are the ``S`` segments (element
    bounds in ``data``) of block ``c`` in it, whose messages are chunks
    ``first_segment..`` (see :func:`_ring_steps`); blocks may differ in size.
    ``dst``: block ``ch.rank``'s size; its element 0 is data element ``base``."""
    P, r, S, depth = ch.size, ch.rank, len(chunks[0]), len(scratch)
    right, left = (r + 1) % P, (r - 1) % P
    # Step t (0..P-2) sends block r-1-t and receives block r-2-t; the last
    # step brings block r, which is received straight into ``dst``. The
    # partial sums live in scratch (``incoming op own``), so data is read-only.

    def plan(i: int) -> tuple[int, int, int, np.ndarray]:
        t, j = divmod(i, S)
        a, b = chunks[(r - 2 - t) % P][j]
        dest = dst[a - base : b - base] if t == P - 2 else scratch[i % depth][: b - a]
        return left, t, first_segment + j, dest

    def fold(i: int) -> Fold:  # what the link may do as the payload arrives: acc = incoming op own
        t, j = divmod(i, S)
        a, b = chunks[(r - 2 - t) % P][j]
        return Fold(op, plan(i)[3], data[a:b], incoming_first=True)

    async with RecvWindow(ch, plan, (P - 1) * S, depth, fold) as window:
        await window.start()
        for i in range((P - 1) * S):
            t, j = divmod(i, S)
            if t == 0:
                a, b = chunks[(r - 1) % P][j]
                await ch.send(right, data[a:b], step=0, chunk=first_segment + j)
            await window.get(i)
            a, b = chunks[(r - 2 - t) % P][j]
            acc = plan(i)[3]
            if not window.folded(i):
                reduce_into(op, acc, data[a:b])
            if t < P - 2:
                await ch.send(right, acc, step=t + 1, chunk=first_segment + j)


async def _ring(
    ch: Channel,
    data: np.ndarray,
    op: ReduceOp | None,
    segs: list[list[tuple[int, int]]],
    *,
    first: int,
    reduce_steps: int,
    total_steps: int,
    src: np.ndarray | None = None,
) -> None:
    """The pipelined ring core: at step ``t`` send chunk ``first-t`` and
    receive chunk ``first-t-1``; steps below ``reduce_steps`` reduce the
    incoming segment into ``data`` (via scratch), later ones receive in place."""
    S = len(segs[0])
    longest = max(b - a for chunk in segs for a, b in chunk)
    if not reduce_steps:  # all destinations are distinct places in ``data``: no scratch to bound
        await _ring_steps(ch, data, op, segs, [], first, 0, total_steps, max(S + 2, RELAY_WINDOW), data, 0)
        return
    per = slice_segments(S, longest * data.itemsize)
    with scratch(per + 2, longest, data.dtype) as bufs:
        for j0 in range(0, S, per):
            part = [chunk[j0 : j0 + per] for chunk in segs]
            own = data if src is None else src
            await _ring_steps(ch, data, op, part, bufs, first, reduce_steps, total_steps, per + 2, own, j0)


async def _ring_steps(
    ch: Channel,
    data: np.ndarray,
    op: ReduceOp | None,
    segs: list[list[tuple[int, int]]],
    scratch: list[np.ndarray],
    first: int,
    reduce_steps: int,
    total_steps: int,
    depth: int,
    src: np.ndarray,
    first_segment: int,
) -> None:
    """One slice of the ring: ``segs[c]`` are the segments of chunk ``c`` in it, whose
    messages are chunks ``first_segment..`` (of all the chunk's segments). A slice
    keeps at least a step's receives (``S+2``) posted, so every send's receive is
    posted by a neighbour that has received no more than it has already been sent:
    no send waits on this rank's own progress, whatever the receive window (with a
    whole chunk at once and less scratch than a step, it did: issue 38).
    ``src``: where this rank's own contribution is read (``data`` itself, or
    the caller's input: each chunk is reduced at most once per rank, so it is
    read before ``data`` holds anything there)."""
    P, r, S = ch.size, ch.rank, len(segs[0])
    right, left = (r + 1) % P, (r - 1) % P
    count = total_steps * S
    R = min(reduce_steps, total_steps) * S  # messages 0..R-1 are reduced, the rest land in place

    def plan_reduce(i: int) -> tuple[int, int, int, np.ndarray]:
        t, j = divmod(i, S)
        a, b = segs[(first - t - 1) % P][j]
        return left, t, first_segment + j, scratch[i % depth][: b - a]

    def fold(i: int) -> Fold:  # what the link may do as the payload arrives: data = src op incoming
        assert op is not None
        t, j = divmod(i, S)
        a, b = segs[(first - t - 1) % P][j]
        return Fold(op, data[a:b], src[a:b])

    def plan_gather(k: int) -> tuple[int, int, int, np.ndarray]:
        t, j = divmod(R + k, S)
        a, b = segs[(first - t - 1) % P][j]
        return left, t, first_segment + j, data[a:b]

    # Scratch bounds how far ahead reduced messages are posted; messages that
    # land in place are all posted at once, so a left neighbour running ahead
    # never has its segments buffered (and copied) here. Posting before the
    # first send is safe even for slots that still hold data to send: their
    # payload cannot exist before ours left.
    async with (
        RecvWindow(ch, plan_reduce, R, depth, fold if R else None) as reduced,
        RecvWindow(ch, plan_gather, count - R, count - R) as in_place,
    ):
        await reduced.start()
        await in_place.start()
        for i in range(count):
            t, j = divmod(i, S)
            if t == 0:  # the first step sends straight from the caller's buffer
                a, b = segs[first % P][j]
                await ch.send(right, src[a:b], step=0, chunk=first_segment + j)
            await (reduced.get(i) if i < R else in_place.get(i - R))
            a, b = segs[(first - t - 1) % P][j]
            if t < reduce_steps and not reduced.folded(i):
                assert op is not None
                reduce_to(op, data[a:b], src[a:b], scratch[i % depth][: b - a])
            if t + 1 < total_steps:
                await ch.send(right, data[a:b], step=t + 1, chunk=first_segment + j)


async def broadcast(
    ch: Channel,
    buf: np.ndarray | None,
    root: int,
    meta: dict[str, Any] | None = None,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Pipelined chain broadcast ``root -> root+1 -> ... -> root+P-1``.

    Same contract as :func:`netcoll.algorithms.tree.broadcast`: the root's
    ``meta`` (plus ``"nbytes"``) travels in segment 0; a non-root passing
    ``None`` gets a new ``uint8`` buffer, one passing a buffer must match the
    root's byte size (:class:`~netcoll.errors.MismatchError`).

    Returns:
        ``(buf, meta)`` on every rank.
    """
    check_root(ch, root)
    src, dsts = chain_links(ch, root)
    return await relay(ch, src, dsts, buf, meta, step=0, segment_bytes=segment_bytes)


def chain_links(ch: Channel, root: int) -> tuple[int | None, list[int]]:
    """Parent and children of this rank in the chain from ``root`` (group ranks)."""
    P, r = ch.size, ch.rank
    v = (r - root) % P
    return (None if v == 0 else (r - 1) % P), ([(r + 1) % P] if v < P - 1 else [])
