"""Weighted all_reduce: a direct reduce-scatter and all-gather whose shares follow the
ranks' measured bandwidths, so that every rank finishes together (hivemind's load
balancing, from measured rather than declared bandwidth).

How it works: rank ``i`` owns ``s_i`` consecutive elements of the buffer (its *share*;
``sum s_i = n``, :func:`~.shares.shares`), cut in *slices* (:class:`~.shares.Grid`).
Every rank sends each other rank that rank's share of its input (step 1), and folds the
``P-1`` contributions to its own share it receives, slice by slice, in rank order
``((x0 op x1) op x2) ...``; each reduced message goes at once to every other rank (step
2), which receives it in place (all its receives posted at the start). All of it runs at
once: a task per peer and direction, so no rank waits on a peer except for that peer's
own bytes, and a rank's input going out overlaps the results coming in. Without that
overlap a rank that owns nothing would send ``n`` and only then receive ``n``: slower
than the ring.

Shares, slices and messages are :mod:`.shares`' (:func:`~.shares.shares`,
:class:`~.shares.Grid`): a rank slow enough owns nothing and moves only its own input
out and the result in. Every stream starts and ends with one slice
(:func:`~.shares.taper`): the slow rank's results start coming back one small message
after its input starts going out, and stop one small message after it ends, so its
link is busy both ways from start to end. A link faster than the owner's slowest
contributor's is *paced* (:meth:`~.shares.Grid.paced`): its input runs only :data:`AHEAD`
messages ahead of the results it has back, instead of bursting out at the start into
network queues in front of the results the slow rank waits for. The slowest rank
(:meth:`~.shares.Grid.streams`) sends its input as one stream instead of a task per
owner (:func:`_send_stream`): its flows to the owners advance together and end together.

Cost, ``P`` ranks, ``N`` bytes, shares ``s_i`` (bytes), rates ``w_i``: 2 steps;
``max_i (N + (P-2) s_i) / w_i`` on the busiest rank (equal rates: ``2(P-1)/P N``, as the
ring), plus one slice's transfer at the end; ``(P-1) s_i`` bytes reduced by rank ``i``;
per link ``i``-``q`` and direction about ``q``'s share, about ``s_q / (piece ·
min(w_i, w_q) / max(w))`` messages (whole slices each) plus up to ``2 log2``
:data:`~.shares.FINE` tapered ones (:func:`~.shares.piece`: at most ``segment_bytes``,
a share at least :data:`~.shares.PIECES` of them; :meth:`~.shares.Grid.full_messages`
counts them at the fastest rate). Scratch: up to :data:`WINDOW` messages per
contributor, within ``SCRATCH_BUDGET_BYTES`` (but never fewer than 2 each).

Bits: every element is reduced by its owner alone, in rank order, and copied to
everyone: **all ranks end with bit-identical results**, the same for repeated runs
with the same shares (other shares may round differently, as another algorithm may).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ops import ReduceOp, reduce_into
from ._args import own_input, reduction_args
from ._common import Plan, RecvWindow, drain
from ._scratch import DEFAULT_SEGMENT_BYTES, SCRATCH_BUDGET_BYTES, scratch
from .shares import Grid

if TYPE_CHECKING:
    from ..mesh.channel import Channel

__all__ = ["all_reduce"]

#: step numbers of the two phases' messages
SCATTER_STEP = 1
GATHER_STEP = 2
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
    if grid.streams(r):
        tasks = [asyncio.ensure_future(_send_stream(ch, grid, inp, results))]
    else:
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
            await _result_in(results, peer, j - AHEAD)
        await ch.send(peer, part[a:b], step=SCATTER_STEP, chunk=j)


async def _send_stream(ch: Channel, grid: Grid, inp: np.ndarray, results: Results) -> None:
    """This rank's input for every other rank's share as one stream
    (:meth:`Grid.interleaved`), owner ``q``'s message ``j`` only once ``q``'s result
    message ``j -`` :data:`AHEAD` is in: on the slowest link (:meth:`Grid.streams`) the
    flows to the owners stay level (TCP shares a bottleneck unevenly, and a flow left
    alone at the end speeds up only slowly), and none queues far ahead of the results
    coming back."""
    at = grid.at
    for q, j, a, b in grid.interleaved(ch.rank):
        if j >= AHEAD:
            await _result_in(results, q, j - AHEAD)
        await ch.send(q, inp[at[q] + a : at[q] + b], step=SCATTER_STEP, chunk=j)


async def _result_in(results: Results, q: int, j: int) -> None:
    """Wait until rank ``q``'s result message ``j`` is in."""
    await results.posted.wait()
    await results.of[q][j]


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
