"""Recursive halving-doubling all_reduce (Rabenseifner's algorithm), for mid sizes.

How it works, on ``P' = 2^k <= P`` ranks: first the ``P-P'`` extra ranks fold
their buffer into a partner (as in :mod:`.doubling`). Then a *reduce-scatter
by recursive halving*: in round ``i`` each rank exchanges half of its current
range with the partner at distance ``P'/2^(i+1)``, keeps one half and folds the
partner's copy of it in; after ``k`` rounds each rank holds one fully reduced
``1/P'`` of the buffer. Then an *all-gather by recursive doubling* retraces the
rounds backwards, each rank sending what it holds and receiving the
partner's part. Extra ranks get the result at the end.

Cost, ``N`` bytes: ``2 log2 P'`` steps (plus 2 with extra ranks) and
``2 (P'-1)/P' N`` bytes sent per rank — the ring's volume in ``log`` steps
instead of ``2(P-1)``: bandwidth-optimal and latency-friendly, which is why MPI
libraries use it for mid-sized all_reduce.

Bits: every element is reduced on exactly one rank, in a fixed order (the lower
rank's operand on the left at every level), then copied to the others:
bit-identical on every rank.

**reduce_scatter** is the first half alone, over *slots*: slot ``v < P'`` holds
block ``v`` of the ``P``-block input and, when ``v < P-P'``, block ``P'+v`` after
it. With extra ranks, their partners lay their input out in that order in
scratch as they fold the extra input in (the input is read-only) and the other
ranks copy theirs; with none, the order is the input's own, and the first round
sends from the input and reduces from it into scratch, without a copy. After
the ``log2 P'`` halving rounds rank ``v`` holds slot ``v``, keeps block ``v``
and sends block ``P'+v`` to its extra rank. Every round's reduction is folded
by the link as the partner's half arrives, where the link can. Cost:
``log2 P'`` steps (plus 2 with extra ranks), ``(P'-1)/P'`` of the slots' bytes
sent and reduced per rank: the ring's volume in ``log`` steps instead of
``P-1``, which is what small and mid sizes need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ops import ReduceOp, reduce_to
from ._args import reduce_scatter_args, reduction_args
from ._common import Reduction, exchange, fold_extra_ranks, power_of_two_below
from ._scratch import DEFAULT_SEGMENT_BYTES, scratch

if TYPE_CHECKING:
    from ..mesh.channel import Channel

__all__ = ["all_reduce", "reduce_scatter"]


async def all_reduce(
    ch: Channel, buf: np.ndarray, op: ReduceOp | str, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> None:
    """Halving-doubling all_reduce of ``buf`` in place (``avg`` left as a sum).

    Args:
        buf: C-contiguous, writeable array, same shape and dtype on every rank.
        op: the reduction.
        segment_bytes: largest message payload (same on every rank).
    """
    op, data = reduction_args(buf, op, segment_bytes)
    P, r = ch.size, ch.rank
    if P == 1:
        return
    p2 = power_of_two_below(P)
    rounds = p2.bit_length() - 1

    async def core() -> None:
        ranges = []  # (lo, hi, mid) of every halving round
        lo, hi = 0, data.size
        with scratch(1, max(1, (data.size + 1) // 2), data.dtype) as (tmp,):
            for i in range(rounds):  # reduce-scatter: halve the range each round
                partner = r ^ (p2 >> (i + 1))
                mid = lo + (hi - lo) // 2
                keep, give = ((lo, mid), (mid, hi)) if r < partner else ((mid, hi), (lo, mid))
                other, mine = tmp[: keep[1] - keep[0]], data[keep[0] : keep[1]]
                fold = Reduction(op, mine, mine, incoming_first=r > partner)  # the lower rank's operand first
                await exchange(ch, partner, 1 + i, data[give[0] : give[1]], other, segment_bytes, fold)
                ranges.append((lo, hi, mid))
                lo, hi = keep
        for i in reversed(range(rounds)):  # all-gather: retrace the rounds
            partner = r ^ (p2 >> (i + 1))
            plo, phi, mid = ranges[i]
            theirs = (mid, phi) if r < partner else (plo, mid)
            await exchange(
                ch, partner, 1 + rounds + (rounds - 1 - i), data[lo:hi], data[theirs[0] : theirs[1]], segment_bytes
            )
            lo, hi = plo, phi

    await fold_extra_ranks(ch, data, op, 2 * rounds + 1, segment_bytes, core)


async def reduce_scatter(
    ch: Channel, buf: np.ndarray, op: ReduceOp | str, out: np.ndarray, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> None:
    """Recursive-halving reduce_scatter: ``out = op over ranks of block ch.rank of buf``.

    Args:
        buf: flat (any C-contiguous array) of ``P`` equal blocks; block ``k`` is this
            rank's contribution to rank ``k``. Not modified.
        out: C-contiguous writeable array of one block, same dtype, apart from ``buf``;
            receives the reduced block (``avg`` left as a sum).
    """
    op, data, dst = reduce_scatter_args(ch, buf, op, out, segment_bytes)
    P, r, B = ch.size, ch.rank, dst.size
    if P == 1:
        dst[...] = data
        return
    p2 = power_of_two_below(P)
    rounds, extra = p2.bit_length() - 1, P - p2
    if r >= p2:  # an extra rank: its whole input to its partner, then its block back
        await exchange(ch, r - p2, 0, data, None, segment_bytes)
        await exchange(ch, r - p2, rounds + 1, None, dst, segment_bytes)
        return
    order = [k for v in range(p2) for k in ((v, p2 + v) if v < extra else (v,))]  # the blocks, slot by slot
    at = {k: i * B for i, k in enumerate(order)}  # where block k lies in that layout
    starts = [at[v] for v in range(p2)] + [data.size]  # where slot v begins (with block v)
    with scratch(2, data.size, data.dtype) as (acc, tmp):
        if r < extra:  # fold in the extra rank's input, block by block into slot order: mine op theirs
            await exchange(ch, r + p2, 0, None, tmp, segment_bytes)
            for k, a in at.items():
                reduce_to(op, acc[a : a + B], data[k * B : (k + 1) * B], tmp[k * B : (k + 1) * B])
        elif extra:  # slot order differs from the input's: lay the input out in it
            for k, a in at.items():
                acc[a : a + B] = data[k * B : (k + 1) * B]
        src = acc if extra else data  # where the slots' values are: without extra ranks, the input itself
        lo, hi = 0, p2  # the slots this rank still reduces
        for i in range(rounds):
            partner = r ^ (p2 >> (i + 1))
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if r < partner else ((mid, hi), (lo, mid))
            a, b = starts[keep[0]], starts[keep[1]]
            # acc[a:b] = src[a:b] op theirs, the lower rank's operand first (folded as it arrives where it can)
            fold = Reduction(op, acc[a:b], src[a:b], incoming_first=r > partner)
            await exchange(
                ch, partner, 1 + i, src[starts[give[0]] : starts[give[1]]], tmp[: b - a], segment_bytes, fold
            )
            src, lo, hi = acc, *keep
        dst[...] = acc[at[r] : at[r] + B]
        if r < extra:
            await exchange(ch, r + p2, rounds + 1, acc[at[p2 + r] : at[p2 + r] + B], None, segment_bytes)
