"""The peer protocol every link speaks, whatever moves its frames: DATA with
flow control (eager within credit, else RTS/CTS rendezvous), ABORT, CREDIT,
BYE and PING/PONG, delivered to the mailbox. Subclasses only move frames
(:meth:`FramedLink._transmit`, :meth:`FramedLink._post`) and feed received
ones to :meth:`FramedLink.sink` and :meth:`FramedLink.receive`.

Receive-side accounting of one DATA payload of ``n > 0`` bytes (frames of a
link arrive one at a time, so "the current frame" is well defined):

* :meth:`sink` runs when its header is complete: an eager payload is charged
  against the window (:meth:`Flow.charge`), a rendezvous one (``rz``) must
  match a CTS we sent; then the mailbox's posted buffer, if any, is the
  destination;
* :meth:`receive` runs when it is complete: a payload written into a posted
  buffer is credited back at once (batched); one in a buffer of its own is
  *held* until the mailbox reports it :meth:`released`.
"""

from __future__ import annotations

import abc
import asyncio
import functools
from typing import Any, Final

import numpy as np

from ..errors import ProtocolError
from ..escape import escape
from ..mesh.mailbox import FAREWELL_MAX, Mailbox
from ..wire import CHUNK, Frame, Kind
from .base import Link, LinkStats
from .flow import Flow

#: a held payload larger than this gets a buffer of its own size from :meth:`FramedLink.sink`
#: (the decoder would grow one in pieces of this size and join them)
HELD_PIECES_MAX: Final = CHUNK
#: a synchronous send (:attr:`~netcoll.operation.Operation.sync_from`) of at least this many bytes
#: waits for its receive to be posted; below, a rendezvous round trip costs more than the held
#: copy it saves
SYNC_MIN: Final = 512 * 1024
ABORT_REASON_MAX: Final = 4096  # characters of an ABORT's reason (control frames are small)
ABORT_RANKS_MAX: Final = 512


def held_buffer(n: int) -> memoryview:
    """``n`` writable bytes for a payload no receive was posted for, uninitialized:
    its pages are touched only as the bytes land (``n`` was checked by flow control)."""
    return np.empty(n, dtype=np.uint8).data


def connection_error(exc: BaseException | None) -> ConnectionError:
    if isinstance(exc, ConnectionError):
        return exc
    return ConnectionResetError(f"connection lost: {exc}" if exc else "connection closed")


def trim_abort(header: dict[str, Any]) -> dict[str, Any]:
    """An ABORT header that fits the control-frame limits."""
    reason, ranks = header.get("reason"), header.get("ranks")
    if isinstance(reason, str) and len(reason) > ABORT_REASON_MAX:
        header = dict(header, reason=reason[: ABORT_REASON_MAX - 3] + "...")
    if isinstance(ranks, list) and len(ranks) > ABORT_RANKS_MAX:
        header = dict(header, ranks=ranks[:ABORT_RANKS_MAX])
    return header


class FramedLink(Link):
    """A link with flow control over some way of moving frames.

    Args:
        peer: the world rank at the other end.
        mailbox: where received DATA and ABORT frames go.
        window: this side's receive window in bytes.
        peer_window: the peer's receive window (the credit we start with).
    """

    def __init__(self, peer: int, mailbox: Mailbox, *, window: int, peer_window: int) -> None:
        super().__init__(peer)
        self.mailbox = mailbox
        self.flow = Flow(window, peer_window)
        self.said_bye = False  # the peer announced an orderly close
        self.left_after: str | None = None  # the failure its BYE said it leaves after, if any
        self._reported = False
        self._cts: dict[int, asyncio.Future[bool]] = {}  # RTS id -> its CTS
        self._cur_n = 0  # payload bytes of the DATA frame arriving now (set by sink)
        self._cur_hit = False  # ...written into a posted buffer
        self._cur_charged = False  # ...eager (charged to the window)
        self._held = self._held_peak = 0
        self._frames_sent = self._bytes_sent = self._frames_received = self._bytes_received = 0
        self._rendezvous = self._credits_sent = 0

    # -- what subclasses provide ---------------------------------------------------
    @abc.abstractmethod
    async def _transmit(self, kind: Kind, header: dict[str, Any], payload: memoryview | None) -> None:
        """Send a frame, with backpressure; ConnectionError when broken."""

    @abc.abstractmethod
    def _post(self, kind: Kind, header: dict[str, Any]) -> None:
        """Send a header-only control frame without waiting; ConnectionError when broken."""

    def _backlog(self) -> int:
        return 0

    def _write_now(self, header: dict[str, Any], payload: memoryview) -> bool:
        """Write an eager DATA frame at once if it is small enough for that and
        the way to the wire is clear (no backpressure to wait for); False:
        nothing written."""
        return False

    # -- sending ----------------------------------------------------------------------
    async def send(self, kind: Kind, header: dict[str, Any], payload: memoryview | None = None) -> None:
        if self.lost is not None:
            raise connection_error(self.lost)
        n = 0 if payload is None else payload.nbytes
        if kind is Kind.DATA and n and ((n >= SYNC_MIN and self._syncs(header, n)) or not self.flow.try_spend(n)):
            await self._send_rendezvous(header, payload, n)  # type: ignore[arg-type]
            return
        if kind is Kind.ABORT:
            header = trim_abort(header)
        await self._transmit(kind, header, payload)
        self._frames_sent += 1
        self._bytes_sent += n

    def _syncs(self, header: dict[str, Any], n: int) -> bool:
        """Whether a DATA payload of ``n`` bytes waits for its receive before it is sent: a
        synchronous send (:meth:`Mailbox.syncs`) of :data:`SYNC_MIN` or more."""
        return n >= SYNC_MIN and self.mailbox.syncs(header)

    def send_nowait(self, header: dict[str, Any], payload: memoryview) -> bool:
        n = payload.nbytes
        if self.lost is not None or n > self.flow.credit or (n >= SYNC_MIN and self._syncs(header, n)):
            return False
        if not self._write_now(header, payload):
            return False
        self.flow.try_spend(n)
        self._frames_sent += 1
        self._bytes_sent += n
        return True

    async def _send_rendezvous(self, header: dict[str, Any], payload: memoryview, n: int) -> None:
        """RTS, wait for the CTS (or the operation's end), then the DATA."""
        rid = self.flow.new_rts()
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._cts[rid] = fut
        try:
            self.mailbox.watch(header["g"], header["q"], fut)
            if not fut.done():
                self._emit(
                    Kind.RTS,
                    {"id": rid, "n": n, "g": header["g"], "q": header["q"], "s": header["s"], "c": header["c"]},
                )
            ok = await fut
        finally:
            self._cts.pop(rid, None)
        if not ok:  # the receiver's operation ended first: it would drop the data
            return
        await self._transmit(Kind.DATA, {**header, "rz": rid}, payload)
        self._frames_sent += 1
        self._bytes_sent += n
        self._rendezvous += 1

    def _emit(self, kind: Kind, header: dict[str, Any]) -> None:
        self._post(kind, header)
        self._frames_sent += 1

    def _give_credit(self, n: int) -> None:
        if n and self.lost is None:
            try:
                self._emit(Kind.CREDIT, {"n": n})
                self._credits_sent += 1
            except ConnectionError:
                pass  # the link is going: its loss is reported on its own

    # -- receiving ----------------------------------------------------------------------
    def admit(self, kind: Kind, header: dict[str, Any], n: int) -> None:
        """Check and account a payload of ``n > 0`` bytes whose header just arrived."""
        if kind is not Kind.DATA:
            raise ProtocolError(f"{kind.name} frame with a payload on a peer link")
        rid = header.get("rz")
        if rid is None:
            self.flow.charge(n)
        else:
            self.flow.rendezvous_data(rid, n)
        self._cur_n, self._cur_charged, self._cur_hit = n, rid is None, False

    def sink(self, kind: Kind, header: dict[str, Any], n: int) -> memoryview | None:
        """The decoder's sink: where the payload of a frame goes (None: a buffer of its own).

        A large eager payload with no receive posted for it yet (a faster peer's first
        segment of an operation this rank has not opened) is *held*: it gets one buffer of
        its size here, instead of the decoder's pieces joined at the end (a second copy
        of it, and twice the fresh pages). Its size was charged against this side's
        window, so a peer cannot make it larger than the window it was granted."""
        self.admit(kind, header, n)
        buf = self.mailbox.sink(self.peer, header, n)
        self._cur_hit = buf is not None
        if buf is None and n > HELD_PIECES_MAX and self._cur_charged:
            return held_buffer(n)
        return buf

    def receive(self, frame: Frame) -> None:
        """A whole frame arrived. Raises ProtocolError for frames a peer may not send."""
        self._frames_received += 1
        kind = frame.kind
        if kind is Kind.DATA:
            n, self._cur_n = self._cur_n, 0
            if n:
                self._bytes_received += n
                if self._cur_hit:
                    if self._cur_charged:
                        self._give_credit(self.flow.free(n))
                else:
                    self._held += n
                    self._held_peak = max(self._held_peak, self._held)
                    if not self._cur_charged:
                        self.flow.hold_uncharged(n)
            self.mailbox.deliver(self.peer, frame.header, frame.payload)
        elif kind is Kind.ABORT:
            self.mailbox.on_abort(self.peer, frame.header)
        elif kind is Kind.CREDIT:
            self.flow.credited(frame.header["n"])
        elif kind is Kind.RTS:
            rid = frame.header["id"]
            self.flow.rts(rid, frame.header["n"])
            self.mailbox.when_posted(self.peer, frame.header, functools.partial(self._clear, rid))
        elif kind is Kind.CTS:
            fut = self._cts.get(frame.header["id"])
            if fut is not None and not fut.done():  # (None: the sender gave up waiting)
                fut.set_result(frame.header["ok"])
        elif kind is Kind.BYE:
            self.said_bye = True
            why = frame.header.get("why")
            if isinstance(why, str) and why:
                self.left_after = escape(why, FAREWELL_MAX)
            self._on_bye()
        elif kind is Kind.PING:
            try:
                self._emit(Kind.PONG, {})
            except ConnectionError:
                pass
        elif kind is not Kind.PONG:
            raise ProtocolError(f"unexpected {kind.name} frame on a peer link")

    def _clear(self, rid: int, ok: bool) -> None:
        """The mailbox's answer to an RTS: a receive is posted (or the operation ended)."""
        if self.lost is None and self.flow.answer(rid, ok):
            try:
                self._emit(Kind.CTS, {"id": rid, "ok": ok})
            except ConnectionError:
                pass

    def released(self, nbytes: int) -> None:
        self._held -= nbytes
        self._give_credit(self.flow.released(nbytes))

    def _on_bye(self) -> None:
        """The peer will send nothing more (subclasses close their side)."""

    # -- ending -----------------------------------------------------------------------
    def _lost(self, exc: BaseException | None) -> None:
        """The link is gone: fail sends waiting for a CTS and tell the mesh (once)."""
        if self.lost is None:
            self.lost = exc or ConnectionResetError("connection closed")
            if self.said_bye and self.left_after is not None:
                self.lost = ConnectionResetError(f"it left after a failure there: {self.left_after}")
        err = connection_error(self.lost)
        for fut in self._cts.values():
            if not fut.done():
                fut.set_exception(err)
                fut.exception()
        if not self._reported and self.on_lost is not None:
            self._reported = True
            self.on_lost(self.peer, self.lost, self.said_bye)

    def stats(self) -> LinkStats:
        f = self.flow
        return LinkStats(
            kind=self.kind,
            peer=self.peer,
            frames_sent=self._frames_sent,
            bytes_sent=self._bytes_sent,
            frames_received=self._frames_received,
            bytes_received=self._bytes_received,
            unexpected_bytes=self._held,
            unexpected_peak=self._held_peak,
            send_backlog=self._backlog(),
            credit=f.credit,
            peer_window=f.peer_window,
            recv_window=f.window,
            rendezvous=self._rendezvous,
            waiting=sum(1 for fut in self._cts.values() if not fut.done()),
            credits_sent=self._credits_sent,
            lost=None if self.lost is None else str(self.lost),
        )


__all__ = ["FramedLink", "connection_error", "trim_abort"]
