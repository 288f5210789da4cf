"""All-pairs all_reduce for tiny messages: one round, every rank to every rank.

How it works: each rank posts a receive from every other rank, sends its
whole buffer to every other rank (staggered: rank ``r`` sends to ``r+1``,
``r+2``, ... so no rank is everyone's first target), then folds the ``P``
contributions in rank order ``((x0 op x1) op x2) ...``.

Cost, ``P`` ranks, ``N`` bytes: **1 step** (the latency of one message, against
``log2 P`` for recursive doubling), ``(P-1) N`` bytes sent and received per
rank, ``(P-1)`` reductions of ``N`` bytes, ``P N`` bytes of scratch. Only worth
it while ``N`` is small enough that latency, not bandwidth, dominates.

Bits: every rank folds the same values in the same order, so the results are
bit-identical everywhere (NaN payloads and signed zeros included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ops import ReduceOp, reduce_into
from ._args import reduction_args
from ._scratch import DEFAULT_SEGMENT_BYTES, num_segments, split

if TYPE_CHECKING:
    from ..mesh.channel import Channel

__all__ = ["all_reduce"]


async def all_reduce(
    ch: Channel, buf: np.ndarray, op: ReduceOp | str, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> None:
    """All-pairs all_reduce of ``buf`` in place (``avg`` left as a sum).

    Args:
        buf: C-contiguous, writeable array, same shape and dtype on every rank.
        op: the reduction.
        segment_bytes: largest message payload (same on every rank).
    """
    op, data = reduction_args(buf, op, segment_bytes)
    P, r = ch.size, ch.rank
    if P == 1:
        return
    segs = split(data.size, num_segments(data.nbytes, segment_bytes))
    parts = {p: (data if p == r else np.empty_like(data)) for p in range(P)}
    posted = [
        ch.post(p, step=0, chunk=j, out=parts[p][a:b]) for p in range(P) if p != r for j, (a, b) in enumerate(segs)
    ]
    for k in range(1, P):
        for j, (a, b) in enumerate(segs):
            await ch.send((r + k) % P, data[a:b], step=0, chunk=j)
    for fut in posted:
        await fut
    acc = parts[0] if r != 0 else data.copy()
    for p in range(1, P):
        reduce_into(op, acc, parts[p])
    data[...] = acc
