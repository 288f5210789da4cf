"""Weighted all_reduce: a direct reduce-scatter and all-gather whose shares follow the
ranks' measured bandwidths, so that every rank finishes together (hivemind's load
balancing, from measured rather than declared bandwidth).

How it works: rank ``i`` owns ``s_i`` consecutive elements of the buffer (its *share*;
``sum s_i = n``, :func:`shares`), cut in *slices* (:class:`Grid`). Every rank sends each
other rank that rank's share of its input (step 1), and folds the ``P-1`` contributions
to its own share it receives, slice by slice, in rank order ``((x0 op x1) op x2) ...``;
each reduced message goes at once to every other rank (step 2), which receives it in
place (all its receives posted at the start). All of it runs at once: a task per peer
and direction, so no rank waits on a peer except for that peer's own bytes, and a
rank's input going out overlaps the results coming in. Without that overlap a rank
that owns nothing would send ``n`` and only then receive ``n``: slower than the ring.

Messages: a link carries whole slices per message, in proportion to the slower end's
rate (a rank at a quarter of the fastest rate moves a quarter of a piece per message,
:meth:`Grid.per_message`), and every stream starts and ends with one slice
(:func:`taper`): the slow rank's results start coming back one small message after
its input starts going out, and stop one small message after it ends, so its link
is busy both ways from start to end. A link faster than the owner's slowest
contributor's is *paced* (:meth:`Grid.paced`): its input runs only :data:`AHEAD`
messages ahead of the results it has back, instead of bursting out at the start into
network queues in front of the results the slow rank waits for.

Shares: rank ``i`` sends and receives ``n - s_i + (P-1) s_i = n + (P-2) s_i`` elements,
at its rate ``w_i``, so it takes ``(n + (P-2) s_i) / w_i``. :func:`shares` minimises the
largest of these, ``T`` (in closed form over the ranks fast enough to own anything, at
least ``n`` over the slowest rate), and among such shares takes the most nearly equal
(water-filling up to each rank's cap ``(T w_i - n)/(P-2)``: where the slowest rank sets
``T``, noise in the others' measured rates does not skew their shares), then rounds to whole elements
(largest remainders; ties to the faster rank, then the lower rank). With equal rates
every share is ``n/P`` (±1): the ring's bytes. A rank slow enough owns nothing and
moves only its own input out and the result in (``n`` each way), the least any
all_reduce can: at 4 ranks with one rank 4x slower (``w/4``), ``4n/w`` against the
ring's ``6n/w`` (the bound: 1.5x). At 2 ranks every share costs the same (``n`` each
way): the shares are equal.

Cost, ``P`` ranks, ``N`` bytes, shares ``s_i`` (bytes), rates ``w_i``: 2 steps;
``max_i (N + (P-2) s_i) / w_i`` on the busiest rank (equal rates: ``2(P-1)/P N``, as the
ring), plus one slice's transfer at the end; ``(P-1) s_i`` bytes reduced by rank ``i``;
per link ``i``-``q`` and direction about ``q``'s share, about ``s_q / (piece · min(w_i, w_q)
/ max(w))`` messages (whole slices each) plus up to ``2 log2`` :data:`FINE` tapered ones (:func:`piece`: at most
``segment_bytes``, a share at least :data:`PIECES` of them; :meth:`Grid.full_messages`
counts them at the fastest rate). Scratch: up to :data:`WINDOW` messages per contributor, within
``SCRATCH_BUDGET_BYTES`` (but never fewer than 2 each).

Bits: every element is reduced by its owner alone, in rank order, and copied to
everyone: **all ranks end with bit-identical results**, the same for repeated runs
with the same shares (other shares may round differently, as another algorithm may).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ops import ReduceOp, reduce_into
from ._common import (
    DEFAULT_SEGMENT_BYTES,
    SCRATCH_BUDGET_BYTES,
    Plan,
    RecvWindow,
    drain,
    own_input,
    reduction_args,
    scratch,
)

if TYPE_CHECKING:
    from ..mesh.channel import Channel

__all__ = ["Grid", "all_reduce", "busiest", "ideal", "piece", "shares", "taper"]

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
#: slices per piece (a slice: the unit an owner reduces in and the links' messages are made
#: of), each of at least MIN_SLICE_BYTES (fewer slices cost less Python per byte)
FINE = 16
MIN_SLICE_BYTES = 16 * 1024
#: receives posted ahead per contributor, each into a scratch message of its own
WINDOW = 8
#: messages a paced link's input runs ahead of the results it has back (:meth:`Grid.paced`)
AHEAD = 4

#: a posted receive: its payload and header
Result = asyncio.Future[tuple[memoryview, dict[str, Any]]]


@dataclass
class Results:
    """The receives of the other ranks' results, by owner, once posted."""

    of: dict[int, list[Result]] = field(default_factory=dict)
    posted: asyncio.Event = field(default_factory=asyncio.Event)


def _usable(rates: Sequence[float] | None, p: int) -> list[float] | None:
    """``rates`` as floats if there is one positive, finite rate per rank, else None."""
    if rates is None or len(rates) != p:
        return None
    out = [float(w) for w in rates]
    return out if all(math.isfinite(w) and w > 0 for w in out) else None


def ideal(n: float, rates: Sequence[float] | None, p: int) -> list[float]:
    """The real-valued shares of ``n`` minimising ``T = max_i (n + (P-2) s_i) / w_i``,
    and among those the most nearly equal (equal shares when ``P <= 2`` or the rates are
    not one positive number per rank).

    ``T`` is the larger of the level time of the ranks fast enough to own something and
    ``n / min(w)`` (every rank moves at least ``n`` each way). When the slowest rank sets
    ``T`` the others have slack, and levelling them would turn small differences of
    measured rates into very unequal shares (50.9 / 11.2 / 1.9 MiB of 64 was seen under
    load): each rank instead gets at most its cap ``(T w_i - n) / (P-2)`` (so none
    finishes after ``T``) and otherwise an equal part (water-filling up to the caps).
    Without slack the caps are the level shares themselves."""
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
    t = max(t, n / min(w))
    caps = [max(0.0, (t * wi - n) / (p - 2)) for wi in w]
    out, left = [0.0] * p, n
    owners = sorted((i for i in range(p) if caps[i] > 0), key=lambda i: (caps[i], i))
    for k, i in enumerate(owners):  # the smallest caps first: what they cannot take goes on
        out[i] = min(caps[i], left / (len(owners) - k))
        left -= out[i]
    return out


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
    by = sorted(range(p), key=lambda i: (-round(real[i] - out[i], 9), -w[i], i))  # float noise is no fraction
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


def piece(n: int, itemsize: int, p: int, segment_bytes: int) -> int:
    """Elements per message on the fastest links: at most ``segment_bytes``, and small
    enough that a share is :data:`PIECES` messages (so a rank's sends and receives
    overlap: the owners reduce and send back each piece as soon as it is in), but not
    below :data:`MIN_PIECE_BYTES`."""
    most = max(1, segment_bytes // max(1, itemsize))
    want = max(-(-n // (p * PIECES)), MIN_PIECE_BYTES // max(1, itemsize))
    return max(1, min(most, want))


def taper(k: int, m: int) -> list[int]:
    """Sizes of the messages that carry ``k`` slices, at most ``m`` each, doubling from 1
    at the start and halving to 1 at the end (``1, 2, 4, m, ..., m, 4, 2, 1``): a stream's
    first message is small, so its receiver starts early, and so is its last, so it ends
    soon after the last slice is reduced."""
    front: list[int] = []
    back: list[int] = []
    step = 1
    while k > 0:
        for side in (front, back):
            if (take := min(step, m, k)) > 0:
                side.append(take)
                k -= take
        step = min(2 * step, m)
    return front + back[::-1]


@dataclass(frozen=True, slots=True)
class Grid:
    """Where one call's shares, slices and messages start and end, the same on every rank.

    A share is cut in *slices* of :attr:`size` elements (the last shorter), the unit its
    owner reduces in; a message between ranks ``i`` and ``q`` about ``q``'s share carries
    whole slices, as many as the slower of the two is fast (:meth:`per_message`: a link
    at a quarter of the fastest rate moves a quarter of a piece per message), tapered
    at both ends (:func:`taper`). Both directions of a link use the same bounds."""

    at: list[int]  #: ``at[q]``: where rank ``q``'s share starts (``at[P]``: the size)
    size: int  #: elements per slice
    full: int  #: slices per message on the fastest links
    rates: list[float]  #: the ranks' rates (all 1 when unusable)

    @classmethod
    def of(cls, n: int, itemsize: int, p: int, segment_bytes: int, rates: Sequence[float] | None) -> Grid:
        """The grid of ``n`` elements of ``itemsize`` bytes over ``p`` ranks of ``rates``."""
        per = piece(n, itemsize, p, segment_bytes)
        size = max(1, min(per, max(per // FINE, -(-MIN_SLICE_BYTES // max(1, itemsize)))))
        return cls(bounds(shares(n, rates, p)), size, max(1, per // size), _usable(rates, p) or [1.0] * p)

    def slices(self, q: int) -> int:
        """How many slices rank ``q``'s share has."""
        return -(-(self.at[q + 1] - self.at[q]) // self.size)

    def slice_bounds(self, q: int) -> list[tuple[int, int]]:
        """``[a, b)`` of each slice of rank ``q``'s share, within the share."""
        n = self.at[q + 1] - self.at[q]
        return [(a, min(n, a + self.size)) for a in range(0, n, self.size)]

    def slice_of(self, e: int) -> int:
        """The slice that element ``e`` of a share is in."""
        return e // self.size

    def per_message(self, i: int, q: int) -> int:
        """Slices per message between ranks ``i`` and ``q`` (a function of the slower's rate)."""
        ratio = min(self.rates[i], self.rates[q]) / max(self.rates)
        return max(1, min(self.full, math.ceil(self.full * ratio - 1e-9)))

    def paced(self, i: int, q: int) -> bool:
        """Whether rank ``i`` paces its input to owner ``q`` by ``q``'s results: when some
        other contributor's link to ``q`` is slower (``q`` reduces at that one's pace, and
        input sent far ahead of it only queues on the network, in front of results)."""
        slowest = min(min(w, self.rates[q]) for c, w in enumerate(self.rates) if c != q)
        return min(self.rates[i], self.rates[q]) > slowest

    def full_messages(self) -> int:
        """Messages on a link at the fastest rate about the largest share (a slower link's
        more, smaller messages cost their overhead while its bytes take longer still)."""
        return max((len(taper(self.slices(q), self.full)) for q in range(len(self.rates))), default=0)

    def messages(self, i: int, q: int) -> list[tuple[int, int]]:
        """``[a, b)`` within ``q``'s share of each message between ranks ``i`` and ``q``
        about it (``i``'s input to ``q``, and ``q``'s result to ``i``); none if it is empty."""
        n, k = self.at[q + 1] - self.at[q], 0
        out = []
        for m in taper(self.slices(q), self.per_message(i, q)):
            out.append((k * self.size, min(n, (k + m) * self.size)))
            k += m
        return out


async def all_reduce(
    ch: Channel,
    buf: np.ndarray,
    op: ReduceOp | str,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    rates: Sequence[float] | None = None,
    src: np.ndarray | None = None,
) -> None:
    """Weighted all_reduce of ``buf`` in place (``avg`` left as a sum).

    Args:
        buf: C-contiguous, writeable array, same shape and dtype on every rank.
        op: the reduction.
        segment_bytes: largest message payload (same on every rank).
        rates: one relative bandwidth per rank, THE SAME ON EVERY RANK (the group's
            agreed measurement); None or unusable: equal shares.
        src: if given, this rank's input (same size and dtype, not overlapping
            ``buf``), read only; ``buf``'s contents are then only written.
    """
    op, data = reduction_args(buf, op, segment_bytes)
    given = own_input(src, data, "weighted all_reduce")
    P, r = ch.size, ch.rank
    if P == 1:
        if given is not None:
            data[...] = given
        return
    grid = Grid.of(data.size, data.itemsize, P, segment_bytes, rates)
    inp = data if given is None else given
    at = grid.at
    ready = [asyncio.Event() for _ in range(grid.slices(r))]
    results = Results()  # the sends start first: posting every result's receive takes a while
    tasks = [asyncio.ensure_future(_send_share(ch, grid, inp, p, results)) for p in _peers(r, P)]
    tasks += [asyncio.ensure_future(_send_reduced(ch, grid, data, p, ready)) for p in _peers(r, P)]
    tasks += [
        asyncio.ensure_future(_reduce_own(ch, grid, op, inp[at[r] : at[r + 1]], data[at[r] : at[r + 1]], ready)),
        asyncio.ensure_future(_gather_shares(ch, grid, data, results)),
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


def _peers(r: int, p: int) -> list[int]:
    """The other ranks, ``r+1, r+2, ...`` (so no rank is everyone's first)."""
    return [(r + k) % p for k in range(1, p)]


async def _send_share(ch: Channel, grid: Grid, inp: np.ndarray, peer: int, results: Results) -> None:
    """This rank's input for ``peer``'s share, message by message; on a paced link
    (:meth:`Grid.paced`) message ``j`` only once ``peer``'s result message ``j -`` :data:`AHEAD`
    is in."""
    part = inp[grid.at[peer] : grid.at[peer + 1]]
    paced = grid.paced(ch.rank, peer)
    for j, (a, b) in enumerate(grid.messages(ch.rank, peer)):
        if paced and j >= AHEAD:
            await results.posted.wait()
            await results.of[peer][j - AHEAD]
        await ch.send(peer, part[a:b], step=SCATTER_STEP, chunk=j)


async def _send_reduced(ch: Channel, grid: Grid, data: np.ndarray, peer: int, ready: list[asyncio.Event]) -> None:
    """This rank's reduced share to ``peer``, each message once its last slice is reduced."""
    r = ch.rank
    mine = data[grid.at[r] : grid.at[r + 1]]
    for j, (a, b) in enumerate(grid.messages(peer, r)):
        await ready[grid.slice_of(b - 1)].wait()
        await ch.send(peer, mine[a:b], step=GATHER_STEP, chunk=j)


async def _reduce_own(
    ch: Channel, grid: Grid, op: ReduceOp, own: np.ndarray, out: np.ndarray, ready: list[asyncio.Event]
) -> None:
    """Receive every other rank's contribution to this rank's share (``own`` is this
    rank's) and fold all ``P`` in rank order, slice by slice, into ``out``; each
    slice's event is set once it is. Each contributor's messages (of its link's size,
    :meth:`Grid.messages`) land in scratch of its own, posted ahead."""
    P, r = ch.size, ch.rank
    if not ready:
        return
    others = [q for q in range(P) if q != r]
    msgs = {q: grid.messages(q, r) for q in others}
    async with contextlib.AsyncExitStack() as stack:
        windows: dict[int, tuple[RecvWindow, list[np.ndarray], list[tuple[int, int]]]] = {}
        for q in others:
            longest = max(b - a for a, b in msgs[q])
            depth = max(2, min(WINDOW, SCRATCH_BUDGET_BYTES // max(1, longest * own.itemsize * (P - 1))))
            bufs = stack.enter_context(scratch(depth, longest, own.dtype))
            plan = _planner(q, msgs[q], bufs)
            window = await stack.enter_async_context(RecvWindow(ch, plan, len(msgs[q]), depth - 1))
            windows[q] = window, bufs, msgs[q]
        for window, _, _ in windows.values():
            await window.start()
        await _fold_slices(grid, op, (r, P), own, out, ready, windows)


def _planner(q: int, msgs: list[tuple[int, int]], bufs: list[np.ndarray]) -> Plan:
    """The receive plan of contributor ``q``'s messages: message ``i`` into ``bufs[i % depth]``."""

    def plan(i: int) -> tuple[int, int, int, np.ndarray]:
        a, b = msgs[i]
        return q, SCATTER_STEP, i, bufs[i % len(bufs)][: b - a]

    return plan


async def _fold_slices(
    grid: Grid,
    op: ReduceOp,
    who: tuple[int, int],
    own: np.ndarray,
    out: np.ndarray,
    ready: list[asyncio.Event],
    windows: dict[int, tuple[RecvWindow, list[np.ndarray], list[tuple[int, int]]]],
) -> None:
    """Fold every slice of this rank's share (``who``: this rank, the group size) in rank
    order ``((x0 op x1) op x2) ...``, taking each contributor's next message as needed."""
    r, P = who
    at_msg = dict.fromkeys(windows, -1)
    longest = max((b - a for a, b in grid.slice_bounds(r)), default=0)
    with scratch(1, longest, own.dtype) as (acc,):
        for j, (a, b) in enumerate(grid.slice_bounds(r)):
            total = acc[: b - a]
            for q in range(P):
                if q == r:
                    part = own[a:b]
                else:
                    window, bufs, msgs = windows[q]
                    i = at_msg[q]
                    while i < 0 or msgs[i][1] <= a:
                        i += 1
                        await window.get(i)
                    at_msg[q] = i
                    start = msgs[i][0]
                    part = bufs[i % len(bufs)][a - start : b - start]
                if q == 0:
                    total[...] = part
                else:
                    reduce_into(op, total, part)
            out[a:b] = total
            ready[j].set()


def _post_results(ch: Channel, grid: Grid, data: np.ndarray, q: int) -> list[Result]:
    """Post a receive for every message of rank ``q``'s reduced share, in place in ``data``.
    Without ``src`` a message lands where this rank's own input for ``q`` was: ``q`` sends
    it only after it received that input (the same bounds both ways, :meth:`Grid.messages`)."""
    at, out = grid.at[q], []
    for j, (a, b) in enumerate(grid.messages(ch.rank, q)):
        fut = ch.post(q, step=GATHER_STEP, chunk=j, out=data[at + a : at + b])
        fut.add_done_callback(_retrieved)
        out.append(fut)
    return out


def _retrieved(fut: Result) -> None:
    """Mark a receive's failure as seen (the operation's failure is raised elsewhere)."""
    if not fut.cancelled():
        fut.exception()


async def _gather_shares(ch: Channel, grid: Grid, data: np.ndarray, results: Results) -> None:
    """Post the receives of every other rank's reduced share (in place, all at once) and
    wait for them."""
    for q in _peers(ch.rank, ch.size):
        results.of[q] = _post_results(ch, grid, data, q)
    results.posted.set()
    for futures in results.of.values():
        for fut in futures:
            await fut
