"""Receive-side routing shared by every mesh: frames to operations (no
sockets here, and no failure rules: what a frame means for an operation is
decided by :class:`~netcoll.operation.Operation`).

Incoming DATA frames are keyed by ``(group, seq)`` — one operation — and,
inside it, by ``(src, step, chunk)``. The engine opens an operation when it
starts running and closes it when done.

Routing:

1. A frame whose operation is open and whose slot has a posted buffer is
   written straight into that buffer (the link asks :meth:`sink` for it
   before reading the payload).
2. A frame for an operation not yet opened is held, and handed to it when it
   opens; a frame for an operation that was opened and has since closed is
   dropped. Which have closed is recorded (:class:`Finished`), not inferred
   from the order they opened in: operations in flight open in whatever order
   their tasks run (an awaited Work runs inline, before earlier ones).
3. An ABORT for an operation not yet opened is kept for it; one for an
   operation that already *succeeded* here (a broadcast root finishes before
   its receivers notice a mismatch) fails the group's next operation, so no
   rank carries on alone, unless it says the operation was cancelled: a
   result this rank has is right, and the communicator stays usable.
4. A frame of another *epoch* of the group (a regroup made a new one: its
   group id is ``"<name>/e<epoch>"``, :mod:`netcoll.groupids`) for no operation
   open here is dropped and counted per sender in :attr:`Mailbox.stale`: no
   result of an old epoch is ever mixed into the new one.
5. A crashed peer fails every open operation it is a member of, and every
   later operation that includes it fails at open; one that left in order
   (BYE) fails only operations still waiting for data from it.

Hooks for links (flow control; see ``docs/protocol.md``):

* :attr:`released` ``(src, nbytes)`` is called exactly once for every DATA
  payload (of ``nbytes > 0``) for which :meth:`sink` returned ``None`` — a
  payload in a buffer of its own, *held* here — when the mailbox stops
  holding it: it was copied into a posted buffer, handed to a receive posted
  without one, or dropped. Payloads written straight into a posted buffer
  are never reported (credit them when the frame completes).
* :meth:`when_posted` tells a link when a receive is posted for a slot (to
  answer a sender's request to send); :meth:`watch` ties a future (a send
  waiting for credit) to an operation, so it fails with it.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

from ..errors import CollectiveError, CommunicatorClosed, LimitExceeded, MismatchError, PeerLost
from ..groupids import epoch_of
from ..operation import Failure, Operation, Reason, SlotKey, State
from ..ops import Fold

SNAPSHOT_OPS = 16  # operations one heartbeat reports at most
SUCCEEDED_KEPT = 64  # recent successful operations remembered per group (for late aborts)
FAREWELL_MAX = 1024  # characters of the failure a BYE carries (a control frame: small header)
Early = tuple[int, dict[str, Any], memoryview]


class Mailbox:
    """Routes DATA and ABORT frames of one mesh to operations."""

    def __init__(self, rank: int) -> None:
        self.rank = rank  # world rank of this process
        self.ops: dict[tuple[str, int], Operation] = {}
        #: group -> one more than the highest seq opened (for the arrival board)
        self.next_seq: dict[str, int] = {}
        #: group -> the seqs of its operations that have closed here
        self.finished: dict[str, Finished] = {}
        self.early: dict[tuple[str, int], list[Early]] = {}
        self.early_aborts: dict[tuple[str, int], dict[str, Any]] = {}
        self.early_rts: dict[tuple[str, int], list[tuple[SlotKey, Callable[[bool], None]]]] = {}
        self.dead: dict[int, BaseException] = {}
        self.departed: set[int] = set()  # the dead that said BYE: what they sent still counts
        self.early_bytes = 0
        #: the epoch of the group this mailbox's mesh was made for (frames of others are stale)
        self.epoch = 0
        #: src -> frames of another epoch dropped (see the module doc)
        self.stale: dict[int, int] = {}
        #: recent operations that succeeded here, per group (seq -> name)
        self.succeeded: dict[str, collections.OrderedDict[int, str]] = {}
        #: group -> an ABORT that arrived for one of them
        self.late_aborts: dict[str, dict[str, Any]] = {}
        #: src -> the operation whose posted buffer src's current payload is being written into
        self.filling: dict[int, Operation] = {}
        #: set by a mesh that writes payloads in place: stop src's current in-place write
        self.divert: Callable[[int], None] | None = None
        #: set by a mesh with flow control: ``released(src, nbytes)`` (see the module doc)
        self.released: Callable[[int, int], None] | None = None
        #: set by a mesh that keeps state per operation: called as each one closes
        self.on_close: Callable[[Operation], None] | None = None
        #: set by a mesh that answers a peer's timeout: ``asked(src, header, op)`` for
        #: every TIMEOUT ABORT, after it is routed (``op``: the operation open here, or None)
        self.asked: Callable[[int, dict[str, Any], Operation | None], None] | None = None
        #: how the operation closed last here failed (None: it succeeded), for :meth:`farewell`
        self.last_failure: str | None = None
        self._direct: set[int] = set()  # srcs whose current payload goes into a posted buffer
        self._rank_of: dict[tuple[int, ...], dict[int, int]] = {}  # members -> {world rank: group rank}

    # -- operation lifecycle (the engine) ----------------------------------------------
    def open(
        self,
        group: str,
        seq: int,
        fp: str,
        members: tuple[int, ...],
        name: str,
        loop: asyncio.AbstractEventLoop | None = None,
        labels: dict[int, int] | None = None,
        tolerance: Callable[[int], None] | None = None,
    ) -> Operation:
        """Open and start operation ``(group, seq)``: it receives what arrived for it
        (``labels``: the ranks its messages name; ``tolerance``: a tolerant operation's
        hook for missing members, :attr:`Operation.tolerance`)."""
        key = (group, seq)
        if key in self.ops:
            raise RuntimeError(f"operation {key} is already open")
        rank_of = self._rank_of.get(members) or self._group_ranks(members)
        op = Operation(group, seq, fp, members, name, rank_of, loop, self._release, labels)
        op.state = State.RUNNING
        op.tolerance = tolerance
        self.ops[key] = op
        if seq >= self.next_seq.get(group, 0):
            self.next_seq[group] = seq + 1
        if self.early_aborts:  # first: an abort names the cause (a rank lost may be its echo)
            abort = self.early_aborts.pop(key, None)
            if abort is not None:
                op.on_abort(abort, op.me(self.rank))
        if self.dead:
            for w in members:
                if w in self.dead and w not in self.departed:
                    op.lost(w, str(self.dead[w]), graceful=False)
        if self.late_aborts:
            self._apply_late_abort(op)
        if self.early:
            for src, header, payload in self.early.pop(key, ()):
                self.early_bytes -= payload.nbytes
                op.deliver(src, header, payload, held=True)
        if self.early_rts:
            for slot, callback in self.early_rts.pop(key, ()):
                op.when_posted(slot, callback)
        return op

    def snapshot(self, limit: int = SNAPSHOT_OPS) -> dict[str, Any]:
        """What this rank is in, for the coordinator's arrival board (called from the
        heartbeat thread: it reads copies, made atomically under the GIL):
        ``{rank, ops: [[group, seq, name, fp, seconds running, members, waiting for,
        seconds since it last received, world ranks waited for]], next: {group: next seq}}``,
        at most ``limit`` operations (the oldest)."""
        now = time.monotonic()
        try:
            ops = sorted(self.ops.copy().values(), key=lambda op: op.opened)[:limit]
            rows = [
                [
                    op.group,
                    op.seq,
                    op.name,
                    op.fp,
                    round(now - op.opened, 3),
                    list(op.members),
                    op.waiting_for(),
                    round(max(now - op.moved, 0.0), 3),
                    list(op.waiting_world()),
                ]
                for op in ops
            ]
            groups = {op.group for op in ops}
            nxt = self.next_seq.copy()
            groups.update(sorted(nxt, key=lambda g: nxt[g], reverse=True)[: max(0, limit - len(groups))])
        except RuntimeError:  # changed while read (another thread): the next beat tells
            return {"rank": self.rank, "ops": [], "next": {}}
        return {"rank": self.rank, "ops": rows, "next": {g: nxt.get(g, 0) for g in groups}}

    def close(self, op: Operation) -> None:
        """The engine is done with ``op``: stop in-place writes into its buffers."""
        if self.ops.pop((op.group, op.seq), None) is not None:
            finished = self.finished.get(op.group)
            if finished is None:
                finished = self.finished[op.group] = Finished()
            finished.add(op.seq)
        if self.filling:
            for src in [s for s, o in self.filling.items() if o is op]:
                del self.filling[src]  # the caller gets its buffer back: no more bytes into it
                if self.divert is not None:
                    self.divert(src)
        op.close()
        if self.on_close is not None:
            self.on_close(op)
        self.last_failure = None if op.failure is None else op.failure.message[:FAREWELL_MAX]
        if op.state is State.SUCCEEDED:
            done = self.succeeded.setdefault(op.group, collections.OrderedDict())
            done[op.seq] = op.name
            if len(done) > SUCCEEDED_KEPT:
                done.popitem(last=False)

    def farewell(self) -> dict[str, Any]:
        """The header of this rank's BYE: the failure it leaves after, if the operation
        closed last here failed (a peer still waiting in the same operation then says
        why this rank left, not only that it did)."""
        return {} if self.last_failure is None else {"why": self.last_failure}

    def take(
        self, op: Operation, key: SlotKey, out: memoryview | None, fold: Fold | None = None
    ) -> asyncio.Future[Any]:
        """Post a receive for ``key`` of ``op`` (see :meth:`Operation.take`)."""
        self._from_dead(op, key)
        return op.take(key, out, fold)

    def _from_dead(self, op: Operation, key: SlotKey) -> None:
        """A receive from a peer already lost (nothing of it arrived) fails ``op`` now."""
        if key[0] in self.dead and key not in op.arrived and op.state is State.RUNNING:
            op.lost(key[0], str(self.dead[key[0]]), graceful=False)

    def take_either(self, op: Operation, keys: tuple[SlotKey, ...], out: memoryview | None) -> asyncio.Future[Any]:
        """Post one receive for whichever of ``keys`` comes first (:meth:`Operation.take_either`):
        it fails now only if every sender is lost already (one that left in order may well
        be the one that was never going to send)."""
        if all(k[0] in self.dead and k not in op.arrived for k in keys):
            self._from_dead(op, keys[0])
        return op.take_either(keys, out)

    # -- the links' side --------------------------------------------------------------
    def sink(self, src: int, header: dict[str, Any], nbytes: int) -> memoryview | None:
        """Where the payload of an incoming DATA frame should be written: a
        posted buffer of exactly ``nbytes``, or ``None`` (the link
        allocates, and the payload is *held* until :attr:`released`)."""
        op = self.ops.get((header["g"], header["q"]))
        if op is None or header["f"] != op.fp:
            return None
        slot = op.posted.get((src, header["s"], header["c"]))
        if slot is None or slot[1] is None or slot[1].nbytes != nbytes:
            return None
        self.filling[src] = op
        self._direct.add(src)
        return slot[1]

    def fold(self, src: int, header: dict[str, Any]) -> Fold | None:
        """The ``ops.Fold`` posted with the receive that :meth:`sink` just gave
        a buffer for, or None: a link that reads the payload in place may
        reduce it into the fold's output instead of filling that buffer."""
        op = self.filling.get(src)
        return None if op is None else op.fold_for((src, header["s"], header["c"]))

    def lends(self, header: dict[str, Any]) -> bool:
        """Whether the DATA about to be sent with ``header`` may be lent (:attr:`Operation.lends_from`)."""
        op = self.ops.get((header["g"], header["q"]))
        return op is not None and header["s"] >= op.lends_from

    def syncs(self, header: dict[str, Any]) -> bool:
        """Whether the DATA about to be sent with ``header`` waits for its receive (:attr:`Operation.sync_from`)."""
        op = self.ops.get((header["g"], header["q"]))
        return op is not None and header["s"] >= op.sync_from

    def deliver(self, src: int, header: dict[str, Any], payload: memoryview) -> None:
        """A whole DATA frame from world rank ``src``."""
        self.filling.pop(src, None)
        held = src not in self._direct
        self._direct.discard(src)
        key = (header["g"], header["q"])
        op = self.ops.get(key)
        if op is not None:
            op.deliver(src, header, payload, held)
        elif self._stale(src, key[0]):
            if held:
                self._release(src, payload.nbytes)
        elif not self._finished(*key):
            self.early.setdefault(key, []).append((src, header, payload))
            self.early_bytes += payload.nbytes
        elif held:  # a late frame of a finished (or failed) operation: drop it
            self._release(src, payload.nbytes)

    def on_abort(self, src: int, header: dict[str, Any]) -> None:
        key = (header["g"], header["q"])
        op = self.ops.get(key)
        if op is not None:
            op.on_abort(header, op.me(self.rank))
        elif self._stale(src, key[0]):
            return
        elif not self._finished(*key):
            self.early_aborts.setdefault(key, header)
        elif header["q"] in self.succeeded.get(header["g"], {}) and header["cause"] != Reason.CANCELLED.value:
            self.late_aborts.setdefault(header["g"], header)  # (a late cancel changes nothing: ours is right)
        if self.asked is not None and header["cause"] == Reason.TIMEOUT.value:
            self.asked(src, header, op)

    def peer_lost(self, peer: int, cause: BaseException | None = None, graceful: bool = False) -> None:
        """``peer``'s link is gone (see :meth:`Operation.lost`)."""
        self.dead.setdefault(peer, cause or ConnectionError("connection closed"))
        if graceful:
            self.departed.add(peer)
        for op in list(self.ops.values()):
            op.lost(peer, str(self.dead[peer]), graceful, self.dead)

    def fail_all(self, error: Callable[[Operation], BaseException]) -> None:
        """Fail every open operation with ``error(op)`` (a mesh closing or dying)."""
        for op in list(self.ops.values()):
            exc = error(op)
            op.fail(Failure(_reason_of_error(exc), str(exc), tuple(getattr(exc, "ranks", ()))))

    # -- hooks for links ----------------------------------------------------------------
    def when_posted(self, src: int, header: dict[str, Any], callback: Callable[[bool], None]) -> None:
        """``callback(True)`` once a receive is posted for the slot of DATA
        header ``header`` from ``src`` (now, if it is); ``callback(False)`` if
        its operation ends (or has ended) first."""
        key, slot = (header["g"], header["q"]), (src, header["s"], header["c"])
        op = self.ops.get(key)
        if op is not None:
            op.when_posted(slot, callback)
        elif not self._finished(*key) and not self._stale(src, key[0]):
            self.early_rts.setdefault(key, []).append((slot, callback))
        else:
            callback(False)

    def unwait(self, src: int, header: dict[str, Any], callback: Callable[[bool], None]) -> None:
        """Forget ``callback`` given to :meth:`when_posted` for this header (if not yet called)."""
        key, slot = (header["g"], header["q"]), (src, header["s"], header["c"])
        op = self.ops.get(key)
        if op is not None:
            op.unwait(slot, callback)
            return
        early = self.early_rts.get(key)
        if early is not None and (slot, callback) in early:
            early.remove((slot, callback))
            if not early:
                del self.early_rts[key]

    def watch(self, group: str, seq: int, fut: asyncio.Future[Any]) -> None:
        """Fail ``fut`` with operation ``(group, seq)``'s error if it ends first
        (at once if it is not open)."""
        op = self.ops.get((group, seq))
        if op is not None:
            op.watch(fut)
        elif not fut.done():
            fut.set_exception(CommunicatorClosed(f"operation #{seq} of group {group!r} is not open"))
            fut.exception()

    # -- internals ----------------------------------------------------------------------
    def _stale(self, src: int, group: str) -> bool:
        """Whether a frame of ``group`` belongs to another epoch (then it is counted)."""
        if (self.epoch == 0 and "/" not in group) or epoch_of(group) == self.epoch:
            return False
        self.stale[src] = self.stale.get(src, 0) + 1
        return True

    def _finished(self, group: str, seq: int) -> bool:
        done = self.finished.get(group)
        return done is not None and seq in done

    def _release(self, src: int, nbytes: int) -> None:
        if self.released is not None and nbytes:
            self.released(src, nbytes)

    def _group_ranks(self, members: tuple[int, ...]) -> dict[int, int]:
        rank_of = self._rank_of.get(members)
        if rank_of is None:
            if len(self._rank_of) > 256:
                self._rank_of.clear()
            rank_of = self._rank_of[members] = {w: r for r, w in enumerate(members)}
        return rank_of

    def _apply_late_abort(self, op: Operation) -> None:
        late = self.late_aborts.pop(op.group, None)
        if late is None or op.failure is not None:
            return
        r = op.me(late["origin"])
        earlier = self.succeeded.get(op.group, {}).get(late["q"], "collective")
        op.fail_with(
            Reason.ABORTED,
            f"{op.where()} not started: {earlier} #{late['q']} failed on rank {r} after "
            f"this rank had finished its part ({late['cause']}: {late['reason']})",
            (r,),
        )


class Finished:
    """The sequence numbers of one group's operations that have closed: every seq
    below :attr:`below`, and those in :attr:`above` (closed while an earlier one
    was still open or not yet opened: at most the operations in flight)."""

    __slots__ = ("below", "above")

    def __init__(self) -> None:
        self.below = 0
        self.above: set[int] = set()

    def add(self, seq: int) -> None:
        if seq != self.below:
            if seq > self.below:
                self.above.add(seq)
            return
        self.below += 1
        above = self.above
        while above and self.below in above:
            above.remove(self.below)
            self.below += 1

    def __contains__(self, seq: int) -> bool:
        return seq < self.below or seq in self.above


def _reason_of_error(exc: BaseException) -> Reason:
    reason = getattr(exc, "reason", None)
    if isinstance(reason, Reason):
        return reason
    if isinstance(exc, PeerLost):
        return Reason.PEER_LOST
    if isinstance(exc, CommunicatorClosed):
        return Reason.CLOSED
    if isinstance(exc, MismatchError):
        return Reason.MISMATCH
    if isinstance(exc, LimitExceeded):
        return Reason.LIMIT
    if isinstance(exc, CollectiveError):
        return Reason.ERROR
    return Reason.ERROR
