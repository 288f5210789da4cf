"""Latency-optimal algorithms for small messages: recursive-doubling
all_reduce, dissemination barrier, and Bruck's all_gather.

**all_reduce (recursive doubling).** Let ``P'`` be the largest power of two
``<= P``. First the ``P-P'`` *extra* ranks ``r >= P'`` fold in: each sends its
buffer to ``r-P'``, which reduces it into its own. Then in round ``k`` (of
``log2 P'``) rank ``r < P'`` swaps its whole buffer with ``r XOR 2^k`` and both
reduce. Finally each extra rank receives the finished result from ``r-P'``.
Messages are cut into segments of at most ``segment_bytes``; the reduction of
segment ``j`` overlaps the arrival of the next ones.

Bits: in every combination the operand of the *lower* rank goes on the left,
``lo op hi``, on both sides (the higher rank reduces into its receive buffer
and swaps buffers, instead of folding into its own). IEEE ``+``/``*`` are
commutative, but which NaN payload survives, and ``min``/``max`` of ``-0.0``
and ``+0.0``, depend on operand order; with one canonical order both partners
compute the same bits, so by induction **all ranks end bit-identical**, the
extra ranks included (they get a copy). ``avg`` is reduced as a sum; the
caller divides.

**barrier (dissemination).** In round ``k`` rank ``r`` sends an empty
message to ``r+2^k`` and waits for one from ``r-2^k`` (mod P). After
``ceil(log2 P)`` rounds every rank has transitively heard from every other,
so no rank leaves before all have entered.

**all_gather (Bruck).** Rank ``r`` holds blocks ``r..r+d-1`` (mod P) before
the round with distance ``d = 2^k``; it sends ``min(d, P-d)`` of them, from
``r`` on, to ``r-d`` and receives the next ones, ``r+d..``, from ``r+d``.
Blocks go straight to their final place in the caller's buffer (a run that
wraps past rank ``P-1`` is sent as two messages), so no final rotation is
needed and any ``P`` works.

Cost, ``P`` ranks, ``N`` bytes (``B = N/P`` a block of all_gather's output),
``L = ceil(log2 P)``, ``P'`` as above:

* ``all_reduce``: ``log2 P'`` steps, plus 2 if ``P != P'``; bytes sent per
  rank ``N log2 P'``, plus ``N`` for ranks paired with an extra one (the
  extra ones send ``N``).
* ``barrier``: ``L`` rounds; ``L`` empty messages per rank.
* ``all_gather``: ``L`` steps; ``(P-1) B`` bytes sent per rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ops import ReduceOp
from ._args import gather_args, reduction_args
from ._common import EXCHANGE_DEPTH, RecvWindow, Reduction, exchange, fold_extra_ranks, interleaved, power_of_two_below
from ._scratch import DEFAULT_SEGMENT_BYTES, num_segments, split

if TYPE_CHECKING:
    from ..mesh.channel import Channel

__all__ = ["all_gather", "all_reduce", "barrier"]

_EMPTY = np.empty(0, dtype=np.uint8)
Pieces = list[tuple[int, int]]  # [lo, hi) byte ranges of the buffer


async def all_reduce(
    ch: Channel, buf: np.ndarray, op: ReduceOp | str, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> None:
    """Recursive-doubling all_reduce of ``buf`` in place (``avg`` left as a sum).

    Args:
        buf: C-contiguous, writeable array, same shape and dtype on every rank.
        op: the reduction.
        segment_bytes: largest message payload (same on every rank).
    """
    op, data = reduction_args(buf, op, segment_bytes)
    P, r = ch.size, ch.rank
    if P == 1:
        return
    rounds = power_of_two_below(P).bit_length() - 1

    async def core() -> None:
        other = np.empty_like(data)
        acc = data
        for k in range(rounds):
            partner = r ^ (1 << k)
            # lo op hi: the lower rank folds into its accumulator, the higher one
            # into its receive buffer (and the buffers swap roles below).
            fold = Reduction(op, acc, acc) if r < partner else Reduction(op, other, acc, incoming_first=True)
            await exchange(ch, partner, k + 1, acc, other, segment_bytes, fold)
            if r > partner:
                acc, other = other, acc
        if acc is not data:
            data[...] = acc

    await fold_extra_ranks(ch, data, op, rounds + 1, segment_bytes, core)


async def barrier(ch: Channel, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
    """Dissemination barrier (``segment_bytes`` is accepted for uniformity)."""
    P, r = ch.size, ch.rank
    dist, step = 1, 0
    while dist < P:

        def plan(_: int, src: int = (r - dist) % P, step: int = step) -> tuple[int, int, int, None]:
            return src, step, 0, None

        async with RecvWindow(ch, plan, 1, 1) as window:
            await window.start()
            await ch.send((r + dist) % P, _EMPTY, step=step)
            await window.get(0)
        dist, step = dist * 2, step + 1


def _runs(first: int, count: int, P: int) -> list[tuple[int, int]]:
    """Blocks ``first..first+count-1`` (mod P) as at most two ``[lo, hi)`` runs."""
    end = first + count
    return [(first, min(end, P))] + ([(0, end - P)] if end > P else [])


async def all_gather(ch: Channel, buf: np.ndarray, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
    """Bruck all_gather in place.

    Args:
        buf: flat (any C-contiguous array; handled as bytes) of ``P`` equal
            blocks, block ``ch.rank`` already filled; the others are filled.
    """
    data, block = gather_args(ch, buf, segment_bytes, "all_gather")
    P, r = ch.size, ch.rank

    def pieces(first: int, count: int) -> list[tuple[int, int]]:
        out = []
        for lo, hi in _runs(first, count, P):
            n = (hi - lo) * block
            out += [(lo * block + a, lo * block + b) for a, b in split(n, num_segments(n, segment_bytes))]
        return out

    # Every incoming piece has its own final place in buf, so the receives of
    # all rounds are posted up front; round k only waits for its own.
    rounds: list[tuple[int, Pieces, int]] = []  # (dist, outgoing, #incoming)
    incoming: list[tuple[int, int, int, int, int]] = []  # (src, step, chunk, lo, hi)
    dist = 1
    while dist < P:
        count = min(dist, P - dist)
        src = (r + dist) % P
        pieces_in = pieces(src, count)
        incoming += [(src, len(rounds), j, a, b) for j, (a, b) in enumerate(pieces_in)]
        rounds.append((dist, pieces(r, count), len(pieces_in)))
        dist *= 2

    def plan(i: int) -> tuple[int, int, int, np.ndarray]:
        src, step, j, a, b = incoming[i]
        return src, step, j, data[a:b]

    async with RecvWindow(ch, plan, len(incoming), EXCHANGE_DEPTH) as window:
        await window.start()
        first = 0  # round step's first incoming piece in the window
        for step, (dist, outgoing, n_in) in enumerate(rounds):

            async def put(j: int, to: int = (r - dist) % P, out: Pieces = outgoing, step: int = step) -> None:
                a, b = out[j]
                await ch.send(to, data[a:b], step=step, chunk=j)

            async def get(j: int, first: int = first) -> None:
                await window.get(first + j)

            await interleaved(len(outgoing), put, n_in, get)
            first += n_in
