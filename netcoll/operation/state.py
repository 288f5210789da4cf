"""One operation on this rank: its state, posted receives, what arrived
early, and the rules that decide what a frame or an event means for it."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Container
from typing import Any, Final

from ..errors import CollectiveClosed
from ..ops import Fold
from ..waits import MAX_OP, Wait, op_name
from .reasons import Failure, Reason, State, detail, reason_of

SlotKey = tuple[int, int, int]  # (src world rank, step, chunk)
#: operations whose sends are not lent to a peer on this host (:attr:`Operation.lends_from`)
#: unless their algorithm says from which step they may be: the reductions, and the cost
#: model's calibration (it measures the ring, which they use)
RING_ONLY = frozenset({"all_reduce", "reduce", "reduce_scatter", "calibrate"})
NO_STEP: Final = sys.maxsize  # (no step is that late)
Release = Callable[[int, int], None]  # (src world rank, payload bytes) no longer held
WAIT_RANKS_MAX: Final = 64  # ranks an ABORT's wait (``w``) names at most
_now = time.monotonic


def _ranks(ranks: Any) -> str:
    return ", ".join(f"rank {r}" for r in ranks)


class Operation:
    """One collective (or one point-to-point message) on this rank: its
    state, its posted receives, what arrived early, and its failure."""

    __slots__ = (
        "group",
        "seq",
        "fp",
        "members",
        "name",
        "rank_of",
        "labels",
        "state",
        "failure",
        "error",
        "arrived",
        "posted",
        "folds",
        "reports",
        "waiters",
        "rts",
        "opened",
        "moved",
        "blocked",
        "lends_from",
        "sync_from",
        "tolerance",
        "_loop",
        "_release",
    )

    def __init__(
        self,
        group: str,
        seq: int,
        fp: str,
        members: tuple[int, ...],
        name: str,
        rank_of: dict[int, int] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        release: Release | None = None,
        labels: dict[int, int] | None = None,
    ) -> None:
        self.group, self.seq, self.fp, self.members, self.name = group, seq, fp, members, name
        self.rank_of = rank_of if rank_of is not None else {w: r for r, w in enumerate(members)}
        #: world rank -> the rank users know it by, where that is not its place in
        #: ``members`` (a send/recv's pair: the communicator's ranks, not 0 and 1)
        self.labels = labels
        self.state = State.ISSUED
        self.failure: Failure | None = None
        #: the error users see (a typed CollectiveError, or the ValueError/TypeError a body raised)
        self.error: Exception | None = None
        #: payloads that arrived before their receive was posted, and whether they are
        #: held (in a buffer of their own: released to the link when taken or dropped)
        self.arrived: dict[SlotKey, tuple[memoryview, dict[str, Any], bool]] = {}
        self.posted: dict[SlotKey, tuple[asyncio.Future[Any], memoryview | None]] = {}
        #: posted receives that a link may reduce as their payload arrives (``ops.Fold``; made when needed)
        self.folds: dict[SlotKey, Fold] | None = None
        #: group rank -> what it was waiting for when it timed out or was told so (made when needed)
        self.reports: dict[int, Wait] | None = None
        #: futures (a link's wait for credit, say) failed with the operation (made when needed)
        self.waiters: list[asyncio.Future[Any]] | None = None
        #: slot -> callbacks waiting for a receive to be posted there (a sender's RTS; made when needed)
        self.rts: dict[SlotKey, list[Callable[[bool], None]]] | None = None
        self.opened = _now()  # for the arrival board (how long it has been running)
        #: when a receive of this operation last completed here (or when it opened): a wait whose
        #: operation still receives is slow, not stuck (:mod:`netcoll.waits`)
        self.moved = self.opened
        #: on failure, the world ranks it was still waiting for, for how long it had received
        #: nothing, and how long it had run (:meth:`wait_field`)
        self.blocked: tuple[tuple[int, ...], float, float] | None = None
        #: the first step whose large sends may be *lent*: a peer on this host reads them in
        #: place (``links/cma.py``) and the send returns once it has. 0 for operations that only
        #: move data; a reduction's ranks mostly reduce while their peers would be reading, and
        #: its sends are faster copied into the ring (docs/performance.md, "One copy instead of
        #: two"), unless its algorithm says otherwise (:meth:`~netcoll.mesh.channel.Channel.lend_from`:
        #: the ring all_reduce, measured faster lent).
        self.lends_from = NO_STEP if name in RING_ONLY else 0
        #: the first step whose large sends are *synchronous*: they wait until the peer has
        #: posted the receive (a rendezvous) instead of going eagerly into its memory. No step
        #: by default; an algorithm whose ranks would otherwise run ahead of a busier receiver
        #: says from which step (:meth:`~netcoll.mesh.channel.Channel.sync_from`: a gather's
        #: and a tree reduce's non-roots, measured faster that way).
        self.sync_from = NO_STEP
        #: a *tolerant* operation's (a partial all_reduce's) hook: ``tolerance(world rank)`` is
        #: called instead of failing the operation when that member's link is lost or it
        #: aborts the operation; its algorithm decides what a missing member means. None: the
        #: operation fails (the rule of every other operation)
        self.tolerance: Callable[[int], None] | None = None
        self._loop = loop or asyncio.get_running_loop()
        self._release = release

    def __repr__(self) -> str:
        return f"<Operation {self.where()} {self.state.value}>"

    def where(self) -> str:
        return f"{self.name} #{self.seq} of group {self.group!r}"

    def short(self) -> str:
        """``"all_reduce #3"``: how a wait chain names it."""
        return f"{self.name} #{self.seq}"

    def me(self, world_rank: int) -> int:
        """The rank messages and errors name for ``world_rank``."""
        if self.labels is not None:
            return self.labels.get(world_rank, world_rank)
        return self.rank_of.get(world_rank, world_rank)

    # -- life -----------------------------------------------------------------------
    def start(self) -> None:
        if self.state is State.ISSUED:
            self.state = State.RUNNING

    def succeed(self) -> None:
        if self.failure is None:
            self.state = State.SUCCEEDED

    def fail(self, failure: Failure) -> bool:
        """Fail the operation for ``failure`` unless it already ended (the first
        cause wins); every posted receive and waiter raises its error."""
        if self.failure is not None or self.state is State.SUCCEEDED:
            return False
        if self.posted:
            now = _now()
            self.blocked = (self.waiting_world(), now - self.moved, now - self.opened)
        self.failure, self.state = failure, State.FAILED
        exc = self.error = failure.error(self)
        for fut, _ in self.posted.values():
            _set_exception(fut, exc)
        self.posted.clear()
        if self.waiters:
            for fut in self.waiters:
                _set_exception(fut, exc)
            self.waiters = None
        if self.rts:
            self._end_rts()
        return True

    def fail_with(self, reason: Reason, message: str, ranks: Any = (), **kw: Any) -> bool:
        return self.fail(Failure(reason, message, tuple(ranks), **kw))

    def close(self) -> None:
        """The operation's caller is done with it: drop what it holds. A
        successful operation that still has receives posted never waited for
        them, so they fail (CLOSED)."""
        if self.arrived:
            for key, (payload, _, held) in self.arrived.items():
                if held:
                    self._released(key[0], payload)
            self.arrived.clear()
        if self.posted:
            self.fail_with(Reason.CLOSED, f"{self.where()} was closed with receives still posted")
        elif self.failure is None:
            self.state = State.SUCCEEDED
        if self.waiters:
            for fut in self.waiters:
                _set_exception(fut, CollectiveClosed(f"{self.where()} is finished", op=self.name, seq=self.seq))
            self.waiters = None
        if self.rts:
            self._end_rts()

    # -- the receive side (called by algorithms through a Channel) -----------------------
    def take(self, key: SlotKey, out: memoryview | None, fold: Fold | None = None) -> asyncio.Future[Any]:
        """Future of ``(payload, header)`` for slot ``key``; ``out`` (if given)
        receives the payload bytes, or ``fold`` (over a buffer
        of ``out``'s size) reduces them, if the link can and the payload has not
        arrived yet (:meth:`fold_for`)."""
        fut: asyncio.Future[Any] = self._loop.create_future()
        if self.state is not State.RUNNING:
            _set_exception(
                fut, self.error or CollectiveClosed(f"{self.where()} is not running", op=self.name, seq=self.seq)
            )
            return fut
        got = self.arrived.pop(key, None)
        if got is None:
            if fold is not None and out is not None:
                if self.folds is None:
                    self.folds = {}
                self.folds[key] = fold
            self._post(key, fut, out)
            return fut
        payload, header, held = got
        self.moved = _now()
        if held:
            self._released(key[0], payload)
        if out is not None:
            if payload.nbytes != out.nbytes:
                self._size_mismatch(key, header, payload.nbytes, out.nbytes)
                _set_exception(fut, self.error)  # type: ignore[arg-type]
                return fut
            out[:] = payload
            payload = out
        fut.set_result((payload, header))
        return fut

    def take_either(self, keys: tuple[SlotKey, ...], out: memoryview | None) -> asyncio.Future[Any]:
        """One future of ``(payload, header)`` for whichever of ``keys`` arrives first (its
        header's step and sender tell which): posted under every key, so the first message
        completes it at no more cost than one receive. The others are then the caller's to
        :meth:`withdraw`; if another came too, it is ignored."""
        for key in keys:
            if key in self.arrived:
                return self.take(key, out)
        fut = self.take(keys[0], out)
        if not fut.done():
            for key in keys[1:]:
                self._post(key, fut, out)
        return fut

    def _post(self, key: SlotKey, fut: asyncio.Future[Any], out: memoryview | None) -> None:
        """``fut`` waits at slot ``key``; a sender waiting for that receive (RTS) may go."""
        self.posted[key] = (fut, out)
        if self.rts:
            for callback in self.rts.pop(key, ()):
                callback(True)

    def withdraw(self, key: SlotKey) -> None:
        """Forget the receive posted for ``key``, whose message will not come (an algorithm
        posted receives from two possible senders and heard from the other): its future is
        cancelled, so closing the operation does not count it as missed. Nothing when it is
        not posted (delivered already, or the operation ended)."""
        slot = self.posted.pop(key, None)
        if self.folds is not None:
            self.folds.pop(key, None)
        if slot is not None and slot[0] not in (f for f, _ in self.posted.values()):
            slot[0].cancel()  # (a future still posted under another key stays)

    def fold_for(self, key: SlotKey) -> Fold | None:
        """The fold posted with the receive ``key`` (taken: a link applies it at most once)."""
        return None if self.folds is None else self.folds.pop(key, None)

    # -- what frames and events mean (called by the mailbox) -----------------------------
    def deliver(self, src: int, header: dict[str, Any], payload: memoryview, held: bool) -> None:
        """A DATA frame for this operation arrived from world rank ``src``.
        ``held``: the payload is in a buffer of its own (not a posted one), so
        its bytes count as held until a receive takes it."""
        if self.state is not State.RUNNING and self.state is not State.ISSUED:
            if held:
                self._released(src, payload)
            return
        if header["f"] != self.fp:
            if held:
                self._released(src, payload)
            self.fail_with(
                Reason.MISMATCH,
                f"mismatched collectives at {self.where()}: rank {self.me(src)} "
                f"called {header['f']} but this rank called {self.fp}",
                (self.me(src),),
            )
            return
        key = (src, header["s"], header["c"])
        slot = self.posted.pop(key, None)
        if slot is None:
            # (not held: written into a buffer posted for this slot whose receive has
            # since gone, which cannot happen while the operation runs; keep a copy)
            self.arrived[key] = (payload, header, True) if held else (memoryview(bytearray(payload)), header, False)
            return
        fut, out = slot
        self.moved = _now()
        if held:
            self._released(src, payload)
        if out is not None and out is not payload:
            if out.nbytes != payload.nbytes:
                self._size_mismatch(key, header, payload.nbytes, out.nbytes)
                _set_exception(fut, self.error)  # type: ignore[arg-type]  # (popped: fail() did not see it)
                return
            out[:] = payload
            payload = out
        if not fut.done():
            fut.set_result((payload, header))

    def on_abort(self, header: dict[str, Any], me: int) -> None:
        """Member ``header['origin']`` failed this operation and says why (a timeout:
        what it waits for, kept in :attr:`reports`). A tolerant operation is told the
        member is missing instead (:attr:`tolerance`)."""
        if self.tolerance is not None:
            if self.state is State.RUNNING or self.state is State.ISSUED:
                self.tolerance(header["origin"])
            return
        r = self.me(header["origin"])
        cause = reason_of(header["cause"])
        ranks = tuple(header.get("ranks") or (r,))
        told: tuple[Wait, ...] = ()
        if cause is Reason.TIMEOUT:
            if self.reports is None:
                self.reports = {}
            report = self.reports[r] = self.told_wait(r, header)
            told = (report,)
        waiting = tuple(self.waiting_for())
        also = ""
        if waiting and cause is Reason.TIMEOUT:
            also = f" (rank {me} itself was waiting for {_ranks(waiting)})"
            now = _now()
            told = (Wait(me, self.short(), waiting, now - self.moved, now - self.opened), *told)
        reason = cause if cause in (Reason.MISMATCH, Reason.CANCELLED) else Reason.ABORTED
        told_why = detail(header["reason"], self.where())  # the sender's words without its "<op> failed: "
        self.fail(
            Failure(
                reason,
                f"{self.where()} aborted by rank {r} ({header['cause']}): {told_why}{also}",
                waiting if also else ranks,
                told=True,
                waiting=waiting if also else (),
                waits=told,
            )
        )

    def told_wait(self, r: int, header: dict[str, Any]) -> Wait:
        """What rank ``r``'s timeout ABORT says it waits for: in the operation its ``w``
        names (world ranks, shown as this operation names them), else in this one
        (``ranks``, from a sender that names no operation)."""
        w = header.get("w")
        if w is None:
            return Wait(r, self.short(), tuple(header.get("ranks") or ()), None)
        op = op_name(w["n"][:MAX_OP], w["q"], w["g"][:MAX_OP], self.group)
        return Wait(r, op, tuple(self.me(x) for x in w["r"]), float(w["s"]), float(w["a"]))

    def waiting_world(self) -> tuple[int, ...]:
        """World ranks this operation is currently blocked on (at most :data:`WAIT_RANKS_MAX`)."""
        return tuple(sorted({src for (src, _, _) in self.posted.copy()})[:WAIT_RANKS_MAX])

    def wait_field(self) -> dict[str, Any] | None:
        """What this operation waits for, as an ABORT's ``w`` (docs/protocol.md): now, or
        when it failed; None when it waits for no one."""
        if self.posted:
            now = _now()
            ranks, stalled, age = self.waiting_world(), now - self.moved, now - self.opened
        elif self.blocked is not None:
            ranks, stalled, age = self.blocked
        else:
            return None
        return {
            "n": self.name[:MAX_OP],
            "q": self.seq,
            "g": self.group[:MAX_OP],
            "r": list(ranks),
            "s": round(max(stalled, 0.0), 3),
            "a": round(max(age, 0.0), 3),
        }

    def lost(self, peer: int, why: str, graceful: bool, gone: Container[int] = ()) -> None:
        """World rank ``peer``'s link is gone. A crash fails the operation; an
        orderly leave (``graceful``) only if we still wait for data that only it,
        or it and others ``gone`` too, could send (a receive posted under two keys,
        :meth:`take_either`, still waits for the other sender)."""
        if peer not in self.rank_of:
            return
        if self.tolerance is not None:
            if self.state is State.RUNNING or self.state is State.ISSUED:
                self.tolerance(peer)
            return
        if graceful and not self.waits_on({peer}, gone):
            return
        self.fail_with(
            Reason.PEER_LOST, f"{self.where()} failed: lost connection to rank {self.me(peer)}: {why}", (self.me(peer),)
        )

    def waits_on(self, peers: Container[int], gone: Container[int] = ()) -> bool:
        """Whether a receive posted here can only be completed by a world rank in
        ``peers`` or ``gone`` (under every key it is posted under)."""
        for key, (fut, _) in self.posted.items():
            if key[0] in peers and all(k[0] in peers or k[0] in gone for k, (f, _) in self.posted.items() if f is fut):
                return True
        return False

    def waiting_for(self) -> list[int]:
        """Group ranks this operation is currently blocked on (safe to call from another
        thread, the heartbeat's: it reads a copy of :attr:`posted`)."""
        return sorted({self.me(src) for (src, _, _) in self.posted.copy()})

    # -- for links: flow control hooks ---------------------------------------------------
    def watch(self, fut: asyncio.Future[Any]) -> None:
        """Fail ``fut`` with this operation's error if it ends first."""
        if self.state is State.RUNNING or self.state is State.ISSUED:
            if self.waiters is None:
                self.waiters = []
            self.waiters.append(fut)
            fut.add_done_callback(self._unwatch)
        elif not fut.done():
            _set_exception(
                fut, self.error or CollectiveClosed(f"{self.where()} is finished", op=self.name, seq=self.seq)
            )

    def _unwatch(self, fut: asyncio.Future[Any]) -> None:
        if self.waiters and fut in self.waiters:
            self.waiters.remove(fut)

    def when_posted(self, key: SlotKey, callback: Callable[[bool], None]) -> None:
        """``callback(True)`` once a receive is posted for ``key`` (now if it is),
        ``callback(False)`` if the operation ends first."""
        if key in self.posted:
            callback(True)
        elif self.state is State.RUNNING or self.state is State.ISSUED:
            if self.rts is None:
                self.rts = {}
            self.rts.setdefault(key, []).append(callback)
        else:
            callback(False)

    def unwait(self, key: SlotKey, callback: Callable[[bool], None]) -> None:
        """Forget ``callback`` given to :meth:`when_posted` for ``key`` (if not yet called)."""
        waiting = None if self.rts is None else self.rts.get(key)
        if waiting is not None and callback in waiting:
            waiting.remove(callback)
            if not waiting:
                del self.rts[key]  # type: ignore[union-attr]

    def _end_rts(self) -> None:
        pending, self.rts = self.rts or {}, None
        for callbacks in pending.values():
            for callback in callbacks:
                callback(False)

    # -- internals ----------------------------------------------------------------------
    def _released(self, src: int, payload: memoryview) -> None:
        if self._release is not None and payload.nbytes:
            self._release(src, payload.nbytes)

    def _size_mismatch(self, key: SlotKey, header: dict[str, Any], got: int, want: int) -> None:
        r = self.me(key[0])
        self.fail_with(
            Reason.MISMATCH,
            f"{self.where()}: rank {r} sent {got} bytes for step {key[1]} chunk "
            f"{key[2]} where {want} were expected ({header['f']} vs {self.fp})",
            (r,),
        )


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
        fut.exception()  # retrieved: the operation raises its error itself
