"""Weighted all_reduce: a direct reduce-scatter and all-gather whose shares follow the
ranks' measured bandwidths, so that every rank finishes together (hivemind's load
balancing, from measured rather than declared bandwidth).

How it works: rank ``i`` owns ``s_i`` consecutive elements of the buffer (its *share*;
``sum s_i = n``, :func:`shares`). Every rank sends each other rank that rank's share of
its input (step 1), and folds the ``P-1`` contributions to its own share it receives,
segment by segment, in rank order ``((x0 op x1) op x2) ...``; each reduced segment goes
at once to every other rank (step 2), which receives it in place (where its own input
for that owner was: the owner sends it only after receiving that input). All of it runs
at once: a task per peer and direction, the receives posted ahead (a
:class:`~._common.RecvWindow` over scratch segments), so no rank waits on a peer except
for that peer's own bytes, and a rank's input going out overlaps the results coming in
(a share is at least :data:`PIECES` messages: :func:`piece`). Without that overlap a
rank that owns nothing would send ``n`` and only then receive ``n``: slower than the ring.

Shares: rank ``i`` sends and receives ``n - s_i + (P-1) s_i = n + (P-2) s_i`` elements,
at its rate ``w_i``, so it takes ``(n + (P-2) s_i) / w_i``. :func:`shares` minimises the
largest of these (water-filling: ``s_i = max(0, (T w_i - n)/(P-2))``, ``T`` in closed
form over the ranks fast enough to own anything), then rounds to whole elements
(largest remainders; ties to the faster rank, then the lower rank). With equal rates
every share is ``n/P`` (±1): the ring's bytes. A rank slow enough owns nothing and
moves only its own input out and the result in (``n`` each way), the least any
all_reduce can: at 4 ranks with one rank 4x slower (``w/4``), ``4n/w`` against the
ring's ``6n/w`` (the bound: 1.5x). At 2 ranks every share costs the same (``n`` each
way): the shares are equal.

Cost, ``P`` ranks, ``N`` bytes, shares ``s_i`` (bytes), rates ``w_i``: 2 steps;
``max_i (N + (P-2) s_i) / w_i`` on the busiest rank (equal rates: ``2(P-1)/P N``, as the
ring); ``(P-1) s_i`` bytes reduced by rank ``i``; ``2 (P-1) ceil(s/piece)`` messages
(:func:`piece`: at most ``segment_bytes``, a share at least :data:`PIECES` of them).
Scratch: a few segments (within ``SCRATCH_BUDGET_BYTES``).

Bits: every element is reduced by its owner alone, in rank order, and copied to
everyone: **all ranks end with bit-identical results**, the same for repeated runs
with the same shares (other shares may round differently, as another algorithm may).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..ops import ReduceOp, reduce_into
from ._common import (
    DEFAULT_SEGMENT_BYTES,
    RecvWindow,
    drain,
    num_segments,
    reduction_args,
    scratch,
    scratch_depth,
    split,
)

if TYPE_CHECKING:
    from ..mesh.channel import Channel

__all__ = ["all_reduce", "busiest", "ideal", "piece", "shares"]

#: step numbers of the two phases' messages
SCATTER_STEP = 1
GATHER_STEP = 2
#: messages per share, at least (:func:`piece`), each of at least MIN_PIECE_BYTES (fewer,
#: larger messages cost less per byte where links are fast). Measured on the emulated
#: network (bench/slowrank.py: 4 ranks, 1 Gbit/s, rank 2 at 250 Mbit/s, a loaded 2-core
#: machine), 64 MiB against the ring's 3.7-3.9 s: pieces of 2 MiB 3.2-3.3 s, 512 KiB 2.7 s,
#: 256 KiB 3.1 s; 16 MiB against 0.95-1.05 s: 512 KiB 0.69 s, 128 KiB 0.72-0.76 s
PIECES = 32
MIN_PIECE_BYTES = 256 * 1024


def _usable(rates: Sequence[float] | None, p: int) -> list[float] | None:
    """``rates`` as floats if there is one positive, finite rate per rank, else None."""
    if rates is None or len(rates) != p:
        return None
    out = [float(w) for w in rates]
    return out if all(math.isfinite(w) and w > 0 for w in out) else None


def ideal(n: float, rates: Sequence[float] | None, p: int) -> list[float]:
    """The real-valued shares of ``n`` minimising ``max_i (n + (P-2) s_i) / w_i``
    (equal shares when ``P <= 2`` or the rates are not one positive number per rank)."""
    w = _usable(rates, p)
    if w is None or p <= 2:
        return [n / p] * p
    order = sorted(range(p), key=lambda i: (-w[i], i))
    total, t = 0.0, 0.0
    for k, i in enumerate(order, start=1):  # the k fastest own something
        total += w[i]
        tk = n * (p - 2 + k) / total
        if tk * w[i] < n:  # the k-th fastest would own less than nothing
            break
        t = tk
    return [max(0.0, (t * wi - n) / (p - 2)) for wi in w]


def shares(n: int, rates: Sequence[float] | None, p: int) -> list[int]:
    """Whole-element shares of ``n`` elements for ``p`` ranks of ``rates`` (any unit;
    only ratios matter): :func:`ideal` rounded down, the remainder one element each to
    the largest fractions (ties: the faster rank, then the lower rank). Non-negative,
    summing to ``n``; a slower rank never gets more; a pure function of its arguments
    (plain float arithmetic), so every rank computes the same shares."""
    if p < 1 or n < 0:
        raise ValueError(f"shares: need p >= 1 and n >= 0, got p={p}, n={n}")
    real = ideal(float(n), rates, p)
    scale = n / s if (s := sum(real)) > 0 else 0.0
    real = [x * scale for x in real]
    out = [min(n, math.floor(x)) for x in real]
    w = _usable(rates, p) or [1.0] * p
    by = sorted(range(p), key=lambda i: (-(real[i] - out[i]), -w[i], i))
    rest = n - sum(out)
    while rest < 0:  # (floating rounding above n: take back from the largest)
        i = max(range(p), key=lambda j: (out[j], j))
        out[i] -= 1
        rest += 1
    for i in by[:rest]:
        out[i] += 1
    return out


def busiest(n: float, rates: Sequence[float] | None, p: int) -> float:
    """The busiest rank's elements moved each way, in the slowest rank's time:
    ``max_i (n + (P-2) s_i) · min(w) / w_i`` for :func:`ideal` shares (what the cost
    model charges ``beta``, the slowest rank's rate, for; equal rates: ``2(P-1)/P n``)."""
    if p < 2:
        return 0.0
    s = ideal(n, rates, p)
    w = _usable(rates, p) or [1.0] * p
    slow = min(w)
    return max((n - s[i] + (p - 1) * s[i]) * slow / w[i] for i in range(p))


def bounds(sizes: Sequence[int]) -> list[int]:
    """Offsets of consecutive shares: ``bounds(s)[i]`` is where rank ``i``'s share starts."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


async def all_reduce(
    ch: Channel,
    buf: np.ndarray,
    op: ReduceOp | str,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    rates: Sequence[float] | None = None,
) -> None:
    """Weighted all_reduce of ``buf`` in place (``avg`` left as a sum).

    Args:
        buf: C-contiguous, writeable array, same shape and dtype on every rank.
        op: the reduction.
        segment_bytes: largest message payload (same on every rank).
        rates: one relative bandwidth per rank, THE SAME ON EVERY RANK (the group's
            agreed measurement); None or unusable: equal shares.
    """
    op, data = reduction_args(buf, op, segment_bytes)
    P, r = ch.size, ch.rank
    if P == 1:
        return
    at = bounds(shares(data.size, rates, P))
    per = piece(data.size, data.itemsize, P, segment_bytes)
    mine = data[at[r] : at[r + 1]]
    ready = [asyncio.Event() for _ in _segments(mine.size, per)]
    tasks = [asyncio.ensure_future(_send_share(ch, data[at[p] : at[p + 1]], p, per)) for p in _peers(r, P)]
    tasks += [asyncio.ensure_future(_send_reduced(ch, mine, p, per, ready)) for p in _peers(r, P)]
    tasks += [
        asyncio.ensure_future(_reduce_own(ch, op, mine, per, ready)),
        asyncio.ensure_future(_gather_shares(ch, data, at, per)),
    ]
    await _all_or_first_error(tasks)


async def _all_or_first_error(tasks: Sequence[asyncio.Future[None]]) -> None:
    """Await every task; on the first to fail (whichever it is: a send may wait on a
    segment that a failed receive never reduces) cancel the rest and re-raise it."""
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:  # cancelled from outside
        await drain(tasks)
        raise
    failed = [t for t in done if not t.cancelled() and t.exception() is not None]
    if failed:
        await drain(tasks)
        raise failed[0].exception()  # type: ignore[misc]


def piece(n: int, itemsize: int, p: int, segment_bytes: int) -> int:
    """Elements per message: at most ``segment_bytes``, and small enough that a share is
    :data:`PIECES` messages (so a rank's sends and receives overlap: the owners reduce and
    send back each piece as soon as it is in), but not below :data:`MIN_PIECE_BYTES`."""
    most = max(1, segment_bytes // max(1, itemsize))
    want = max(-(-n // (p * PIECES)), MIN_PIECE_BYTES // max(1, itemsize))
    return max(1, min(most, want))


def _peers(r: int, p: int) -> list[int]:
    """The other ranks, ``r+1, r+2, ...`` (so no rank is everyone's first)."""
    return [(r + k) % p for k in range(1, p)]


def _segments(count: int, per: int) -> list[tuple[int, int]]:
    """Segments of a share of ``count`` elements, at most ``per`` each (none if empty)."""
    return split(count, num_segments(count, per)) if count else []


async def _send_share(ch: Channel, part: np.ndarray, peer: int, per: int) -> None:
    """This rank's input for ``peer``'s share, segment by segment."""
    for j, (a, b) in enumerate(_segments(part.size, per)):
        await ch.send(peer, part[a:b], step=SCATTER_STEP, chunk=j)


async def _send_reduced(ch: Channel, mine: np.ndarray, peer: int, per: int, ready: list[asyncio.Event]) -> None:
    """This rank's reduced share to ``peer``, each segment once it is reduced."""
    for j, (a, b) in enumerate(_segments(mine.size, per)):
        await ready[j].wait()
        await ch.send(peer, mine[a:b], step=GATHER_STEP, chunk=j)


async def _reduce_own(ch: Channel, op: ReduceOp, own: np.ndarray, per: int, ready: list[asyncio.Event]) -> None:
    """Receive every other rank's contribution to ``own`` and fold all ``P`` in rank
    order, segment by segment, into ``own``; each segment's event is set once it is."""
    P, r = ch.size, ch.rank
    segs = _segments(own.size, per)
    if not segs:
        return
    others = [q for q in range(P) if q != r]
    longest = segs[0][1] - segs[0][0]
    depth = scratch_depth(2 * (P - 1) + 1, longest * own.itemsize)
    with scratch(depth, longest, own.dtype) as bufs, scratch(1, longest, own.dtype) as (acc,):

        def plan(i: int) -> tuple[int, int, int, np.ndarray]:
            j, k = divmod(i, P - 1)
            a, b = segs[j]
            return others[k], SCATTER_STEP, j, bufs[i % depth][: b - a]

        async with RecvWindow(ch, plan, len(segs) * (P - 1), depth - 1) as window:
            await window.start()
            for j, (a, b) in enumerate(segs):
                total = acc[: b - a]
                for q in range(P):
                    if q == r:
                        part = own[a:b]
                    else:
                        i = j * (P - 1) + (q if q < r else q - 1)
                        await window.get(i)
                        part = bufs[i % depth][: b - a]
                    if q == 0:
                        total[...] = part
                    else:
                        reduce_into(op, total, part)
                own[a:b] = total
                ready[j].set()


async def _gather_shares(ch: Channel, data: np.ndarray, at: list[int], per: int) -> None:
    """Receive every other rank's reduced share in place, segment ``j`` of every owner
    before segment ``j+1`` of any (the order they are reduced in). A segment's receive
    lands where this rank's own input for that owner was: the owner sends it only after
    it received that input."""
    P, r = ch.size, ch.rank
    owned = {q: _segments(at[q + 1] - at[q], per) for q in _peers(r, P)}
    plans = sorted(
        ((j, q, a + at[q], b + at[q]) for q, segs in owned.items() for j, (a, b) in enumerate(segs)),
        key=lambda x: (x[0], (x[1] - r) % P),
    )
    if not plans:
        return

    def plan(i: int) -> tuple[int, int, int, np.ndarray]:
        j, q, a, b = plans[i]
        return q, GATHER_STEP, j, data[a:b]

    async with RecvWindow(ch, plan, len(plans), 4 * (P - 1)) as window:
        await window.start()
        for i in range(len(plans)):
            await window.get(i)
