"""The pieces of a compressed all_reduce (:mod:`.compressed`): which elements of every shard
each piece holds (:func:`pieces`, :func:`schedule`) and how many run at once (:func:`run`).

A *tapered* schedule starts and ends with smaller pieces: ``taper`` pieces of ``1/2**taper``,
..., ``1/2`` of a full piece at each end (each a multiple of
:data:`~netcoll.compression.INT8_BLOCK` elements, rounded down, at least one block), so the
links carry the first piece's bytes sooner and the last piece's result is decoded sooner
after the last bytes arrive. Every piece starts at a multiple of ``INT8_BLOCK``, so every
piece's encoding is that part of its whole shard's (the bits of one piece). Shards too short
for the ramps (under ``2 x`` their sum plus a full piece) are cut evenly.

:func:`run` keeps up to ``window`` pieces in their exchange (step 1) and up to ``depth``
pieces under way in all: a piece whose exchange is done makes room for the next one while
its all_gather still runs (with one window over whole pieces, the next piece waited for the
oldest's all_gather: the links idled between waves of pieces).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

from ..compression import INT8_BLOCK

__all__ = ["pieces", "run", "schedule"]


def pieces(bounds: list[tuple[int, int]], size: int, taper: int = 0) -> list[list[tuple[int, int]]]:
    """The shards ``bounds`` cut into pieces: piece ``j`` holds elements ``x_j`` to ``y_j`` of
    every shard (:func:`schedule` of the longest shard; ``size`` rounded down to a multiple of
    :data:`INT8_BLOCK`, at least one block)."""
    size = max(INT8_BLOCK, size // INT8_BLOCK * INT8_BLOCK)
    longest = max(b - a for a, b in bounds)
    return [[(min(a + x, b), min(a + y, b)) for a, b in bounds] for x, y in schedule(longest, size, taper)]


def schedule(longest: int, size: int, taper: int = 0) -> list[tuple[int, int]]:
    """Consecutive ranges covering ``0..longest`` exactly, each starting at a multiple of
    :data:`INT8_BLOCK`: ``taper`` growing pieces, full pieces of ``size`` (a multiple of
    ``INT8_BLOCK``; the last full one may be shorter), ``taper`` shrinking pieces ending at
    ``longest`` (the last one up to a block longer than its share); no ramps where
    ``longest`` is under twice their sum plus ``size``."""
    ramp = [max(INT8_BLOCK, (size >> t) // INT8_BLOCK * INT8_BLOCK) for t in range(taper, 0, -1)]
    if longest < 2 * sum(ramp) + size:
        ramp = []
    cuts = [0]
    for n in ramp:
        cuts.append(cuts[-1] + n)
    tail = [longest]  # the shrinking pieces' starts, from the end
    for n in ramp:
        tail.append((tail[-1] - n) // INT8_BLOCK * INT8_BLOCK)
    while tail[-1] - cuts[-1] > size:
        cuts.append(cuts[-1] + size)
    cuts += tail[::-1] if tail[-1] > cuts[-1] else tail[-2::-1]
    return list(itertools.pairwise(cuts)) or [(0, longest)]


Piece = Callable[[int, Callable[[], None]], Awaitable[None]]


async def run(count: int, piece: Piece, window: int, depth: int) -> None:
    """``piece(j, exchanged)`` for ``j`` in ``0..count-1``, in order: up to ``window`` of them
    before their call of ``exchanged()`` (which each makes once, after its exchange, whether
    it succeeded or not) and up to ``max(window, depth)`` in all; the first failure raises
    once every piece before it is done (the rest are cancelled)."""
    window = max(1, window)
    depth = max(window, depth)
    exchanging = asyncio.Semaphore(window)
    running: list[asyncio.Future[None]] = []
    try:
        for j in range(count):
            if len(running) >= depth:
                await running.pop(0)
            await exchanging.acquire()
            running.append(asyncio.ensure_future(piece(j, exchanging.release)))
        while running:
            await running.pop(0)
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
