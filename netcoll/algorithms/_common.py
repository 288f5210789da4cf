"""Shared plumbing for the algorithm modules (no networking of its own).

Vocabulary, as in Gloo's ``allreduce.cc``: a buffer is cut into *chunks*
(one per rank, for the ring algorithms) or *blocks* (the P equal parts of a
gather-style buffer), and every message is cut into *segments* of at most
``segment_bytes``. A segment is one :meth:`Channel.send`; its identity inside
the operation is ``(step, chunk)`` where ``chunk`` is the segment index.

Pieces (the checks every algorithm starts with are :mod:`._args`; how buffers are cut
and the scratch memory :mod:`._scratch`; the relay of broadcasts and point-to-point
messages :mod:`._relay`):

* :class:`RecvWindow` — receives a fixed sequence of messages in order while
  keeping the next ones *posted* (their destination buffers handed to the
  mailbox ahead of time, so payloads land in place). Its context manager
  cancels and drains whatever is still posted when the algorithm fails.
* :func:`exchange` / :func:`interleaved` — a pairwise exchange with sends run at most
  a window ahead of receives; :func:`fold_extra_ranks` — the ranks beyond a power of two.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from ..ops import Fold, ReduceOp, reduce_prechecked
from ._scratch import num_segments, split

if TYPE_CHECKING:
    from ..mesh.channel import Channel

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

Plan = Callable[[int], tuple[int, int, int, "np.ndarray | None"]]


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
