"""Measuring a group's links for the cost model (:mod:`.cost`), over a Channel.

* :func:`probe` — four kinds of rounds, a few of each, every round one
  ``(terms, seconds)`` sample: a *token* of 8 B passed once around the ring
  (rank 0 sends first; ``P`` dependent hops: ``P`` steps, ``2P`` messages) —
  the step latency; a *stream*: each rank in turn sends 4 × 256 KiB to the next
  and waits for an ack while the others wait (2 steps, 6 messages, 1 MiB of
  ``solo`` bytes) — the rate of a tree's root; a *shift* of 1 MiB,
  every rank sending to ``r+1`` while receiving from ``r-1`` (1 step, 2
  messages, ``n`` bytes) — the bandwidth with every link busy; a *burst* of
  16 small messages each way (1 step, 32 messages) — the per-message cost.
  A least-squares fit separates the four parameters.
* :func:`rate` — this rank's own bandwidth: it exchanges :data:`RATE_BYTES` with a few
  partners in turn (a pairing per round, every pair at once), and takes its fastest
  partner's rate (what a pair moves is bounded by the slower of the two, so the
  fastest pair bounds this rank's own link from below, and is it when any partner is
  at least as fast). What :mod:`netcoll.algorithms.weighted` sizes its shares by.
* :func:`reduce_samples` — the local numpy reduction bandwidth (gamma), no network.
* :func:`exchange` — every rank's row of numbers to every rank (all pairs, one
  step): the table every rank then combines the same way.

Cost of :func:`probe`: about ``(3P + 2) (reps + 1)`` dependent steps; 2 MiB
``(reps + 1)`` bytes sent per rank. Of :func:`rate`: ``min(P, RATE_ROUNDS)`` rounds of
``RATE_REPS + 1`` exchanges of 1 MiB each way.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

import numpy as np

from ..ops import ReduceOp, reduce_into
from .cost import Terms

if TYPE_CHECKING:
    from ..mesh.channel import Channel

SIZES: Final = (8,)
STREAM: Final = 4
STREAM_BYTES: Final = 256 * 1024
SHIFT_BYTES: Final = 1024 * 1024
REPS: Final = 4
BURST: Final = 16
#: the step number of :func:`exchange`'s messages (after every probe step)
EXCHANGE_STEP: Final = 1 << 20
#: :func:`rate`: bytes each way per exchange, exchanges per partner (after one warm-up),
#: partners at most (a rank with one fast partner is measured right), and its first step
RATE_BYTES: Final = 1 << 20
RATE_REPS: Final = 2
RATE_ROUNDS: Final = 8
RATE_STEP: Final = 1 << 19

Sample = tuple[Terms, float]


async def probe(
    ch: Channel,
    *,
    sizes: tuple[int, ...] = SIZES,
    shift: int = SHIFT_BYTES,
    reps: int = REPS,
    burst: int = BURST,
) -> list[Sample]:
    """This rank's samples (see the module docstring); the first round of each
    kind is a warm-up and is not kept."""
    if ch.size < 2:
        return []
    p, right, left = ch.size, (ch.rank + 1) % ch.size, (ch.rank - 1) % ch.size
    out, into = np.zeros(max(*sizes, shift), np.uint8), np.empty(max(*sizes, shift), np.uint8)
    samples: list[Sample] = []
    step = 0
    for n in sizes:  # a token around the ring: P dependent hops per round
        for r in range(reps + 1):
            t0 = time.perf_counter()
            if ch.rank == 0:
                await ch.send(right, out[:n], step=step)
                await ch.recv(left, step=step, out=into[:n])
            else:
                await ch.recv(left, step=step, out=into[:n])
                await ch.send(right, out[:n], step=step)
            if r:
                samples.append(((float(p), 2.0 * p, 0.0, 0.0, float(p * n)), time.perf_counter() - t0))
            step += 1
    step = await _stream(ch, samples, out, into, step, reps)
    for r in range(reps + 1):  # every rank sends at once: the links' bandwidth under load
        t0 = time.perf_counter()
        fut = ch.post(left, step=step, out=into[:shift])
        await ch.send(right, out[:shift], step=step)
        await fut
        if r:
            samples.append(((1.0, 2.0, float(shift), 0.0, 0.0), time.perf_counter() - t0))
        step += 1
    small = np.zeros((burst, 8), np.uint8)
    for _ in range(reps):  # many small messages at once: the per-message cost
        t0 = time.perf_counter()
        futs = [ch.post(left, step=step, chunk=k, out=small[k]) for k in range(burst)]
        for k in range(burst):
            await ch.send(right, out[:8], step=step, chunk=k)
        for f in futs:
            await f
        samples.append(((1.0, 2.0 * burst, 8.0 * burst, 0.0, 0.0), time.perf_counter() - t0))
        step += 1
    return samples


async def _stream(ch: Channel, samples: list[Sample], out: np.ndarray, into: np.ndarray, step: int, reps: int) -> int:
    """Each rank in turn streams ``STREAM`` messages of ``STREAM_BYTES`` to the next
    and waits for its ack while the others wait (the root of a tree): sender and
    receiver overlap, so a round is 2 steps, ``k+2`` messages and ``k n`` solo bytes.
    Returns the next free step number."""
    p, right, left = ch.size, (ch.rank + 1) % ch.size, (ch.rank - 1) % ch.size
    k, n = STREAM, STREAM_BYTES
    ack = np.zeros(8, np.uint8)
    for r in range(reps + 1):
        for turn in range(p):
            if ch.rank == turn:
                t0 = time.perf_counter()
                for j in range(k):
                    await ch.send(right, out[:n], step=step, chunk=j)
                await ch.recv(right, step=step, chunk=k, out=ack)
                if r:
                    samples.append(((2.0, k + 2.0, 0.0, 0.0, float(k * n)), time.perf_counter() - t0))
            elif ch.rank == (turn + 1) % p:
                for j in range(k):
                    await ch.recv(left, step=step, chunk=j, out=into[:n])
                await ch.send(left, ack, step=step, chunk=k)
            step += 1
    return step


def reduce_samples(nbytes: int = 1 << 20, reps: int = 3) -> list[Sample]:
    """Local samples of gamma: ``reduce_into(sum)`` of two float32 arrays of ``nbytes``."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones(nbytes // 4, np.float32)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        reduce_into(ReduceOp.SUM, a, b)
        best = min(best, time.perf_counter() - t0)
    return [((0.0, 0.0, 0.0, float(a.nbytes), 0.0), best)]


def partner(rank: int, round_: int, size: int) -> int | None:
    """Round ``round_``'s partner of ``rank``: ``round_ - rank`` (mod ``size``), so every pair
    meets in round ``(i + j) % size``, once over ``size`` rounds; None: no partner this round."""
    other = (round_ - rank) % size
    return None if other == rank else other


async def rate(ch: Channel, *, nbytes: int = RATE_BYTES, reps: int = RATE_REPS, rounds: int = RATE_ROUNDS) -> float:
    """This rank's bandwidth in bytes per second (see the module docstring): the most
    ``nbytes`` over the seconds of an exchange (both ways at once) with any partner,
    the fastest of ``reps`` exchanges after a warm-up. 0.0 in a group of one."""
    if ch.size < 2:
        return 0.0
    out, into = np.zeros(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    best, step = 0.0, RATE_STEP
    for k in range(min(ch.size, rounds)):
        peer = partner(ch.rank, k, ch.size)
        for r in range(reps + 1):
            step += 1
            if peer is None:
                continue
            t0 = time.perf_counter()
            got = ch.post(peer, step=step, out=into)
            await ch.send(peer, out, step=step)
            await got
            seconds = time.perf_counter() - t0
            if r and seconds > 0:
                best = max(best, nbytes / seconds)
    return best


async def exchange(ch: Channel, row: np.ndarray) -> np.ndarray:
    """Every rank's ``row`` (float64, the same length everywhere), stacked by rank."""
    table = np.empty((ch.size, row.size), np.float64)
    table[ch.rank] = row
    posted = [ch.post(p, step=EXCHANGE_STEP, out=table[p]) for p in range(ch.size) if p != ch.rank]
    mine = np.ascontiguousarray(row, np.float64)
    for k in range(1, ch.size):
        await ch.send((ch.rank + k) % ch.size, mine, step=EXCHANGE_STEP)
    for fut in posted:
        await fut
    return table


__all__ = [
    "RATE_BYTES",
    "RATE_REPS",
    "RATE_ROUNDS",
    "RATE_STEP",
    "BURST",
    "EXCHANGE_STEP",
    "REPS",
    "SHIFT_BYTES",
    "SIZES",
    "STREAM",
    "STREAM_BYTES",
    "exchange",
    "partner",
    "probe",
    "rate",
    "reduce_samples",
]
