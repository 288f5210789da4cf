"""Binomial-tree algorithms: broadcast, reduce, and all_reduce = reduce + broadcast.

The tree works as follows. Ranks are renumbered relative to the root,
``v = (rank - root) mod P``. The parent of ``v > 0`` is ``v`` with its lowest
set bit cleared; its children are ``v + 2^k`` for every ``2^k`` below that bit
(for the root: below P). So the root has ``ceil(log2 P)`` children, the tree is
``ceil(log2 P)`` levels deep, and half the ranks are leaves.

* **broadcast** sends the buffer down the tree, cut into ``S`` segments of at
  most ``segment_bytes``: a rank forwards segment ``j`` to its children
  (largest subtree first) as soon as it has arrived, while the next segments'
  receives are already posted into the destination buffer. The root's ``meta``
  (plus ``"nbytes"``) rides in the header of segment 0, so a rank can join
  with ``buf=None`` and have the buffer allocated for it.
* **reduce** sends partial results up the tree, segment by segment: a rank
  receives segment ``j`` from each child into rotating scratch buffers (as
  many as fit ``SCRATCH_BUDGET_BYTES``, so children's streams land in place), folds
  them into its own ``buf`` in a FIXED order (own value first, then children
  from the smallest subtree to the largest), and forwards the segment to its
  parent. ``buf`` is used as the accumulator on every rank (clobbered off the
  root). Given ``src`` (the caller's input, read only), a rank reads its own
  value there: a leaf sends it as it is, and the first child's segment is
  folded as ``buf = src op child``, so no rank copies its input first; a link
  that reads payloads in pieces (shared memory; TCP from 2 MiB) does that first fold as the
  segment arrives (:class:`~netcoll.ops.Fold`), without a copy into scratch.
  A non-root's sends up are synchronous (``Channel.sync_from``): over TCP one of
  512 KiB or more waits for its receive, so a leaf does not run calls ahead of
  its parent (measured 1.1-1.4x at 1-2 MiB, 4 ranks).
* **all_reduce** is a reduce to rank 0 followed by a broadcast from it.

Cost, for ``P`` ranks and ``N`` bytes, ``L = ceil(log2 P)``, ``S`` segments:

* ``broadcast``: ``L`` levels, ``L+S-1`` segment times when pipelined. Bytes
  sent: root ``L*N``, an inner rank ``children*N``, a leaf ``0``.
* ``reduce``: ``L`` levels, ``L+S-1`` segment times. Bytes sent: ``N`` by
  every non-root; a rank reduces ``children*N`` bytes.
* ``all_reduce``: ``2L`` levels. Bytes sent: ``N`` up (non-roots) plus
  ``children*N`` down.

Bits: the reduction order is a pure function of ``(P, root)``, so reduce is
deterministic run to run; all_reduce's result is computed once, on rank 0, and
copied to everyone, so **all ranks end with bit-identical results**.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..ops import Fold, ReduceOp, check_op_dtype, parse_op, reduce_into, reduce_to
from ._args import check_root, check_segment_bytes, flat, own_input
from ._common import RecvWindow
from ._relay import relay
from ._scratch import DEFAULT_SEGMENT_BYTES, num_segments, scratch, scratch_depth, split

if TYPE_CHECKING:
    from ..mesh.channel import Channel

__all__ = ["all_reduce", "binomial_tree", "broadcast", "links", "reduce"]


def binomial_tree(size: int, v: int) -> tuple[int | None, list[int]]:
    """Parent and children (largest subtree first) of relative rank ``v``."""
    parent = None
    mask = 1
    while mask < size:
        if v & mask:
            parent = v - mask
            break
        mask <<= 1
    children = []
    mask >>= 1
    while mask:
        if v + mask < size:
            children.append(v + mask)
        mask >>= 1
    return parent, children


def links(ch: Channel, root: int) -> tuple[int | None, list[int]]:
    """Parent and children of this rank as group ranks."""
    P = ch.size
    parent, children = binomial_tree(P, (ch.rank - root) % P)
    return (None if parent is None else (parent + root) % P), [(c + root) % P for c in children]


async def broadcast(
    ch: Channel,
    buf: np.ndarray | None,
    root: int,
    meta: dict[str, Any] | None = None,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Pipelined binomial-tree broadcast of the root's ``buf``.

    Args:
        buf: root: the C-contiguous array to send. Others: ``None`` (a new
            flat ``uint8`` buffer of the root's size is allocated) or a
            writeable C-contiguous array of exactly the root's byte size
            (else :class:`~netcoll.errors.MismatchError`), filled in place.
        root: the sending rank.
        meta: root only: a small msgpack-able dict (e.g. dtype and shape)
            delivered to every rank; ``"nbytes"`` is added (or checked).

    Returns:
        ``(buf, meta)``: the filled buffer and the root's meta, on every rank.
    """
    check_root(ch, root)
    parent, children = links(ch, root)
    return await relay(ch, parent, children, buf, meta, step=0, segment_bytes=segment_bytes)


async def reduce(
    ch: Channel,
    buf: np.ndarray | None,
    op: ReduceOp | str,
    root: int,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    src: np.ndarray | None = None,
) -> None:
    """Binomial-tree reduce in place: the root's ``buf`` ends as the reduction
    (``avg`` left as a sum); other ranks' ``buf`` are used as scratch (a
    leaf's only when ``src`` is None). ``src``: as for :func:`all_reduce`.
    Off the root ``buf`` may be None when ``src`` is given: an inner rank then
    makes its own accumulator, and a leaf needs none."""
    op = parse_op(op)
    check_root(ch, root)
    if ch.rank != root:
        ch.sync_from(0)  # a send up waits for its receive (docs/performance.md)
    if buf is None:
        if src is None or ch.rank == root:
            raise ValueError("reduce: the root passes buf; the others buf, src or both")
        mine = flat(src, "src", writeable=False)
        if not links(ch, root)[1]:  # a leaf only sends its input up
            await _reduce(ch, mine, op, root, step=0, segment_bytes=segment_bytes)
            return
        buf = np.empty_like(mine)
    data = flat(buf)
    await _reduce(ch, data, op, root, step=0, segment_bytes=segment_bytes, src=own_input(src, data, "reduce"))
    if ch.size == 1 and src is not None:
        data[...] = src


async def all_reduce(
    ch: Channel,
    buf: np.ndarray,
    op: ReduceOp | str,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    src: np.ndarray | None = None,
) -> None:
    """Tree all_reduce in place: reduce to rank 0, then broadcast from it.

    ``src``: if given, this rank's input (same size and dtype, not overlapping
    ``buf``), read instead of ``buf``'s initial contents, which then need not
    be filled: a leaf sends it as it is, and an inner rank's first fold
    writes ``buf = src op child`` (saves the caller a full copy; same bits)."""
    op = parse_op(op)
    data = flat(buf)
    check_op_dtype(op, data.dtype)
    check_segment_bytes(segment_bytes)
    src = own_input(src, data, "all_reduce")
    if ch.size == 1:
        if src is not None:
            data[...] = src
        return
    await _reduce(ch, data, op, 0, step=0, segment_bytes=segment_bytes, src=src)
    parent, children = links(ch, 0)
    await relay(ch, parent, children, data, None, step=1, segment_bytes=segment_bytes, what="all_reduce")


async def _reduce(
    ch: Channel,
    data: np.ndarray,
    op: ReduceOp,
    root: int,
    *,
    step: int,
    segment_bytes: int,
    src: np.ndarray | None = None,
) -> None:
    """The reduce up the tree into ``data``; this rank's own contribution is
    ``src`` if given (else ``data``'s contents)."""
    check_segment_bytes(segment_bytes)
    check_op_dtype(op, data.dtype)
    if ch.size == 1:
        return
    own = data if src is None else src
    parent, children = links(ch, root)
    kids = children[::-1]  # fold order: smallest subtree (earliest to arrive) first
    segs = split(data.size, num_segments(data.nbytes, segment_bytes))
    S, K = len(segs), len(kids)
    if K == 0:  # a leaf: just stream its contribution up
        assert parent is not None
        for j, (a, b) in enumerate(segs):
            await ch.send(parent, own[a:b], step=step, chunk=j)
        return
    longest = max(b - a for a, b in segs)
    # Children stream their segments without waiting for us: post them all
    # if the scratch budget allows (the fold order below stays fixed).
    depth = scratch_depth(S * K, longest * data.itemsize)
    with scratch(depth, longest, data.dtype) as bufs:

        def plan(i: int) -> tuple[int, int, int, np.ndarray]:
            j, k = divmod(i, K)
            a, b = segs[j]
            return kids[k], step, j, bufs[i % depth][: b - a]

        def fold(i: int) -> Fold | None:  # the first child's segment, as it arrives: data = own op incoming
            j, k = divmod(i, K)
            a, b = segs[j]
            return Fold(op, data[a:b], own[a:b]) if k == 0 else None

        async with RecvWindow(ch, plan, S * K, depth, fold) as window:
            await window.start()
            for i in range(S * K):
                j, k = divmod(i, K)
                a, b = segs[j]
                await window.get(i)
                if not window.folded(i):  # the link only received it: reduce it here
                    incoming = bufs[i % depth][: b - a]
                    if k == 0 and src is not None:
                        reduce_to(op, data[a:b], src[a:b], incoming)
                    else:
                        reduce_into(op, data[a:b], incoming)
                if k == K - 1 and parent is not None:
                    await ch.send(parent, data[a:b], step=step, chunk=j)
