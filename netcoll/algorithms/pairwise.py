"""Pairwise-exchange all_to_all.

It works as follows. Both buffers are ``P`` equal blocks; block ``k`` of
``send`` goes to rank ``k`` and block ``j`` of ``recv`` comes from rank ``j``.
The own block is copied locally. Then in step ``k = 1..P-1`` rank ``r`` sends
its block for ``r+k`` to rank ``r+k`` and receives rank ``r-k``'s block for it
(mod P), so every rank sends to and receives from exactly one peer per step and
no link carries two transfers at once. Blocks are cut into segments of at most
``segment_bytes``; the receives of the current and the next step are posted
straight into ``recv`` before the step's sends go out.

Cost, ``P`` ranks, ``N`` bytes per buffer (``B = N/P`` a block):
``P-1`` steps; ``(P-1) B`` bytes sent and received per rank; one local copy
of ``B`` bytes.

Bits: pure data movement; ``recv`` holds exactly the bytes the peers sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._common import DEFAULT_SEGMENT_BYTES, RecvWindow, as_u8, check_segment_bytes, num_segments, split

if TYPE_CHECKING:
    from ..transport.base import Channel

__all__ = ["all_to_all"]


async def all_to_all(ch: Channel, send: np.ndarray, recv: np.ndarray, *,
                     segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
    """Pairwise all_to_all: ``recv`` block ``j`` = rank ``j``'s ``send`` block ``ch.rank``.

    Args:
        send: C-contiguous array of ``P`` equal blocks (handled as bytes).
        recv: writeable C-contiguous array of the same byte size, not
            overlapping ``send``.
    """
    check_segment_bytes(segment_bytes)
    src_buf = as_u8(send, "send", writeable=False)
    dst_buf = as_u8(recv, "recv")
    P, r = ch.size, ch.rank
    if src_buf.nbytes != dst_buf.nbytes or src_buf.nbytes % P:
        raise ValueError(f"all_to_all: send ({src_buf.nbytes} bytes) and recv ({dst_buf.nbytes} bytes) "
                         f"must be {P} equal blocks of the same size")
    if np.may_share_memory(src_buf, dst_buf) and src_buf.nbytes:
        raise ValueError("all_to_all: send and recv must not overlap")
    block = src_buf.nbytes // P
    dst_buf[r * block:(r + 1) * block] = src_buf[r * block:(r + 1) * block]
    if P == 1:
        return
    segs = split(block, num_segments(block, segment_bytes))
    S = len(segs)

    def plan(i: int) -> tuple[int, int, int, np.ndarray]:
        k, j = divmod(i, S)
        peer = (r - k - 1) % P
        a, b = segs[j]
        return peer, k + 1, j, dst_buf[peer * block + a:peer * block + b]

    async with RecvWindow(ch, plan, (P - 1) * S, 2 * S) as window:
        await window.start()
        for k in range(1, P):
            peer = (r + k) % P
            for j, (a, b) in enumerate(segs):
                await ch.send(peer, src_buf[peer * block + a:peer * block + b], step=k, chunk=j)
            for j in range(S):
                await window.get((k - 1) * S + j)
