"""Partial all_reduce (``all_reduce(x, partial=True)``): the reduction over the ranks
that delivered by a deadline, agreed by every rank that returns it.

How it works (hivemind's averaging, with one decider):

1. *Exchange.* Each rank posts a receive from every other rank and sends its whole
   buffer to every other rank (staggered: rank ``r`` sends to ``r+1``, ``r+2``...), each
   send a task of its own, so a slow or dead peer holds up no other. A peer's
   contribution counts as *received* once all its segments are here.
2. *Collect.* The rank waits until every other rank is received or known lost (its
   link closed, it left, or it aborted the operation: the operation's ``tolerance``
   hook says so at once, :attr:`netcoll.operation.Operation.tolerance`) and its own
   sends are handed to the links, or the collection window (the deadline) passes,
   whichever is first. (Waiting for its own sends makes "my proposal includes me but
   my data never left" rare: a rank that dies after proposing has sent its data.)
3. *Propose and agree.* It proposes ``sorted(received + itself)`` to the decider
   (``decide(group id, seq, proposal)``: the coordinator's store, a set-once value per
   ``(group id incl. epoch, seq)``, :meth:`netcoll.rendezvous.store.Store.decide`). The
   first proposal to reach it wins and is what ``decide`` returns to every rank.
4. *Finish.* A rank not in the agreed set fails with
   :class:`~netcoll.errors.PartialExcluded`. A rank in it waits for the agreed
   contributions it lacks (they were sent; a slower link may still be bringing them)
   until each is here, or its sender is lost, or one more window has passed (then
   :class:`~netcoll.errors.PartialMismatch` naming it); it lets its own sends to the
   agreed ranks finish (also before failing so: the others need them), and folds the
   agreed contributions in rank order ``((x_a op x_b) op x_c) ...`` (``avg``: then
   divides by their number).

Correctness (every rank that returns returns the same bits and the same contributors):

* *One set.* The decider keeps the first proposal per key and returns it to every
  caller, so every rank past step 3 holds the same set ``W``.
* *One value.* A rank returns only once it holds every contribution of ``W`` whole
  (a receive completes only with all of a frame's bytes), each the sender's buffer as
  it was at the call (a sender folds into its buffer only after its sends to ``W``
  finished, and cancels only sends to ranks outside ``W``, which never return), and
  folds them in the one order ``W`` fixes: equal bits everywhere.
* *A rank dies before or while sending.* It is in a proposal only if its whole
  contribution reached that proposer; a rank of ``W`` that lacks it fails with
  ``PartialMismatch`` (after its sender's link is lost, or one more window) and never
  returns another value.
* *A rank dies in the middle of the agreement.* Before its proposal reached the decider:
  it proposed nothing, and the others' proposals decide. After: its proposal may have
  won; ``W`` is then what it had received, and the survivors proceed as in any other
  decision (each has ``W``'s data, or fails as above). The decision itself is the
  coordinator's alone (set once, atomically, on its event loop), so no two survivors
  see different decisions, whoever died when. If the decider itself is lost, every
  rank that has not decided fails with that error rather than decide alone.
* *A rank is late.* Its proposal comes after another's won: it is in ``W`` only if the
  winner's proposer had its whole contribution; otherwise it gets ``PartialExcluded``
  and returns nothing.
* *Liveness.* Every rank proposes at the latest when the window ends and the decider
  answers at once; the wait for missing agreed data is bounded by one more window.

Messages are those of one operation (one group id and seq), so nothing of another
call or epoch mixes in. The operation is *tolerant*: a lost or aborting member does not
fail it, and its failures here are not sent to the others (they go on without this
rank), except a cancel, which tells them this rank will not deliver.

Cost, ``P`` ranks, ``N`` bytes: ``(P-1) N`` bytes sent and received per rank (the ring
moves ``2 (P-1)/P N``: at 4 ranks this is 1.5 times its bytes, at 16 ranks 7.5 times),
``P N`` bytes of scratch, ``P-1`` reductions of ``N`` bytes, one step of latency plus
one round trip to the coordinator per call. Meant for model averaging at a few ranks
(local SGD, DiLoCo outer steps), not for every gradient step of a large group.

Bits: with every rank delivering, ``W`` is every rank and the fold order is rank
order, the same as ``algorithm="allpairs"``'s: the result is bit-identical to it (and
equal in value, up to float rounding order, to the other algorithms).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import resultpool
from ..errors import CollectiveError, PartialExcluded, PartialMismatch
from ..operation import Reason
from ..ops import ReduceOp, reduce_into
from ._args import reduction_args
from ._scratch import DEFAULT_SEGMENT_BYTES, num_segments, split

if TYPE_CHECKING:
    from ..mesh.channel import Channel, Decide

__all__ = ["Agreement", "all_reduce", "check_agreed"]

MIN_DECIDE_S = 1.0  # the decider's answer is waited for at least this long
FINISH_MARGIN_S = 1.0  # an agreed contribution still missing is given up this long before the call's limit


class Agreement:
    """One partial all_reduce on this rank: the members lost so far (world ranks, told
    by the operation's tolerance hook, which this object is) and, once agreed, the
    contributors (group ranks)."""

    __slots__ = ("gone", "changed", "contributors")

    def __init__(self) -> None:
        self.gone: set[int] = set()
        self.changed = asyncio.Event()
        self.contributors: tuple[int, ...] | None = None

    def __call__(self, world_rank: int) -> None:
        """World rank ``world_rank`` will not deliver (its link is lost, it aborted)."""
        self.gone.add(world_rank)
        self.changed.set()


def check_agreed(agreed: Any, size: int) -> tuple[int, ...]:
    """The decider's answer as a sorted tuple of distinct group ranks (ValueError otherwise)."""
    if not isinstance(agreed, (list, tuple)) or not agreed:
        raise ValueError(f"partial all_reduce: the decider answered {agreed!r}, not a list of ranks")
    ranks = tuple(agreed)
    if any(isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < size for p in ranks):
        raise ValueError(f"partial all_reduce: the decider answered {agreed!r}, not ranks of a group of {size}")
    if list(ranks) != sorted(set(ranks)):
        raise ValueError(f"partial all_reduce: the decider answered {agreed!r}, not sorted distinct ranks")
    return ranks


async def all_reduce(
    ch: Channel,
    buf: np.ndarray,
    op: ReduceOp | str,
    *,
    agreement: Agreement,
    decide: Decide,
    window: float,
    limit: float,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> tuple[int, ...]:
    """Partial all_reduce of ``buf`` in place (``avg`` left as a sum); the agreed contributors.

    Args:
        buf: C-contiguous, writeable array holding this rank's contribution, same shape
            and dtype on every rank; it receives the reduction over the contributors.
        op: the reduction.
        agreement: the operation's tolerance hook (what it learns of lost members).
        decide: the decider (see the module docstring).
        window: seconds to collect contributions before proposing (the deadline).
        limit: seconds the whole call may take (the decider's wait is bounded by it).
        segment_bytes: largest message payload (same on every rank).
    """
    rop, data = reduction_args(buf, op, segment_bytes)
    loop = asyncio.get_running_loop()
    start = loop.time()
    P, r = ch.size, ch.rank
    segs = split(data.size, num_segments(data.nbytes, segment_bytes))
    # scratch from the result pool: a loop of calls reuses it instead of page-faulting it in each time
    parts = {p: resultpool.empty(data.shape, data.dtype) for p in range(P) if p != r}
    posted = {p: [ch.post(p, step=0, chunk=j, out=parts[p][a:b]) for j, (a, b) in enumerate(segs)] for p in parts}
    for futs in posted.values():
        for fut in futs:
            fut.add_done_callback(lambda _: agreement.changed.set())
    sends = {p: asyncio.ensure_future(_send_all(ch, p, data, segs)) for p in ((r + k) % P for k in range(1, P))}
    for task in sends.values():
        task.add_done_callback(_retrieved)
        task.add_done_callback(lambda _: agreement.changed.set())
    try:
        await _collect(ch, agreement, posted, set(parts), start + window, sends)
        received = _received(posted)
        proposal = tuple(sorted({*received, r}))
        wait = max(start + limit - loop.time(), MIN_DECIDE_S)
        agreed = check_agreed(await decide(ch.op.group, ch.op.seq, proposal, wait), P)
        if r not in agreed:
            raise _aborted(
                PartialExcluded(
                    f"{ch.op.where()}: rank {r} was excluded from the partial all_reduce: the ranks agreed on "
                    f"{list(agreed)} before its contribution counted (it was late or its link failed)",
                    op=ch.op.name,
                    seq=ch.op.seq,
                    ranks=agreed,
                )
            )
        missing = {p for p in agreed if p != r and p not in received}
        if missing:  # sent to us too, maybe still on its way: one more window at most
            until = min(loop.time() + window, start + limit - FINISH_MARGIN_S)
            await _collect(ch, agreement, posted, missing, until)
            lacking = sorted(missing - _received(posted))
            if lacking:
                await _settle(sends, set(agreed))  # the other agreed ranks still need this rank's data
                raise _aborted(
                    PartialMismatch(
                        f"{ch.op.where()}: the partial all_reduce agreed on ranks {list(agreed)}, but the "
                        f"contribution of {', '.join(f'rank {p}' for p in lacking)} never reached rank {r} "
                        "(its link was lost first, or it did not arrive within one more window)",
                        op=ch.op.name,
                        seq=ch.op.seq,
                        ranks=lacking,
                    )
                )
        await _settle(sends, set(agreed))
        _fold(rop, data, parts, agreed, r)
        agreement.contributors = agreed
        return agreed
    finally:
        for task in sends.values():
            task.cancel()
        for p, futs in posted.items():
            for j, fut in enumerate(futs):
                if not fut.done():
                    ch.unpost(p, step=0, chunk=j)


async def _send_all(ch: Channel, peer: int, data: np.ndarray, segs: list[tuple[int, int]]) -> bool:
    """Send every segment to ``peer``; False if the peer was lost (it just does not get them)."""
    try:
        for j, (a, b) in enumerate(segs):
            await ch.send(peer, data[a:b], step=0, chunk=j)
    except ConnectionError:  # PeerLost: that rank is gone; its absence is the agreement's business
        return False
    return True


def _aborted(exc: CollectiveError) -> CollectiveError:
    """``exc`` with the reason of a collective that ended without this rank's result
    (:class:`~netcoll.operation.Reason` ``ABORTED``: logged at INFO, counted as aborted)."""
    exc.reason = Reason.ABORTED
    return exc


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A send task's failure is the operation's business (it ended): no "never retrieved" noise."""
    if not task.cancelled():
        task.exception()


def _received(posted: dict[int, list[asyncio.Future[Any]]]) -> set[int]:
    """The peers whose every segment has arrived."""
    return {p for p, futs in posted.items() if all(f.done() and not f.cancelled() and not f.exception() for f in futs)}


async def _collect(
    ch: Channel,
    agreement: Agreement,
    posted: dict[int, list[asyncio.Future[Any]]],
    wanted: set[int],
    until: float,
    sends: dict[int, asyncio.Task[bool]] | None = None,
) -> None:
    """Wait until every peer of ``wanted`` is received or lost and every task of ``sends``
    is done, or the loop time ``until`` passes; raise the operation's error if it failed."""
    loop = asyncio.get_running_loop()
    members = ch.op.members
    while True:
        if ch.op.failure is not None:
            raise ch.op.error  # type: ignore[misc]
        received = _received(posted)
        if all(p in received or members[p] in agreement.gone for p in wanted) and (
            sends is None or all(t.done() for t in sends.values())
        ):
            return
        left = until - loop.time()
        if left <= 0:
            return
        agreement.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(agreement.changed.wait(), left)


async def _settle(sends: dict[int, asyncio.Task[bool]], agreed: set[int]) -> None:
    """Let this rank's sends to the agreed ranks finish (they need them); stop the rest,
    whose receivers are excluded or gone, before the buffer is overwritten."""
    for p, task in sends.items():
        if p not in agreed:
            task.cancel()
    await asyncio.gather(*sends.values(), return_exceptions=True)


def _fold(rop: ReduceOp, data: np.ndarray, parts: dict[int, np.ndarray], agreed: tuple[int, ...], r: int) -> None:
    """``data`` = the agreed contributions folded in rank order (``avg``: summed). (This
    rank's sends are over: ``data`` may be folded into when it comes first.)"""
    first = agreed[0]
    acc = data if first == r else parts[first]
    for p in agreed[1:]:
        reduce_into(rop, acc, data if p == r else parts[p])
    if acc is not data:
        data[...] = acc
