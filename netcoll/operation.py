"""One operation's life, and every way it can end (no I/O here).

An *operation* is one collective (or one point-to-point message) of one
group, numbered ``seq`` when it is issued. Its states::

    ISSUED ──start()──▶ RUNNING ──succeed()──▶ SUCCEEDED
       │                   │
       └──────fail()───────┴──────────────────▶ FAILED

and it fails for exactly one :class:`Reason`, the first one that happens
(later failures are ignored). :class:`Failure` is that reason with its
message and the ranks it names; :meth:`Failure.error` is the typed exception
users see (its ``.reason`` is the same value). The rules that decide *what* a
frame or an event means for an operation are the methods of
:class:`Operation` — a frame with another call's fingerprint is a mismatch,
an ABORT is the sender's failure, a lost peer is ``PEER_LOST`` unless it
left in order after finishing its part — so the mailbox only routes frames
to operations and the engine only drives them.

:class:`Work` is the public handle of an issued operation (``netcoll.Work``):
an awaitable future with ``done/result/exception/add_done_callback/cancel``
and a thread-safe blocking :meth:`Work.wait`.
"""

from __future__ import annotations

import asyncio
import enum
import threading
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any

from .errors import (
    CollectiveAborted,
    CollectiveCancelled,
    CollectiveClosed,
    CollectiveError,
    CollectiveTimeout,
    LimitExceeded,
    MismatchError,
    PeerLost,
)

SlotKey = tuple[int, int, int]  # (src world rank, step, chunk)
Release = Callable[[int, int], None]  # (src world rank, payload bytes) no longer held


class State(enum.Enum):
    ISSUED = "issued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Reason(str, enum.Enum):
    """Why an operation failed. The values are the ``cause`` of ABORT frames."""

    PEER_LOST = "lost"  # a link to a member broke (or it left before sending its part)
    TIMEOUT = "timeout"  # the deadline passed; names whom we waited for
    MISMATCH = "mismatch"  # ranks called different collectives / shapes / sizes
    CANCELLED = "cancelled"  # Work.cancel() or the awaiting task was cancelled
    CLOSED = "closed"  # the communicator or transport closed under it
    LIMIT = "limit"  # a peer declared more than a configured limit
    ABORTED = "aborted"  # another member failed it and told us why
    ERROR = "error"  # an unexpected error (a bug) in an algorithm


ERROR_CLASSES: dict[Reason, type[CollectiveError]] = {
    Reason.PEER_LOST: PeerLost,
    Reason.TIMEOUT: CollectiveTimeout,
    Reason.MISMATCH: MismatchError,
    Reason.CANCELLED: CollectiveCancelled,
    Reason.CLOSED: CollectiveClosed,
    Reason.LIMIT: LimitExceeded,
    Reason.ABORTED: CollectiveAborted,
    Reason.ERROR: CollectiveError,
}


def reason_of(cause: str) -> Reason:
    """The :class:`Reason` an ABORT frame's ``cause`` names (unknown: ERROR)."""
    try:
        return Reason(cause)
    except ValueError:
        return Reason.ERROR


@dataclass(frozen=True, slots=True)
class Failure:
    """How an operation ended, as one value.

    Attributes:
        reason: the typed reason.
        message: the user-facing message (names the operation and the ranks).
        ranks: group ranks the failure is about (lost, missing, mismatching, cancelling).
        told: the other members already know (it came from one of them, or we
            told them), so no ABORT is sent for it.
        waiting: on a timeout reported by a peer, the group ranks *this* rank was
            itself waiting for (sent on, so the chain of waits can be explained).
    """

    reason: Reason
    message: str
    ranks: tuple[int, ...] = ()
    told: bool = False
    waiting: tuple[int, ...] = ()

    def error(self, op: Operation) -> CollectiveError:
        exc = ERROR_CLASSES[self.reason](self.message, op=op.name, seq=op.seq, ranks=self.ranks)
        exc.reason = self.reason
        return exc


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
        "state",
        "failure",
        "error",
        "arrived",
        "posted",
        "reports",
        "waiters",
        "rts",
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
    ) -> None:
        self.group, self.seq, self.fp, self.members, self.name = group, seq, fp, members, name
        self.rank_of = rank_of if rank_of is not None else {w: r for r, w in enumerate(members)}
        self.state = State.ISSUED
        self.failure: Failure | None = None
        #: the error users see (a typed CollectiveError, or the ValueError/TypeError a body raised)
        self.error: Exception | None = None
        #: payloads that arrived before their receive was posted, and whether they are
        #: held (in a buffer of their own: released to the link when taken or dropped)
        self.arrived: dict[SlotKey, tuple[memoryview, dict[str, Any], bool]] = {}
        self.posted: dict[SlotKey, tuple[asyncio.Future[Any], memoryview | None]] = {}
        #: group rank -> the group ranks it was waiting for when it timed out (made when needed)
        self.reports: dict[int, list[int]] | None = None
        #: futures (a link's wait for credit, say) failed with the operation (made when needed)
        self.waiters: list[asyncio.Future[Any]] | None = None
        #: slot -> callbacks waiting for a receive to be posted there (a sender's RTS; made when needed)
        self.rts: dict[SlotKey, list[Callable[[bool], None]]] | None = None
        self._loop = loop or asyncio.get_running_loop()
        self._release = release

    def __repr__(self) -> str:
        return f"<Operation {self.where()} {self.state.value}>"

    def where(self) -> str:
        return f"{self.name} #{self.seq} of group {self.group!r}"

    def me(self, world_rank: int) -> int:
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
    def take(self, key: SlotKey, out: memoryview | None) -> asyncio.Future[Any]:
        """Future of ``(payload, header)`` for slot ``key``; ``out`` (if given)
        receives the payload bytes."""
        fut: asyncio.Future[Any] = self._loop.create_future()
        if self.state is not State.RUNNING:
            _set_exception(
                fut, self.error or CollectiveClosed(f"{self.where()} is not running", op=self.name, seq=self.seq)
            )
            return fut
        got = self.arrived.pop(key, None)
        if got is None:
            self.posted[key] = (fut, out)
            if self.rts:
                for callback in self.rts.pop(key, ()):
                    callback(True)
            return fut
        payload, header, held = got
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
        """Member ``header['origin']`` failed this operation and says why."""
        r = self.me(header["origin"])
        cause = reason_of(header["cause"])
        ranks = tuple(header.get("ranks") or (r,))
        if cause is Reason.TIMEOUT:
            if self.reports is None:
                self.reports = {}
            self.reports[r] = list(ranks)
        waiting = tuple(self.waiting_for())
        also = ""
        if waiting and cause is Reason.TIMEOUT:
            also = f" (rank {me} itself was waiting for {_ranks(waiting)})"
        reason = cause if cause in (Reason.MISMATCH, Reason.CANCELLED) else Reason.ABORTED
        self.fail(
            Failure(
                reason,
                f"{self.where()} aborted by rank {r} ({header['cause']}): {header['reason']}{also}",
                waiting if also else ranks,
                told=True,
                waiting=waiting if also else (),
            )
        )

    def lost(self, peer: int, why: str, graceful: bool) -> None:
        """World rank ``peer``'s link is gone. A crash fails the operation; an
        orderly leave (``graceful``) only if we still wait for data from it."""
        if peer not in self.rank_of:
            return
        if graceful and not any(k[0] == peer for k in self.posted):
            return
        self.fail_with(
            Reason.PEER_LOST, f"{self.where()} failed: lost connection to rank {self.me(peer)}: {why}", (self.me(peer),)
        )

    def waiting_for(self) -> list[int]:
        """Group ranks this operation is currently blocked on."""
        return sorted({self.rank_of.get(src, src) for (src, _, _) in self.posted})

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


_future_init = asyncio.Future.__init__


class Work(asyncio.Future[Any]):
    """An issued operation (``netcoll.Work``): its place in the group's
    sequence was fixed when the collective was called.

    Await it (``y = await comm.all_reduce(x)``), or keep it and await it
    later, in any order with other Works. ``done()``, ``result()``,
    ``exception()``, ``add_done_callback(fn)`` are those of an asyncio
    future. :meth:`cancel` (also what cancelling a task that awaits the Work
    does) aborts the collective on every rank of the group: the others fail
    with :class:`~netcoll.errors.CollectiveCancelled` naming this rank, the
    communicator stays usable and the next collective is correct.
    :meth:`wait` blocks a thread other than the event loop's.

    Attributes:
        name: the collective (``"all_reduce"``...).
        seq: its sequence number in its group (``None`` when it needed no
            communication, e.g. on a group of one).
    """

    __slots__ = ("name", "seq", "op", "_drive", "_driver")

    def __init__(self, name: str, seq: int | None, *, loop: asyncio.AbstractEventLoop) -> None:
        _future_init(self, loop=loop)  # (not super(): this is on every collective's path)
        self.name = name
        self.seq = seq
        self.op: Operation | None = None
        #: the operation's driver coroutine function, until a task claims it
        self._drive: Callable[[], Coroutine[Any, Any, None]] | None = None
        #: the task running the operation (the first awaiting task, or one of its own)
        self._driver: asyncio.Task[Any] | None = None

    def __repr__(self) -> str:
        state = (
            "pending"
            if not self.done()
            else "cancelled"
            if self.cancelled()
            else ("failed" if self.exception() is not None else "done")
        )
        return f"<Work {self.name} #{self.seq} {state}>"

    def __await__(self) -> Generator[Any, None, Any]:
        drive = self._drive
        if drive is None or self.done():
            return (yield from super().__await__())
        self._drive = None  # run it in this task: no task of its own, no extra wake-ups
        yield from drive().__await__()
        return self.result()

    @classmethod
    def completed(cls, name: str, value: Any) -> Work:
        """A Work that needed no communication, done with ``value``."""
        work = cls(name, None, loop=asyncio.get_running_loop())
        work.set_result(value)
        return work

    def cancel(self, msg: Any | None = None) -> bool:
        """Cancel the operation here and abort it on every other rank."""
        if self.done():
            return False
        driver = self._driver
        if driver is not None and self.op is not None and not driver.done():
            driver.cancel(msg)  # interrupts the running body; it aborts on the peers
            return True
        return super().cancel(msg)  # not started: it aborts on the peers when it starts

    def wait(self, timeout: float | None = None) -> Any:
        """Block this thread until the operation ends; return its result or
        raise its error (``TimeoutError`` if ``timeout`` seconds pass first:
        the operation goes on). Not from the event loop's own thread: there,
        ``await`` the Work."""
        loop = self.get_loop()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("Work.wait() would block the event loop that runs it; use `await work`")
        if not self.done():
            ended = threading.Event()
            loop.call_soon_threadsafe(self.add_done_callback, lambda _: ended.set())
            if not ended.wait(timeout):
                raise TimeoutError(f"{self.name} #{self.seq} did not end within {timeout:g}s")
        return self.result()


__all__ = ["ERROR_CLASSES", "Failure", "Operation", "Reason", "SlotKey", "State", "Work", "reason_of"]
