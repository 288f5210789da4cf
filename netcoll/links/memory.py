"""In-process link pairs, for tests: two :class:`MemoryLink` objects that hand
frames to each other by direct calls, in order, through the same protocol
(flow control included) and the same mailbox sink/deliver path as TCP, so a
posted buffer receives a payload directly and unexpected payloads are bounded
by the receive window.

``send`` copies the payload (into the posted buffer, or into a buffer of the
receiver's own), so the sender may reuse its buffer when it returns.
"""

from __future__ import annotations

from typing import Any

from ..errors import ProtocolError
from ..mesh.mailbox import Mailbox
from ..wire import Frame, Kind
from .framed import FramedLink, connection_error

_EMPTY = memoryview(b"")


class MemoryLink(FramedLink):
    """One end of an in-process pair (make both with :meth:`pair`)."""

    kind = "memory"

    def __init__(self, *, peer: int, mailbox: Mailbox, window: int, peer_window: int) -> None:
        super().__init__(peer, mailbox, window=window, peer_window=peer_window)
        self.other: MemoryLink | None = None

    @staticmethod
    def join(at_a: MemoryLink, at_b: MemoryLink) -> None:
        """Make two links the ends of one pair."""
        if at_a.flow.window != at_b.flow.peer_window or at_b.flow.window != at_a.flow.peer_window:
            raise ValueError("the two ends of a memory link disagree about their windows")
        at_a.other, at_b.other = at_b, at_a

    @classmethod
    def pair(
        cls, a: int, a_mailbox: Mailbox, b: int, b_mailbox: Mailbox, *, a_window: int, b_window: int
    ) -> tuple[MemoryLink, MemoryLink]:
        """Links joining ranks ``a`` and ``b``: (a's link to b, b's link to a)."""
        at_a = cls(peer=b, mailbox=a_mailbox, window=a_window, peer_window=b_window)
        at_b = cls(peer=a, mailbox=b_mailbox, window=b_window, peer_window=a_window)
        cls.join(at_a, at_b)
        return at_a, at_b

    async def _transmit(self, kind: Kind, header: dict[str, Any], payload: memoryview | None) -> None:
        self._deliver(kind, header, payload)

    def _post(self, kind: Kind, header: dict[str, Any]) -> None:
        self._deliver(kind, header, None)

    def _deliver(self, kind: Kind, header: dict[str, Any], payload: memoryview | None) -> None:
        other = self.other
        if self.lost is not None or other is None or other.lost is not None:
            raise connection_error(self.lost or (other.lost if other else None))
        n = 0 if payload is None else payload.nbytes
        try:
            body = _EMPTY
            if payload is not None and n:
                target = other.sink(kind, header, n)
                if target is None:  # the bytes "arrive" into a buffer of the receiver's own
                    body = memoryview(bytearray(payload))
                else:
                    body = memoryview(target).cast("B")
                    body[:] = payload
            other.receive(Frame(kind, header, body))
        except ProtocolError as exc:  # the receiver refuses the frame: the pair breaks, as TCP's would
            other._lost(exc)
            self._lost(ConnectionAbortedError(f"peer reported: {exc}"))
            raise connection_error(self.lost) from None

    def divert(self) -> None:
        """Nothing to do: a payload is never part-way here."""

    def sever(self, cause: BaseException) -> None:
        """Break the pair without BYE (a process dying): both ends are lost."""
        other = self.other
        self._lost(cause)
        if other is not None:
            other._lost(cause)

    def close(self) -> None:
        """BYE (the peer sees an orderly leave), then both ends are gone."""
        if self.lost is None:
            try:
                self._post(Kind.BYE, self.mailbox.farewell())
            except ConnectionError:
                pass
        self.sever(ConnectionResetError("link closed"))

    def abort(self) -> None:
        self.sever(ConnectionResetError("link aborted"))

    async def wait_closed(self) -> None:
        return None


__all__ = ["MemoryLink"]
