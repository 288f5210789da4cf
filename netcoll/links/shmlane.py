"""The lane side of a shared-memory link: whole frames through the pair's lanes
(:mod:`netcoll.links.lane`) instead of the socket, while the peer's loop polls them.

A lane carries eager DATA that fits, the header of each ring piece, and the
CREDITs that give ring space back (``docs/protocol.md`` §5.4): no system call per
frame, and a BELL on the socket only for a peer asleep in ``epoll``. Frames are
taken out of the lane in order, at each turn of the loop and before any frame
from the socket is handled; :class:`~netcoll.links.shm.ShmLink` says what each
one means (:meth:`LaneLink._lane_frame`) and when the lane must wait
(:meth:`LaneLink._lane_blocked`).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Final

from ..errors import ProtocolError
from ..links.connection import FramedProtocol
from ..loop import spin_selector
from ..mesh.mailbox import Mailbox
from ..wire import Frame, Kind, encode_header
from . import lane
from .base import LinkStats
from .framed import FramedLink
from .shmring import Segment
from .tcp import TcpLink

_EMPTY = memoryview(b"")
#: eager DATA from the lane of at least this many bytes is folded as it is read,
#: when its receive was posted with a fold (:attr:`LaneLink.fold_min_bytes`);
#: below it the copy that folding saves costs less than describing the fold
LANE_FOLD_MIN: Final = 32 << 10


class LaneLink(TcpLink):
    """A TCP link that also has the pair's two lanes (``segment.lane_tx`` out,
    ``segment.lane_rx`` in); the lane in is read only on a loop that polls it."""

    def __init__(
        self,
        *,
        peer: int,
        proto: FramedProtocol,
        mailbox: Mailbox,
        window: int,
        peer_window: int,
        segment: Segment,
    ) -> None:
        super().__init__(peer=peer, proto=proto, mailbox=mailbox, window=window, peer_window=peer_window)
        self.segment = segment
        self._lane_out: lane.LaneWriter | None = None
        self._poll: lane.LanePoll | None = None  # the peer's lane into this side, polled by this loop
        self._lane_waits = False  # the lane's next frame waits (:meth:`_lane_frame` said so)
        #: frames sent / received through the lane, and bells rung for a sleeping peer
        self.lane_sent = self.lane_received = self.bells = 0
        if lane.enabled():
            self._lane_out = lane.LaneWriter(segment.lane_tx)
            selector = spin_selector(asyncio.get_running_loop())
            if selector is not None:  # only a loop that polls may ask for frames in its lane
                self._poll = lane.LanePoll(lane.LaneReader(segment.lane_rx), selector, self._poll_lane)

    #: large payloads take shared memory (the ring, or the sender's memory read in place),
    #: which the loop's polling serves: the socket carries small DATA only, so nothing is
    #: folded as read from it, and polling stays on. Nor are large sends synchronous: a
    #: large send is lent where that pays (and then waits for its reader anyway), and a
    #: rendezvous before a ring copy measured slower than the copy it saves (a 1 MiB gather,
    #: 4 ranks: 0.87x; measured 2026-11, in git history)
    bulk_on_socket = False

    @property
    def fold_min_bytes(self) -> int | None:
        """Eager DATA from a lane this loop polls is read in place: folded from :data:`LANE_FOLD_MIN`."""
        return LANE_FOLD_MIN if self._poll is not None else None

    # -- sending ----------------------------------------------------------------------
    def _lane_write(self, header: dict[str, Any], payload: memoryview) -> bool:
        """Eager DATA into the lane, if it fits (see :meth:`_lane_put`)."""
        out = self._lane_out
        if out is None or payload.nbytes >= out.record_max:
            return False
        return self._lane_put(encode_header(Kind.DATA, header, payload.nbytes), payload)

    def _lane_put(self, head: bytes, payload: memoryview) -> bool:
        """One whole frame into the lane, if the peer polls it and it has room;
        rings a sleeping peer. False: nothing written."""
        out = self._lane_out
        if out is None or not out.polled() or not self.proto.writable_now() or not out.put(head, payload):
            return False
        self.lane_sent += 1
        if out.should_ring():
            self.bells += 1
            try:
                self.proto.write(Kind.BELL, {})
            except (ConnectionError, RuntimeError):
                pass  # the link is going: its loss is reported on its own
        return True

    # -- receiving ----------------------------------------------------------------------
    def _lane_blocked(self) -> bool:
        """Whether the lane must not be read now (a payload is part-way on the socket)."""
        return bool(self._cur_n)

    def _lane_frame(self, raw: memoryview) -> bool:
        """One frame from the lane, checked and handled; False if it must wait
        (it stays in the lane, and :attr:`_lane_waits` is set)."""
        kind, header, payload = lane.parse(raw, self.proto.limits)
        if kind is not Kind.DATA or "z" in header:
            raise ProtocolError(f"a {kind.name} frame in the lane of a link without a ring")
        self._lane_data(header, payload)
        self.lane_received += 1
        return True

    def _drain_lane(self) -> bool:
        """Handle the frames in the peer's lane, in order, until one must wait;
        whether any was handled."""
        poll = self._poll
        if poll is None or not poll.reader.pending() or self.lost is not None or self._lane_blocked():
            return False
        self._lane_waits = handled = False
        frames = poll.reader.frames()
        try:
            for raw in frames:
                if not self._lane_frame(raw):
                    self._lane_waits = True
                    break  # left in the lane (its space is not given back)
                handled = True
        finally:
            frames.close()
        return handled

    def _lane_data(self, header: dict[str, Any], payload: memoryview) -> None:
        """An eager DATA frame from the lane: copied out, then delivered."""
        if not payload.nbytes:
            FramedLink.receive(self, Frame(Kind.DATA, header, _EMPTY))
            return
        buf = self.sink(Kind.DATA, header, payload.nbytes)
        if buf is not None:
            target = memoryview(buf).cast("B")
            fold = self.mailbox.fold(self.peer, header) if payload.nbytes >= LANE_FOLD_MIN else None
            if fold is not None and fold.nbytes == payload.nbytes:
                try:  # reduced straight out of the lane; the posted buffer is left as it was
                    fold.apply(payload)
                except ValueError as exc:
                    raise ProtocolError(f"a lane frame the posted reduction cannot take: {exc}") from None
            else:
                target[:] = payload
        else:
            target = memoryview(bytearray(payload))  # held: it must outlive its place in the lane
        FramedLink.receive(self, Frame(Kind.DATA, header, target))

    def _poll_lane(self) -> bool:
        """The selector's poll: never raises (a bad lane breaks the link instead)."""
        try:
            return self._drain_lane()
        except ProtocolError as exc:
            self.proto.fail(exc, tell_peer=True)
        except Exception as exc:  # noqa: BLE001 - a handler bug must not kill the event loop
            self.proto.fail(ProtocolError(f"error handling a lane frame: {exc!r}"), tell_peer=True)
        return True

    def _close_lanes(self) -> None:
        for end in (self._poll, self._lane_out):
            if end is not None:
                end.close()
        self._poll = self._lane_out = None

    def stats(self) -> LinkStats:
        return replace(super().stats(), lane_sent=self.lane_sent, lane_received=self.lane_received, bells=self.bells)


__all__ = ["LaneLink"]
