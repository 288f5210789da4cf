"""One round of a heal's transfer: sources send their slices to joiners in chunks,
joiners receive from every source at once and check each slice's checksum.

A round is a list of :class:`Task`: slice ``i`` of the stream (:mod:`.stream`),
sent by rank ``source`` to ranks ``joiners``. A source sends its tasks in
order, each chunk to every joiner of its task (the same view: no copy per
joiner; its CRC-32 computed in a worker thread while those sends run), keeping
at most ``window`` messages per joiner in flight, and after its last chunk
sends each joiner the CRC-32 of every slice it sent it. A
joiner runs one receiver per source, all at once, each with ``window``
receives posted ahead (so at most ``sources * window`` chunks of memory held
besides the state), copies each chunk into the state and checks each slice's
CRC-32 against the source's (a chunk of another size than planned makes its
slice bad too, and is not written). Chunks of :data:`OFFLOAD` bytes or more are
checked and copied in a worker thread, while the event loop goes on receiving.
Messages travel on the communicator's ``send`` / ``recv`` with tags of their own
(:data:`DATA_TAG`, :data:`SUM_TAG`).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .stream import Stream, chunks

if TYPE_CHECKING:
    from ..comm import Communicator
    from ..operation import Work

#: p2p tags of a heal's messages (each (source, joiner, tag) is an ordered sequence of its own)
LAYOUT_TAG = 0x4EA1_0001
DATA_TAG = 0x4EA1_0002
SUM_TAG = 0x4EA1_0003

#: a slice's checksum, fed chunk by chunk (``checksum(chunk, crc so far)``): zlib's CRC-32,
#: about 2.4 GB/s on one core of the benchmark machine (bench/heal.py ``--checksum off``
#: measures a heal without it)
checksum: Callable[[memoryview, int], int] = zlib.crc32

#: chunks of at least this many bytes are checked and stored in a worker thread
OFFLOAD = 1 << 20

#: test hook: called with (slice, source, chunk) on a joiner before the chunk is checked
#: and stored (tests corrupt a chunk here); None in normal use
on_chunk: Callable[[int, int, np.ndarray], None] | None = None


@dataclass(frozen=True)
class Task:
    """Slice ``slice`` (``[start, end)`` of the stream), sent by ``source`` to ``joiners``."""

    slice: int
    start: int
    end: int
    source: int
    joiners: tuple[int, ...]


class Deadline:
    """One deadline over a whole heal: each call gets the seconds left (at least 1 ms,
    so a call after it times out at once with the collective's own timeout error)."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.at - time.monotonic(), 1e-3)


@dataclass(frozen=True)
class Round:
    """How a round moves its slices: chunk size, messages in flight per pair, the deadline,
    and whether slices are checksummed (``check``; else every checksum sent is 0)."""

    chunk_bytes: int
    window: int
    deadline: Deadline
    check: bool = True


async def _summed(how: Round, data: np.ndarray, crc: int) -> int:
    """``crc`` fed ``data``: in a worker thread for a big chunk (zlib releases the GIL), so the
    event loop goes on moving the chunks already issued; 0 when the round checks nothing."""
    if not how.check:
        return 0
    if data.nbytes >= OFFLOAD:
        return await asyncio.to_thread(checksum, data.data, crc)
    return checksum(data.data, crc)


async def send_round(comm: Communicator, stream: Stream, tasks: Sequence[Task], how: Round) -> None:
    """This source's part of a round: its tasks' chunks, then each joiner's checksums."""
    mine = [t for t in tasks if t.source == comm.rank]
    joiners = sorted({j for t in mine for j in t.joiners})
    inflight: deque[Work[None]] = deque()
    sums: dict[int, list[int]] = {j: [] for j in joiners}
    try:
        for t in mine:
            crc = 0
            for a, b in chunks(t.start, t.end, how.chunk_bytes):
                data = stream.read(a, b)
                for j in t.joiners:
                    inflight.append(comm.send(data, j, DATA_TAG, timeout=how.deadline.left()))
                crc = await _summed(how, data, crc)  # while the sends run
                while len(inflight) > how.window * len(t.joiners):
                    await inflight.popleft()
            for j in t.joiners:
                sums[j].append(crc)
        for j in joiners:
            inflight.append(comm.send(np.array(sums[j], np.int64), j, SUM_TAG, timeout=how.deadline.left()))
        while inflight:
            await inflight.popleft()
    finally:
        _cancel(inflight)


async def recv_round(comm: Communicator, stream: Stream, tasks: Sequence[Task], how: Round) -> list[Task]:
    """This joiner's part of a round, from every source at once: the tasks whose slice
    arrived with a checksum other than its source's."""
    mine = [t for t in tasks if comm.rank in t.joiners]
    sources = sorted({t.source for t in mine})
    got = await asyncio.gather(*(_from(comm, stream, [t for t in mine if t.source == s], how) for s in sources))
    return sorted((t for bad in got for t in bad), key=lambda t: t.slice)


async def _from(comm: Communicator, stream: Stream, tasks: list[Task], how: Round) -> list[Task]:
    """Receive ``tasks`` (all from one source, in its order), ``window`` receives ahead."""
    source = tasks[0].source
    plan = [(k, a, b) for k, t in enumerate(tasks) for a, b in chunks(t.start, t.end, how.chunk_bytes)]
    posted: deque[Work[Any]] = deque()
    crcs: list[int | None] = [0] * len(tasks)
    try:
        issued = 0
        for k, a, b in plan:
            while issued < len(plan) and len(posted) < how.window:
                posted.append(comm.recv(source, DATA_TAG, timeout=how.deadline.left()))
                issued += 1
            data = _flat(await posted.popleft())
            take = (tasks[k].slice, source, stream, a, b, data, crcs[k], how.check)
            # big chunks in a thread (zlib and numpy's copy release the GIL): the loop goes on receiving
            crcs[k] = await asyncio.to_thread(_take, *take) if data.nbytes >= OFFLOAD else _take(*take)
        sent = _flat(await comm.recv(source, SUM_TAG, timeout=how.deadline.left()))
    finally:
        _cancel(posted)
    theirs = sent.view(np.int64) if sent.nbytes == 8 * len(tasks) else None
    return [t for k, t in enumerate(tasks) if theirs is None or crcs[k] is None or int(theirs[k]) != crcs[k]]


def _take(
    slice_: int, source: int, stream: Stream, a: int, b: int, data: np.ndarray, crc: int | None, check: bool
) -> int | None:
    """Check and store one chunk meant for stream bytes ``[a, b)``: the slice's checksum so far,
    None (the slice is bad, nothing written) once a chunk of another size came."""
    if crc is None or data.nbytes != b - a:
        return None
    if on_chunk is not None:
        on_chunk(slice_, source, data)
    if check:
        crc = checksum(data.data, crc)
    stream.write(a, data)
    return crc


def _flat(x: Any) -> np.ndarray:
    """A received array as flat bytes (a message is sent as uint8 / int64 numpy arrays)."""
    arr = np.asarray(x)
    return arr.reshape(-1).view(np.uint8)


def _cancel(works: deque[Work[Any]]) -> None:
    for w in works:
        if not w.done():
            w.cancel()


__all__ = ["DATA_TAG", "LAYOUT_TAG", "SUM_TAG", "Deadline", "Round", "Task", "recv_round", "send_round"]
