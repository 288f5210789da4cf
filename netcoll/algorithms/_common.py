"""Shared plumbing for the algorithm modules (no networking of its own).

Vocabulary, as in Gloo's ``allreduce.cc``: a buffer is cut into *chunks*
(one per rank, for the ring algorithms) or *blocks* (the P equal parts of a
gather-style buffer), and every message is cut into *segments* of at most
``segment_bytes``. A segment is one :meth:`Channel.send`; its identity inside
the operation is ``(step, chunk)`` where ``chunk`` is the segment index.

Pieces:

* :func:`flat` / :func:`as_u8` — checked 1-D views of caller buffers.
* :func:`split` / :func:`num_segments` — how every rank cuts the same buffer
  the same way (a pure function of sizes, so senders and receivers agree
  without talking).
* :class:`RecvWindow` — receives a fixed sequence of messages in order while
  keeping the next ones *posted* (their destination buffers handed to the
  mailbox ahead of time, so payloads land in place). Its context manager
  cancels and drains whatever is still posted when the algorithm fails.
* :func:`relay` — the segmented, pipelined "receive from one, forward to some"
  used by both broadcasts and by point-to-point messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from .. import ranks, resultpool
from ..errors import MismatchError
from ..ops import Fold, ReduceOp, check_op_dtype, parse_op, reduce_prechecked

if TYPE_CHECKING:
    from ..mesh.channel import Channel

#: Largest payload of one message, unless a call says otherwise (Gloo's
#: ``kMaxSegmentSize``). Every rank of one operation must use the same value.
#: Measured: 4 MiB beats 1 MiB and 256 KiB at 2, 4, 8 ranks (2026-11; git history of benchmarks.md).
DEFAULT_SEGMENT_BYTES: Final = 4 << 20

#: Receives kept posted ahead of the one being consumed, for streams whose
#: destinations are distinct slices of the user buffer (no scratch reuse).
#: A payload only lands in place if its receive was posted before it
#: arrived, and senders run ahead of receivers, so this is generous.
RELAY_WINDOW: Final = 64

#: :func:`exchange` keeps this many receives posted and runs its sends at most
#: EXCHANGE_LAG segments ahead of its receives (:func:`interleaved`), so it never
#: waits on the receive window for progress.
EXCHANGE_DEPTH: Final = 4 * RELAY_WINDOW
EXCHANGE_LAG: Final = RELAY_WINDOW

#: Reducing algorithms receive into scratch segment buffers used round-robin;
#: at least this many, so two receives stay posted while one is reduced.
MIN_SCRATCH_SEGMENTS: Final = 3
#: ... and at most this many bytes of them, however many they would want.
SCRATCH_BUDGET_BYTES: Final = 32 << 20

Plan = Callable[[int], tuple[int, int, int, "np.ndarray | None"]]


def check_segment_bytes(segment_bytes: int) -> int:
    if isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int) or segment_bytes < 1:
        raise ValueError(f"segment_bytes must be a positive int, got {segment_bytes!r}")
    return segment_bytes


def flat(buf: Any, name: str = "buf", *, writeable: bool = True) -> np.ndarray:
    """A 1-D view (never a copy) of the C-contiguous ndarray ``buf``."""
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, not {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if writeable and not buf.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return buf.reshape(-1)


def as_u8(buf: Any, name: str = "buf", *, writeable: bool = True) -> np.ndarray:
    """A flat ``uint8`` view (never a copy) of the C-contiguous ndarray ``buf``."""
    return flat(buf, name, writeable=writeable).view(np.uint8)


def own_input(src: Any, data: np.ndarray, what: str) -> np.ndarray | None:
    """``src`` as a flat read-only view, checked to be a reduction's own input
    beside its result ``data`` (same dtype and size, not overlapping: the
    algorithm reads this rank's contribution there and writes ``data``); None
    stays None (the contribution is ``data``'s initial contents)."""
    if src is None:
        return None
    mine = flat(src, "src", writeable=False)
    if mine.dtype != data.dtype or mine.size != data.size or np.may_share_memory(mine, data):
        raise ValueError(f"{what}: src must match buf in size and dtype and not overlap it")
    return mine


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` bounds of ``parts`` nearly equal pieces of ``range(n)``
    (the first ``n % parts`` pieces are one longer, like ``np.array_split``)."""
    q, rem = divmod(n, parts)
    bounds = []
    start = 0
    for i in range(parts):
        stop = start + q + (1 if i < rem else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def num_segments(nbytes: int, segment_bytes: int) -> int:
    """Segments needed to move ``nbytes`` in pieces of at most ``segment_bytes``
    (at least one, so that even an empty message is a message)."""
    return max(1, -(-nbytes // segment_bytes))


def scratch_depth(want: int, segment_nbytes: int) -> int:
    """How many scratch segments (= receives posted ahead) to use: ``want``,
    clamped to ``[MIN_SCRATCH_SEGMENTS, SCRATCH_BUDGET_BYTES / segment]``."""
    cap = max(MIN_SCRATCH_SEGMENTS, SCRATCH_BUDGET_BYTES // max(1, segment_nbytes))
    return max(MIN_SCRATCH_SEGMENTS, min(want, cap))


def slice_segments(segments: int, segment_nbytes: int) -> int:
    """How many of each chunk's ``segments`` a ring reduction runs at once (a *slice*;
    NCCL loops over a large buffer the same way): at most the scratch budget less two,
    so that a slice's ``S+2`` receives posted ahead cover a whole step. With a whole
    chunk at once and fewer receives posted, a rank's next-step send waits for a
    receive its neighbour posts only after receiving more from this rank: a cycle once
    the receive window is full (issue 38: 300 MiB at 4 ranks, 64 MiB window)."""
    return max(1, min(segments, scratch_depth(segments + 2, segment_nbytes) - 2))


class _ScratchPool:
    """Reusable scratch memory for the algorithms of this process. Fresh large
    arrays cost a page fault per 4 KiB on first touch, every call; pooled ones
    are already mapped. Buffers are taken for one algorithm run and given back."""

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self.free: list[np.ndarray] = []
        self.lock = threading.Lock()  # event loops in several threads may share the process

    def take(self, nbytes: int) -> np.ndarray:
        with self.lock:
            fits = [i for i, b in enumerate(self.free) if b.nbytes >= nbytes]
            if fits:
                return self.free.pop(min(fits, key=lambda i: self.free[i].nbytes))
        return np.empty(nbytes, dtype=np.uint8)

    def after_fork(self) -> None:
        """In a forked child: a new lock (another thread may have held the old one)."""
        self.lock = threading.Lock()

    def give(self, buf: np.ndarray) -> None:
        with self.lock:
            self.free.append(buf)
            self.free.sort(key=lambda b: -b.nbytes)
            while sum(b.nbytes for b in self.free) > self.keep_bytes:
                self.free.pop(0)  # drop the largest first


SCRATCH_POOL: Final = _ScratchPool(keep_bytes=2 * SCRATCH_BUDGET_BYTES)
os.register_at_fork(after_in_child=SCRATCH_POOL.after_fork)


@contextlib.contextmanager
def scratch(depth: int, count: int, dtype: Any) -> Iterator[list[np.ndarray]]:
    """``depth`` scratch arrays of ``count`` elements of ``dtype``, from the pool."""
    dt = np.dtype(dtype)
    seg = count * dt.itemsize
    raw = SCRATCH_POOL.take(depth * seg)
    try:
        yield [raw[i * seg : (i + 1) * seg].view(dt) for i in range(depth)]
    finally:
        SCRATCH_POOL.give(raw)


def reduction_args(buf: Any, op: Any, segment_bytes: int) -> tuple[ReduceOp, np.ndarray]:
    """The checks every reducing algorithm starts with: ``(op, flat view of buf)``."""
    rop = parse_op(op)
    check_segment_bytes(segment_bytes)
    data = flat(buf)
    check_op_dtype(rop, data.dtype)
    return rop, data


def reduce_scatter_args(
    ch: Channel, buf: Any, op: Any, out: Any, segment_bytes: int
) -> tuple[ReduceOp, np.ndarray, np.ndarray]:
    """The checks every reduce_scatter starts with: ``(op, flat read-only view of
    buf, flat view of out)``; buf is ``P`` blocks of out's size, same dtype, apart."""
    rop = parse_op(op)
    check_segment_bytes(segment_bytes)
    data = flat(buf, writeable=False)
    dst = flat(out, "out")
    check_op_dtype(rop, dst.dtype)
    P = ch.size
    if data.size % P or dst.size != data.size // P:
        raise ValueError(f"reduce_scatter: buf has {data.size} elements, not {P} blocks of out's {dst.size}")
    if dst.dtype != data.dtype:
        raise TypeError(f"reduce_scatter: out is {dst.dtype} but buf is {data.dtype}")
    if dst.size and np.may_share_memory(dst, data):
        raise ValueError("reduce_scatter: out must not overlap buf")
    return rop, data, dst


def all_to_all_args(
    ch: Channel, send: Any, recv: Any, segment_bytes: int
) -> tuple[np.ndarray, np.ndarray, int, list[tuple[int, int]]]:
    """The checks and setup every (even) all_to_all starts with: ``(uint8 view of
    send, uint8 view of recv, block bytes, the segments of one block)``, with this
    rank's own block already copied from ``send`` to ``recv``."""
    check_segment_bytes(segment_bytes)
    src = as_u8(send, "send", writeable=False)
    dst = as_u8(recv, "recv")
    P, r = ch.size, ch.rank
    if src.nbytes != dst.nbytes or src.nbytes % P:
        raise ValueError(
            f"all_to_all: send ({src.nbytes} bytes) and recv ({dst.nbytes} bytes) "
            f"must be {P} equal blocks of the same size"
        )
    if np.may_share_memory(src, dst) and src.nbytes:
        raise ValueError("all_to_all: send and recv must not overlap")
    block = src.nbytes // P
    dst[r * block : (r + 1) * block] = src[r * block : (r + 1) * block]
    return src, dst, block, split(block, num_segments(block, segment_bytes))


def gather_args(ch: Channel, buf: Any, segment_bytes: int, what: str) -> tuple[np.ndarray, int]:
    """The checks every all-gather starts with: ``(uint8 view of buf, block bytes)``."""
    check_segment_bytes(segment_bytes)
    data = as_u8(buf)
    if data.nbytes % ch.size:
        raise ValueError(f"{what} buffer of {data.nbytes} bytes is not {ch.size} equal blocks")
    return data, data.nbytes // ch.size


def where(ch: Channel) -> dict[str, Any]:
    """``op``/``seq`` keywords for errors raised by an algorithm on ``ch``."""
    op = getattr(ch, "op", None)
    return {"op": getattr(op, "name", None), "seq": getattr(op, "seq", None)}


def check_root(ch: Channel, root: int) -> int:
    return ranks.check_root(root, ch.size)


class RecvWindow:
    """Receive messages ``0..count-1`` in order, keeping up to ``depth`` posted.

    ``plan(i)`` gives ``(peer, step, chunk, out)`` for message ``i``; ``out``
    (or ``None`` for a fresh buffer) is where its payload lands. When
    :meth:`get` is called for ``i`` the caller is done with message ``i-1``,
    so message ``i-1+depth`` is posted then: ``depth`` scratch buffers used
    round-robin (``scratch[i % depth]``) are therefore safe, and while the
    caller works on message ``i``, ``depth-1`` receives are on the wire.

    Receives are posted synchronously (:meth:`Channel.post`), so a payload
    that arrives after the post lands in place; one that arrived before is
    buffered by the mailbox and copied once. Receives still posted when the
    algorithm fails are failed with the operation by the mailbox.
    """

    __slots__ = ("ch", "count", "depth", "futures", "plan", "posted", "fold", "folds")

    def __init__(
        self, ch: Channel, plan: Plan, count: int, depth: int, fold: Callable[[int], Fold | None] | None = None
    ) -> None:
        self.ch, self.plan, self.count, self.depth = ch, plan, count, max(1, depth)
        self.futures: dict[int, asyncio.Future[tuple[memoryview, dict[str, Any]]]] = {}
        self.posted = 0  # messages 0..posted-1 have been posted
        #: ``fold(i)``: the reduction message ``i`` is for, which a link may do as it
        #: arrives (None: that message is only received)
        self.fold = fold
        self.folds: dict[int, Fold | None] = {}

    def _post_until(self, stop: int) -> None:
        stop = min(stop, self.count)
        while self.posted < stop:
            i = self.posted
            peer, step, chunk, out = self.plan(i)
            fold = None
            if self.fold is not None:
                fold = self.folds[i] = self.fold(i)
            self.futures[i] = self.ch.post(peer, step=step, chunk=chunk, out=out, fold=fold)
            self.posted += 1

    def folded(self, i: int) -> bool:
        """Whether the link already reduced message ``i`` (call after :meth:`get`)."""
        fold = self.folds.pop(i, None)
        return fold is not None and fold.complete

    async def start(self) -> None:
        """Post the first ``depth`` receives (before the caller starts sending)."""
        self._post_until(self.depth)

    async def get(self, i: int) -> tuple[memoryview, dict[str, Any] | None]:
        """Wait for message ``i`` (``(payload, meta)``); calls must go 0, 1, 2, ..."""
        self._post_until(i + self.depth)
        payload, header = await self.futures.pop(i)
        return payload, header.get("m")

    async def __aenter__(self) -> RecvWindow:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for fut in self.futures.values():  # left over only when the algorithm failed
            if fut.done() and not fut.cancelled():
                fut.exception()
        self.futures.clear()


async def drain(tasks: Any) -> None:
    """Cancel and await ``tasks`` (their outcomes are dropped: the operation
    has already failed, or they are done)."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


Send = tuple[int, np.ndarray, "dict[str, Any] | None"]  # (group rank, data, meta)


async def send_each(ch: Channel, sends: Sequence[Send], *, step: int | Sequence[int], chunk: int) -> None:
    """Send each ``(peer, data, meta)`` (distinct peers; ``step`` one for all, or one per
    send) and return when all are sent: one after the other, or all at once (a task each)
    if a link lends one (:meth:`Channel.lends`): such a send returns only once its peer has
    read it, and the peers then read at once."""
    steps = [step] * len(sends) if isinstance(step, int) else step
    each = [(p, d, m, s) for (p, d, m), s in zip(sends, steps, strict=True)]
    if len(each) < 2 or not any(ch.lends(p, d.nbytes, step=s) for p, d, _, s in each):
        for peer, data, meta, s in each:
            await ch.send(peer, data, step=s, chunk=chunk, meta=meta)
        return
    await gather_all([asyncio.ensure_future(ch.send(p, d, step=s, chunk=chunk, meta=m)) for p, d, m, s in each])


async def gather_all(tasks: Sequence[asyncio.Future[Any]]) -> list[Any]:
    """Await every task; on the first failure cancel the rest and re-raise it."""
    try:
        return [await t for t in tasks]
    except BaseException:
        await drain(tasks)
        raise


class Reduction:
    """What :func:`exchange` does with what it receives: ``out = own op incoming``
    (``incoming op own`` with ``incoming_first``), segment by segment. ``out``
    may be ``own`` (an accumulator) or the receive buffer itself; a link that
    reads payloads in pieces (shared memory; TCP from 2 MiB) folds each segment as it arrives
    (:class:`~netcoll.ops.Fold`), any other fills the receive buffer and the
    reduction runs here. The same bits either way. :func:`exchange` keeps the
    reduction here when ``out`` overlaps what it sends (a fold as the payload
    arrives would change bytes not yet sent) or the link would not fold a
    payload of that size (:meth:`Channel.folds`: then a fold is not even described)."""

    __slots__ = ("op", "out", "own", "incoming_first")

    def __init__(self, op: ReduceOp, out: np.ndarray, own: np.ndarray, *, incoming_first: bool = False) -> None:
        self.op, self.out, self.own, self.incoming_first = op, out, own, incoming_first

    def fold(self, a: int, b: int) -> Fold:
        """The fold of elements ``[a:b]``, for a receive posted with it."""
        return Fold(self.op, self.out[a:b], self.own[a:b], incoming_first=self.incoming_first)

    def apply(self, incoming: np.ndarray, a: int, b: int) -> None:
        """Reduce the received elements ``[a:b]`` (of the receive buffer ``incoming``,
        an array of ``out``'s dtype that the algorithm made) here."""
        own, inc = self.own[a:b], incoming[a:b]
        if inc.dtype != own.dtype:  # (a bug in an algorithm, not a peer's doing)
            raise TypeError(f"receive buffer is {inc.dtype}, the reduction's operands {own.dtype}")
        if self.incoming_first:
            reduce_prechecked(self.op, self.out[a:b], inc, own)
        else:
            reduce_prechecked(self.op, self.out[a:b], own, inc)


async def exchange(
    ch: Channel,
    peer: int,
    step: int,
    send: np.ndarray | None,
    recv: np.ndarray | None,
    segment_bytes: int,
    fold: Reduction | None = None,
) -> None:
    """Send ``send`` to ``peer`` and/or receive ``recv`` from it, each cut into
    segments by its own size (the peer cuts the same sizes the same way), the
    receives posted before anything is sent. With ``fold`` each received
    segment ``[a:b]`` is reduced as :class:`Reduction` says, by the link as it
    arrives where it can (``recv[a:b]`` is then left as it was), else here."""
    if fold is not None and (
        recv is None
        or not ch.folds(peer, min(recv.nbytes, segment_bytes))
        or (send is not None and np.may_share_memory(fold.out, send))
    ):
        linked = None  # reduced here: the link would not fold it, or what it writes is still being sent
    else:
        linked = fold
    if recv is not None and recv.nbytes <= segment_bytes and (send is None or send.nbytes <= segment_bytes):
        folding = None if linked is None else linked.fold(0, recv.size)
        got = ch.post(peer, step=step, chunk=0, out=recv, fold=folding)  # one message each way: every small call
        if send is not None:
            await ch.send(peer, send, step=step, chunk=0)
        await got
        if fold is not None and (folding is None or not folding.complete):
            fold.apply(recv, 0, recv.size)
        return
    rsegs = [] if recv is None else split(recv.size, num_segments(recv.nbytes, segment_bytes))

    def plan(j: int) -> tuple[int, int, int, np.ndarray]:
        a, b = rsegs[j]
        return peer, step, j, recv[a:b]  # type: ignore[index]

    def folds(j: int) -> Fold | None:
        return None if linked is None else linked.fold(*rsegs[j])

    ssegs = [] if send is None else split(send.size, num_segments(send.nbytes, segment_bytes))
    async with RecvWindow(ch, plan, len(rsegs), EXCHANGE_DEPTH, folds if linked is not None else None) as window:
        await window.start()

        async def put(k: int) -> None:
            a, b = ssegs[k]
            await ch.send(peer, send[a:b], step=step, chunk=k)  # type: ignore[index]

        async def get(j: int) -> None:
            await window.get(j)
            if fold is not None and not window.folded(j):
                fold.apply(recv, *rsegs[j])  # type: ignore[arg-type]

        await interleaved(len(ssegs), put, len(rsegs), get)


async def interleaved(
    nsend: int, send: Callable[[int], Awaitable[None]], nrecv: int, recv: Callable[[int], Awaitable[None]]
) -> None:
    """``send(k)`` for ``k < nsend`` and ``recv(j)`` for ``j < nrecv`` (through a
    :class:`RecvWindow` of at least ``EXCHANGE_LAG + 1``), the sends at most
    ``EXCHANGE_LAG`` ahead of the receives. When every rank sends this way to a
    rank that receives this way, every message is posted before it is sent beyond
    the window, whatever the window: a rank stuck in a send would be waiting for a
    peer that has received no more than was already sent to it. (All the sends
    first deadlocks once the two sides have each sent past what the other posted.)"""
    for k in range(nsend):
        await send(k)
        if EXCHANGE_LAG <= k < nrecv + EXCHANGE_LAG:
            await recv(k - EXCHANGE_LAG)
    for j in range(max(0, nsend - EXCHANGE_LAG), nrecv):
        await recv(j)


def power_of_two_below(n: int) -> int:
    """The largest power of two ``<= n`` (``n >= 1``)."""
    return 1 << (n.bit_length() - 1)


async def fold_extra_ranks(
    ch: Channel,
    data: np.ndarray,
    op: ReduceOp,
    final_step: int,
    segment_bytes: int,
    core: Callable[[], Awaitable[None]],
) -> None:
    """Run ``core`` (an all_reduce of ``data`` among the first ``P'`` ranks,
    ``P'`` the largest power of two ``<= P``, using steps ``1..final_step-1``)
    on any ``P``: each extra rank ``r >= P'`` first hands its data to
    ``r-P'``, which folds it in (``mine op theirs``, step 0), and afterwards
    gets the result back from it (``final_step``)."""
    P, r = ch.size, ch.rank
    p2 = power_of_two_below(P)
    if r >= p2:
        await exchange(ch, r - p2, 0, data, None, segment_bytes)
        await exchange(ch, r - p2, final_step, None, data, segment_bytes)
        return
    if r + p2 < P:
        theirs = np.empty_like(data)
        await exchange(ch, r + p2, 0, None, theirs, segment_bytes, Reduction(op, data, data))
        del theirs
    await core()
    if r + p2 < P:
        await exchange(ch, r + p2, final_step, data, None, segment_bytes)


async def relay(
    ch: Channel,
    src: int | None,
    dsts: Sequence[int],
    buf: np.ndarray | None,
    meta: dict[str, Any] | None,
    *,
    step: int,
    segment_bytes: int,
    what: str = "broadcast",
    first: tuple[memoryview, dict[str, Any] | None] | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Receive one segmented message from ``src`` and forward every segment to
    each of ``dsts`` as soon as it has arrived (the pipelined core of the chain
    and tree broadcasts and of point-to-point messages). ``first``: segment 0's
    payload and meta, already received from ``src`` (:mod:`.sized` waits for it
    from either of two senders).

    ``src is None`` means this rank originates the message: ``buf`` is sent,
    with ``meta`` (plus ``"nbytes"``) in the header of segment 0. Otherwise
    ``buf`` is the destination — its byte size must equal the sender's, else
    :class:`MismatchError` — or ``None``, and a ``uint8`` buffer of
    ``meta["nbytes"]`` bytes is allocated once segment 0 has told us the size.
    Segment boundaries depend only on the byte size and ``segment_bytes``.

    Returns ``(buf, meta)``: the (possibly new) buffer and the origin's meta.
    """
    check_segment_bytes(segment_bytes)
    if src is None:
        if buf is None:
            raise ValueError(f"{what}: the sending rank must pass a buffer")
        data = as_u8(buf, writeable=False)
        meta = dict(meta or {})
        if meta.setdefault("nbytes", data.nbytes) != data.nbytes:
            raise ValueError(f"{what}: meta['nbytes'] = {meta['nbytes']} but the buffer has {data.nbytes} bytes")
        segs = split(data.nbytes, num_segments(data.nbytes, segment_bytes))
        for j, (a, b) in enumerate(segs):
            m = meta if j == 0 else None
            await send_each(ch, [(d, data[a:b], m) for d in dsts], step=step, chunk=j)
        return buf, meta

    got_meta: dict[str, Any] | None = None
    if buf is None or first is not None:
        # The size is unknown until segment 0 arrives: take it unposted (one
        # copy of at most one segment), then post the rest in place.
        payload, got_meta = first if first is not None else await ch.recv_meta(src, step=step, chunk=0)
        data, segs = _first_segment(ch, src, buf, payload, _nbytes_of(ch, got_meta, what), segment_bytes, what)
        buf = data if buf is None else buf
        a, b = segs[0]
        await send_each(ch, [(d, data[a:b], got_meta) for d in dsts], step=step, chunk=0)
        first_left = 1
    else:
        data = as_u8(buf)
        segs = split(data.nbytes, num_segments(data.nbytes, segment_bytes))
        first_left = 0

    def plan(i: int) -> tuple[int, int, int, np.ndarray]:
        a, b = segs[i + first_left]
        return src, step, i + first_left, data[a:b]

    async with RecvWindow(ch, plan, len(segs) - first_left, RELAY_WINDOW) as window:
        await window.start()
        for i in range(len(segs) - first_left):
            j = i + first_left
            _, m = await window.get(i)
            if j == 0:
                got_meta = m
                nbytes = _nbytes_of(ch, got_meta, what)
                if nbytes != data.nbytes:
                    raise MismatchError(
                        f"{what}: rank {src} sends {nbytes} bytes but this rank's buffer has {data.nbytes}",
                        ranks=(src, ch.rank),
                        **where(ch),
                    )
            a, b = segs[j]
            m = got_meta if j == 0 else None
            await send_each(ch, [(d, data[a:b], m) for d in dsts], step=step, chunk=j)
    assert got_meta is not None
    return buf, got_meta


def _first_segment(
    ch: Channel, src: int, buf: np.ndarray | None, payload: memoryview, nbytes: int, segment_bytes: int, what: str
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The destination bytes (``buf``'s, or a new result buffer of the sender's ``nbytes``)
    with segment 0 in place, and the segments: a MismatchError when ``buf``'s size or
    segment 0's is not the sender's."""
    if buf is None:
        data = resultpool.empty((nbytes,), np.uint8)  # a result: reuses a dropped one's memory
    else:
        data = as_u8(buf)
        if nbytes != data.nbytes:
            raise MismatchError(
                f"{what}: rank {src} sends {nbytes} bytes but this rank's buffer has {data.nbytes}",
                ranks=(src, ch.rank),
                **where(ch),
            )
    segs = split(nbytes, num_segments(nbytes, segment_bytes))
    a, b = segs[0]
    if payload.nbytes != b - a:
        raise MismatchError(
            f"{what}: segment 0 has {payload.nbytes} bytes, expected {b - a} (ranks disagree on segment_bytes?)",
            ranks=(src,),
            **where(ch),
        )
    seg0 = data[a:b]
    got = np.frombuffer(payload, dtype=np.uint8)
    if got.size and got.__array_interface__["data"][0] != seg0.__array_interface__["data"][0]:
        seg0[...] = got  # (a receive posted into this very segment needs no copy)
    return data, segs


def _nbytes_of(ch: Channel, meta: dict[str, Any] | None, what: str) -> int:
    n = None if meta is None else meta.get("nbytes")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise MismatchError(f"{what}: the first segment carries no valid meta['nbytes'] ({meta!r})", **where(ch))
    return n
