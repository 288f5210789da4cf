"""Pairwise-exchange all_to_all, and its uneven ("v") variants.

It works as follows. Both buffers are ``P`` equal blocks; block ``k`` of
``send`` goes to rank ``k`` and block ``j`` of ``recv`` comes from rank ``j``.
The own block is copied locally. Then in step ``k = 1..P-1`` rank ``r`` sends
its block for ``r+k`` to rank ``r+k`` and receives rank ``r-k``'s block for it
(mod P), so every rank sends to and receives from exactly one peer per step and
no link carries two transfers at once. Blocks are cut into segments of at most
``segment_bytes``; the receives of the current and the next step are posted
straight into ``recv`` before the step's sends go out.

A rank whose every link would *lend* its segments (shared memory where ranks
outnumber cores: the send returns only once the peer has read it in place,
``links/cma.py``) sends them all at once instead, every receive posted first
(:func:`.linear.at_once`: the same messages, so this is each rank's own
decision). One lent transfer per step leaves each rank waiting on one peer's
read at a time; 4 ranks on 2 cores, shared memory, µs per call, median of 10,
best of 3 rounds (``python -m netcoll.bench.versus all_to_all``): one peer
per step 3088 / 6125 / 23887 at 4 / 16 / 64 MiB, all at once 2587 / 5022 /
19733; 8 ranks (blocks of 2 and 8 MiB lent, of 512 KiB not) 20822 / 60265
against 22723 / 49973 at 16 / 64 MiB.

Cost, ``P`` ranks, ``N`` bytes per buffer (``B = N/P`` a block):
``P-1`` steps; ``(P-1) B`` bytes sent and received per rank; one local copy
of ``B`` bytes.

Bits: pure data movement; ``recv`` holds exactly the bytes the peers sent.

**Uneven variants** (blocks of any size, MPI's ``alltoallv`` family), same
step pattern (``all_to_all_list`` on a rank sending less than
:data:`LIST_AT_ONCE_MAX_BYTES` in all posts every receive and sends every
message at once instead, as :mod:`.linear` does: the same messages, so ranks
deciding differently still match):

* ``all_to_all_list``: block ``k`` of a list goes to rank ``k``, each as one
  segmented message (:func:`~netcoll.algorithms.direct.send_message`) whose
  first segment carries its byte size and the sender's meta (dtype, shape),
  so receivers need to know nothing in advance and allocate on arrival. The
  receives of step ``k`` and ``k+1`` are posted before step ``k``'s send.
  Cost: ``P-1`` steps; rank ``r`` sends ``sum of its blocks but its own``
  and receives the ``r``-th block of every peer; the first segment of every
  received block is copied once (its size is unknown until it arrives).
* ``all_gather_list``: ``all_to_all_list`` with this rank's one block sent
  to every peer; ``(P-1) B_r`` bytes sent by rank ``r``, ``sum of B_k,
  k != r`` received.
* ``reduce_scatter_list``: the blocks' sizes are known to every rank (block
  ``k`` has the same shape everywhere), so no meta is needed. In step
  ``k = 1..P-1`` rank ``r`` sends its contribution to rank ``r-k`` and
  receives rank ``r+k``'s contribution to its own block, segment by
  segment, and folds it in as it arrives: the first straight into ``out``,
  the rest into rotating scratch segments that are reduced into ``out``.
  Cost: ``P-1`` steps; rank ``r`` sends ``N - B_r`` bytes (``N`` its whole
  input) and receives and reduces ``(P-1) B_r`` — the same bytes as the ring
  reduce_scatter, in ``P-1`` steps, but the sends are not evenly balanced
  when the blocks differ in size. Bits: rank ``r``'s block is reduced in the
  fixed order ``((x[r+1] op x[r+2]) op ... op x[r-1]) op x[r]`` (ranks mod P,
  ``x[k]`` rank ``k``'s contribution) — the ring reduce_scatter's order — so
  the result is deterministic run to run, and a list of the rows of an
  array gives the ring's bits for that array.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from ..arrays import contiguous_copy
from ..ops import ReduceOp, check_op_dtype, parse_op, reduce_into
from ._args import all_to_all_args, as_u8, check_segment_bytes, flat
from ._common import RecvWindow, drain
from ._scratch import DEFAULT_SEGMENT_BYTES, num_segments, scratch_depth, split
from .direct import recv_message, send_message
from .linear import at_once

if TYPE_CHECKING:
    from ..mesh.channel import Channel

__all__ = ["all_gather_list", "all_to_all", "all_to_all_list", "reduce_scatter_list"]

Message = tuple[np.ndarray, dict[str, Any]]

#: :func:`all_to_all_list` on a rank sending less than this in all posts every receive and
#: sends every message at once (as :mod:`.linear`, below ``ALL_TO_ALL_LINEAR_MAX_BYTES`` of
#: the same size), else one peer per step
LIST_AT_ONCE_MAX_BYTES: Final = 4 << 20


async def all_to_all(
    ch: Channel, send: np.ndarray, recv: np.ndarray, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES, own: bool = True
) -> None:
    """Pairwise all_to_all: ``recv`` block ``j`` = rank ``j``'s ``send`` block ``ch.rank``.

    Args:
        send: C-contiguous array of ``P`` equal blocks (handled as bytes).
        recv: writeable C-contiguous array of the same byte size, not
            overlapping ``send``.
        own: False leaves ``recv`` block ``ch.rank`` as it was (a caller that never
            reads it there: the compressed exchange, whose own block is not encoded).
    """
    src_buf, dst_buf, block, segs = all_to_all_args(ch, send, recv, segment_bytes, own)
    P, r, S = ch.size, ch.rank, len(segs)
    if P == 1:
        return
    if all(ch.lends((r + k) % P, segs[0][1] - segs[0][0], step=k) for k in range(1, P)):
        await at_once(ch, src_buf, dst_buf, block, segs)  # the same messages, all at once
        return

    def plan(i: int) -> tuple[int, int, int, np.ndarray]:
        k, j = divmod(i, S)
        peer = (r - k - 1) % P
        a, b = segs[j]
        return peer, k + 1, j, dst_buf[peer * block + a : peer * block + b]

    async with RecvWindow(ch, plan, (P - 1) * S, 2 * S) as window:
        await window.start()
        for k in range(1, P):
            peer = (r + k) % P
            for j, (a, b) in enumerate(segs):
                await ch.send(peer, src_buf[peer * block + a : peer * block + b], step=k, chunk=j)
            for j in range(S):
                await window.get((k - 1) * S + j)


async def all_to_all_list(
    ch: Channel,
    blocks: Sequence[np.ndarray],
    *,
    metas: Sequence[dict[str, Any] | None] | None = None,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> list[Message]:
    """Pairwise all_to_all of blocks of any byte size (``alltoallv``).

    Args:
        blocks: ``P`` C-contiguous arrays (handled as bytes); ``blocks[k]``
            goes to rank ``k``. Sizes may differ per block and per rank.
        metas: ``P`` small msgpack-able dicts (or ``None``); ``metas[k]``
            travels with ``blocks[k]`` (``"nbytes"`` is added).

    Returns:
        ``[(buffer, meta)]`` indexed by rank: ``buffer`` a new flat ``uint8``
        array with rank ``j``'s ``blocks[ch.rank]``, ``meta`` the meta rank
        ``j`` sent with it (this rank's own entry is a copy).
    """
    check_segment_bytes(segment_bytes)
    P, r = ch.size, ch.rank
    if len(blocks) != P:
        raise ValueError(f"all_to_all_list: {len(blocks)} blocks for {P} ranks")
    if metas is None:
        metas = [None] * P
    if len(metas) != P:
        raise ValueError(f"all_to_all_list: {len(metas)} metas for {P} blocks")
    datas = [as_u8(b, f"blocks[{k}]", writeable=False) for k, b in enumerate(blocks)]
    out: list[Message | None] = [None] * P
    out[r] = (contiguous_copy(datas[r]), dict(metas[r] or {}, nbytes=datas[r].nbytes))
    if P == 1:
        return out  # type: ignore[return-value]

    def post(k: int) -> asyncio.Task[Message]:
        return asyncio.ensure_future(recv_message(ch, (r - k) % P, step=k, segment_bytes=segment_bytes))

    # Step k (1..P-1): send to r+k, receive from r-k; step k+1's receive is
    # posted before step k's send so a fast peer's segments land in place. What
    # this rank sends in all is small: every receive posted and every message
    # sent at once, as the linear all_to_all does. The messages are the same
    # either way, so ranks that decide differently (their sizes differ) still match.
    at_once = sum(d.nbytes for d in datas) < LIST_AT_ONCE_MAX_BYTES
    tasks: dict[int, asyncio.Task[Message]] = {k: post(k) for k in range(1, P if at_once else 2)}
    try:
        for k in range(1, P):
            if k + 1 < P and not at_once:
                tasks[k + 1] = post(k + 1)
            if k == 1 or not at_once:
                await asyncio.sleep(0)  # let the posted receives reach the mailbox
            peer = (r + k) % P
            await send_message(
                ch,
                peer,
                datas[peer],
                meta=dict(metas[peer] or {}, nbytes=datas[peer].nbytes),
                step=k,
                segment_bytes=segment_bytes,
            )
            if not at_once:
                out[(r - k) % P] = await tasks.pop(k)
        for k in list(tasks):  # sent at once: every receive is still to be awaited
            out[(r - k) % P] = await tasks.pop(k)
    finally:
        await drain(tasks.values())
    return out  # type: ignore[return-value]


async def all_gather_list(
    ch: Channel, block: np.ndarray, *, meta: dict[str, Any] | None = None, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> list[Message]:
    """All_gather of blocks of any (per-rank different) byte size
    (``allgatherv``): :func:`all_to_all_list` with ``block`` sent to every rank.

    Returns:
        ``[(buffer, meta)]`` indexed by rank: rank ``j``'s block and meta.
    """
    return await all_to_all_list(ch, [block] * ch.size, metas=[meta] * ch.size, segment_bytes=segment_bytes)


async def reduce_scatter_list(
    ch: Channel,
    blocks: Sequence[np.ndarray],
    op: ReduceOp | str,
    out: np.ndarray,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> None:
    """Pairwise reduce_scatter of blocks of different sizes (``reduce_scatter_v``):
    ``out = op over ranks of blocks[ch.rank]``, reduced in the fixed order
    ``((x[r+1] op x[r+2]) op ...) op x[r]``.

    Args:
        blocks: ``P`` C-contiguous arrays of one dtype; ``blocks[k]`` is this
            rank's contribution to rank ``k`` and has the same element count
            on every rank (counts may differ across ``k``). Not modified.
        op: the reduction (``avg`` is left as a sum for the caller).
        out: C-contiguous writeable array with ``blocks[ch.rank]``'s element
            count and dtype, not overlapping any block; receives the result.
    """
    op = parse_op(op)
    check_segment_bytes(segment_bytes)
    P, r = ch.size, ch.rank
    if len(blocks) != P:
        raise ValueError(f"reduce_scatter_list: {len(blocks)} blocks for {P} ranks")
    datas = [flat(b, f"blocks[{k}]", writeable=False) for k, b in enumerate(blocks)]
    dst = flat(out, "out")
    check_op_dtype(op, dst.dtype)
    for k, d in enumerate(datas):
        if d.dtype != dst.dtype:
            raise TypeError(f"reduce_scatter_list: blocks[{k}] is {d.dtype} but out is {dst.dtype}")
        if d.size and dst.size and np.may_share_memory(d, dst):
            raise ValueError("reduce_scatter_list: out must not overlap the blocks")
    if dst.size != datas[r].size:
        raise ValueError(f"reduce_scatter_list: out has {dst.size} elements, blocks[{r}] has {datas[r].size}")
    if P == 1:
        dst[...] = datas[0]
        return
    itemsize = dst.itemsize

    def cut(n: int) -> list[tuple[int, int]]:  # the same cut on sender and receiver
        return split(n, num_segments(n * itemsize, segment_bytes))

    mine = cut(dst.size)
    S = len(mine)
    longest = max(b - a for a, b in mine)
    depth = scratch_depth(S + 2, longest * itemsize)
    scratch = [np.empty(longest, dtype=dst.dtype) for _ in range(depth if P > 2 else 0)]

    def plan(i: int) -> tuple[int, int, int, np.ndarray]:
        k, j = divmod(i, S)
        a, b = mine[j]
        # step k+1 brings rank r+k+1's contribution; the first lands in out
        return (r + k + 1) % P, k + 1, j, dst[a:b] if k == 0 else scratch[i % depth][: b - a]

    async with RecvWindow(ch, plan, (P - 1) * S, depth) as window:
        await window.start()
        for k in range(1, P):
            peer = (r - k) % P
            src = datas[peer]
            for j, (a, b) in enumerate(cut(src.size)):
                await ch.send(peer, src[a:b], step=k, chunk=j)
            for j in range(S):
                i = (k - 1) * S + j
                await window.get(i)
                if k > 1:
                    a, b = mine[j]
                    reduce_into(op, dst[a:b], scratch[i % depth][: b - a])
    reduce_into(op, dst, datas[r])
