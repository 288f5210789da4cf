"""A link over one authenticated TCP connection
(:class:`~netcoll.links.connection.FramedProtocol` on a zero-copy
:class:`~netcoll.links.sockettransport.SocketTransport`).

The decoder's sink is the link's (:meth:`FramedLink.sink`): a DATA payload is
checked against the receive window as soon as its header is complete, before
a byte of it is read, and written straight into a posted buffer when there is
one, or, from :data:`TCP_FOLD_MIN` and when that receive reduces, read through
a small piece and reduced as it comes (:mod:`netcoll.links.folding`).
Frames the connection decoded before the link existed (those that came in the
same read as the handshake's last frame) are accounted the same way when the
link starts.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from ..errors import ProtocolError
from ..links.connection import COALESCE_MAX, FramedProtocol
from ..loop import spin_selector
from ..mesh.mailbox import Mailbox
from ..wire import Kind, Pieces
from .base import Quiet
from .folding import FoldPieces, piece_buffer
from .framed import FramedLink

#: DATA payloads from this size whose receive reduces are folded as they are read
#: (:mod:`netcoll.links.folding`; measured in ``docs/performance.md``, "Folding over TCP")
TCP_FOLD_MIN = 2 << 20


class TcpLink(FramedLink):
    """One peer over TCP.

    Args:
        peer: the world rank at the other end.
        proto: the connection, handshake done.
        mailbox: where received frames go.
        window / peer_window: the two receive windows (from the handshake).
    """

    kind = "tcp"
    #: large DATA payloads ride this link's socket. Such a link reads a large payload whose
    #: receive reduces through a piece, folding as it reads (:attr:`socket_fold_min`); holds
    #: the loop's polling off while an operation moves large payloads (:meth:`bulk_quiet`);
    #: and sends a large payload synchronously when its receiver asks (:meth:`_syncs`). A
    #: subclass that moves large payloads another way (shared memory) sets it False.
    bulk_on_socket: ClassVar[bool] = True
    #: DATA payloads of at least this many bytes read from the socket are reduced as they
    #: are read, when their receive was posted with a fold of their size (None: never)
    socket_fold_min: int | None = TCP_FOLD_MIN

    def __init__(self, *, peer: int, proto: FramedProtocol, mailbox: Mailbox, window: int, peer_window: int) -> None:
        super().__init__(peer, mailbox, window=window, peer_window=peer_window)
        self.proto = proto
        self._fold_piece: memoryview | None = None  # folded payloads are read through it
        proto.decoder.sink = self.socket_sink

    def bulk_quiet(self) -> Quiet | None:
        """netcoll's polling loop, if this is one: a large message over the socket is
        waited for asleep (:meth:`netcoll.loop.SpinSelector.hold`)."""
        return spin_selector(asyncio.get_running_loop()) if self.bulk_on_socket else None

    @property
    def fold_min_bytes(self) -> int | None:
        """A payload posted with a fold is reduced as it is read from :data:`TCP_FOLD_MIN`."""
        return self.socket_fold_min if self.bulk_on_socket else None

    def _syncs(self, header: dict[str, Any], n: int) -> bool:
        return self.bulk_on_socket and super()._syncs(header, n)

    def socket_sink(self, kind: Kind, header: dict[str, Any], n: int) -> memoryview | Pieces | None:
        """The decoder's sink: :meth:`FramedLink.sink`, but a payload of
        :attr:`socket_fold_min` or more whose receive was posted with a fold of its
        size is reduced piece by piece as it is read (:class:`FoldPieces`)."""
        buf = self.sink(kind, header, n)
        least = self.socket_fold_min if self.bulk_on_socket else None  # (per frame: no call)
        if buf is None or least is None or n < least:
            return buf
        fold = self.mailbox.fold(self.peer, header)
        if fold is None or fold.nbytes != n or not FoldPieces.fits(fold):
            return buf
        if self._fold_piece is None:
            self._fold_piece = piece_buffer()
        return FoldPieces(fold, self._fold_piece, buf)

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection's asyncio transport."""
        return self.proto.transport

    @property
    def usable(self) -> bool:
        t = self.proto.transport
        return self.lost is None and self.proto.lost is None and t is not None and not t.is_closing()

    def start(self) -> None:
        proto = self.proto
        proto.on_lost = self._lost
        proto.on_frame = self.receive
        try:
            while proto.queue:  # decoded before the sink was ours: account them now
                frame = proto.queue.popleft()
                if frame.kind is Kind.DATA and frame.payload.nbytes:
                    self.admit(frame.kind, frame.header, frame.payload.nbytes)
                self.receive(frame)
        except ProtocolError as exc:
            proto.fail(exc, tell_peer=True)
        if proto.lost is not None:
            self._lost(proto.lost)

    async def _transmit(self, kind: Kind, header: dict[str, Any], payload: memoryview | None) -> None:
        await self.proto.send(kind, header, payload)

    def _write_now(self, header: dict[str, Any], payload: memoryview) -> bool:
        proto = self.proto
        if payload.nbytes > COALESCE_MAX or not proto.writable_now():
            return False
        try:
            proto.write(Kind.DATA, header, payload)
        except Exception:  # noqa: BLE001 - raised before a byte went out: send() raises it properly
            return False
        return True

    def _post(self, kind: Kind, header: dict[str, Any]) -> None:
        self.proto.write(kind, header)

    def _backlog(self) -> int:
        t = self.proto.transport
        return t.get_write_buffer_size() if t is not None else 0

    def _on_bye(self) -> None:  # the peer reads until we close our side too
        self.proto.close()

    def divert(self) -> None:
        self.proto.decoder.divert()

    def close(self) -> None:
        """BYE, then half-close: keep reading until the peer closes too (closing
        with unread bytes would send a reset that can destroy what we sent)."""
        proto, t = self.proto, self.proto.transport
        if proto.lost is not None or t is None or t.is_closing():
            return
        try:
            proto.write(Kind.BYE, self.mailbox.farewell())
            if t.can_write_eof():
                t.write_eof()
            else:
                proto.close()
        except Exception:  # noqa: BLE001 - closing anyway
            proto.close()

    def abort(self) -> None:
        self.proto.abort()

    async def wait_closed(self) -> None:
        await asyncio.shield(self.proto.closed)


__all__ = ["TcpLink"]
