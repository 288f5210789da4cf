"""A link through shared memory for two ranks on one host (``kind == "shm"``).

It rides on the pair's authenticated connection (TCP, or TLS): that socket
stays the doorbell and carries every control frame, and DATA under :data:`RING_MIN`
bytes that does not take the lane (below), as a TCP link does. Other DATA goes
through this side's ring of the pair's
:class:`~netcoll.links.shmring.Segment`, in pieces of at most a quarter
ring: the sender copies a piece in and sends a header-only DATA frame saying
where (``z: [pos, n]``; the first also ``zn``, the whole length; the headers
placed at once in one write, or through the lane); the receiver copies it into the posted buffer
(or one of its own, held as TCP holds it) and gives space back with ``CREDIT
{n: 0, z: pos}`` per quarter ring consumed, one for the frames of one read.
A receive posted with an :class:`~netcoll.ops.Fold` (a ring reduce-scatter
step) is reduced straight out of the ring: copy out and reduction in one pass;
so is eager DATA read from a lane (:attr:`ShmLink.fold_min_bytes`).

Flow control is :class:`~netcoll.links.framed.FramedLink`'s: the first
piece's header is the DATA header (eager, or ``rz`` after a CTS); the message
is delivered once its last piece is in. A message's pieces are contiguous (a
lock held from first to last); a sender cancelled part-way copies the rest of
its payload and finishes in a task, as a TCP send does.

The segment's *lanes* (:mod:`netcoll.links.shmlane`) carry small eager DATA,
the pieces' headers and the ring CREDITs while the peer's loop polls them
(netcoll's :class:`~netcoll.loop.SpinSelector`): no system call, and a BELL on
the socket only for a sleeping peer. Everything in the lane is taken out before
any socket frame (a BYE, a ring header) is handled and before a loss is
reported. So a header in the lane may pass none still unread on the socket:
after a piece announced there, the next go there too until the reader has given
its space back; and eager DATA that finds a ring message part-way (its rest on
the socket) waits in the lane for it.

*Direct DATA* (:mod:`netcoll.links.cma`): a payload of 1-64 MiB of an operation that
only moves data, to a peer that said it can read this process's memory, is not copied
into the ring: its header says where it is (``zv: [address, n]``), the peer reads it
straight into its buffer with ``process_vm_readv`` and says so (``CREDIT {n: 0, zd}``),
and the send returns then. One copy instead of two.

Loss is the connection's: a killed peer's socket reaches EOF, which fails its
operations (PeerLost) as on TCP. The mapping is dropped when the link is gone;
the file was unlinked in the handshake (:mod:`netcoll.mesh.tcpmesh`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

from ..errors import ProtocolError
from ..links.connection import FramedProtocol
from ..mesh.mailbox import Mailbox
from ..ops import Fold
from ..wire import Frame, Kind, encode_header
from . import cma, lane, shmring
from .base import LinkStats
from .factory import SHM, Capabilities
from .framed import FramedLink, connection_error, held_buffer
from .shmlane import LaneLink
from .shmring import RingReader, RingWriter, Segment, ShmRefused

log = logging.getLogger("netcoll.transport")

#: DATA payloads of at least this many bytes go through the ring; smaller ones
#: ride behind their header on the socket (one write, one read)
RING_MIN: Final = 64 << 10
_EMPTY = memoryview(b"")


@dataclass(slots=True)
class _Outgoing:
    """A message being written into the ring."""

    header: dict[str, Any]
    payload: memoryview
    pos: int = 0  # bytes of it in the ring so far


@dataclass(slots=True)
class _Incoming:
    """A message arriving through the ring."""

    header: dict[str, Any]
    n: int
    target: memoryview | None  # None: diverted (its receive is gone), read and dropped
    got: int = 0
    fold: Fold | None = None  # the posted receive reduces: fold each piece, leave target as it is


class ShmLink(LaneLink):
    """One peer on this host: bulk DATA through shared memory, the rest over the connection.

    Args:
        peer, proto, mailbox, window, peer_window: as for :class:`TcpLink`.
        segment: the pair's mapped segment (this side writes ``tx``, reads ``rx``).
    """

    kind = "shm"

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
        super().__init__(
            peer=peer, proto=proto, mailbox=mailbox, window=window, peer_window=peer_window, segment=segment
        )
        self._writer = RingWriter(segment.ring)
        self._reader = RingReader(segment.ring)
        self._lock = asyncio.Lock()  # held while a message's pieces go out
        self._room: asyncio.Future[None] | None = None  # a writer waiting for ring space
        self._in: _Incoming | None = None
        self._reporting = False  # a ring report is scheduled (:meth:`_report_soon`)
        self._socket_upto = 0  # the end of the last ring piece announced on the socket
        self._direct_done: asyncio.Future[None] | None = None  # the peer's read of our direct DATA
        self._scratch: memoryview | None = None  # folded direct DATA is read through it
        self._waiting: dict[str, Any] | None = None  # the peer's direct DATA not read yet
        self._wait_timer: asyncio.TimerHandle | None = None  # armed while it waits for its receive
        self._on_posted: Callable[[bool], None] | None = None  # given to the mailbox for it
        #: direct DATA (:mod:`.cma`) sent, and read from the peer; of those read, how many into
        #: a buffer of their own (their receive was not posted in time)
        self.direct_sent = self.direct_received = self.direct_held = 0
        #: whether large sends are lent when the peer reads us (set by the mesh: :func:`.cma.lends`)
        self.lending = False
        if segment.identity is not None:  # the peer's slot is written: it published before its HELLO/WELCOME
            why = segment.identity.probe()
            how = f"come through the ring: {why}" if why else "are read in place (direct DATA)"
            log.debug("link to rank %d: its large sends %s", peer, how)

    @property
    def fold_min_bytes(self) -> int | None:
        """What comes through the ring (from :data:`RING_MIN`) or a polled lane is read in place."""
        lane_min = super().fold_min_bytes
        return RING_MIN if lane_min is None else min(lane_min, RING_MIN)

    # -- sending ----------------------------------------------------------------------
    async def _transmit(self, kind: Kind, header: dict[str, Any], payload: memoryview | None) -> None:
        if kind is not Kind.DATA or payload is None or payload.nbytes < RING_MIN:
            if kind is Kind.DATA and self._lock.locked():  # a ring message is part-way: after it
                async with self._lock:
                    await super()._transmit(kind, header, payload)
            else:
                await super()._transmit(kind, header, payload)
            return
        if self.lends(header, payload.nbytes):
            await self._send_direct(header, payload)
            return
        await self._lock.acquire()
        job = _Outgoing(header, payload)
        try:
            done = self._push(job)
        except BaseException:
            self._lock.release()
            raise
        if done:
            self._lock.release()
            return
        task = asyncio.get_running_loop().create_task(self._finish(job))  # releases the lock
        task.add_done_callback(_retrieve)  # a caller that was cancelled never looks
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():  # the caller takes its buffer back: the task sends a copy of the rest
                job.payload = memoryview(bytes(job.payload))
            raise

    def lends(self, header: dict[str, Any], nbytes: int) -> bool:
        identity = self.segment.identity
        return (
            self.lending
            and cma.DIRECT_MIN <= nbytes <= cma.DIRECT_MAX
            and identity is not None
            and identity.peer_reads()
            and self.mailbox.lends(header)
        )

    def _write_now(self, header: dict[str, Any], payload: memoryview) -> bool:
        # the lane if it fits and is polled, else the socket (small) or the ring; none passes a ring message
        if self._lock.locked():
            return False
        if payload.nbytes >= RING_MIN:
            return self._lane_write(header, payload)
        return self._lane_write(header, payload) or super()._write_now(header, payload)

    async def _finish(self, job: _Outgoing) -> None:
        """Write the rest of ``job`` as ring space comes back."""
        try:
            while not self._push(job):
                self._room = asyncio.get_running_loop().create_future()
                await self._room
        finally:
            self._room = None
            self._lock.release()

    def _push(self, job: _Outgoing) -> bool:
        """Write pieces of ``job`` while there is room; whether it is all out.
        The headers of the pieces placed now go out together, after the last
        copy: one system call and one wake-up of the reader, not one a piece."""
        payload, n, tx, writer = job.payload, job.payload.nbytes, self.segment.tx, self._writer
        headers: list[dict[str, Any]] = []
        while job.pos < n:
            if self.lost is not None:
                raise connection_error(self.lost)
            size = min(n - job.pos, writer.piece)
            at = writer.place(size)
            if at is None:
                break
            off = at % writer.size
            tx[off : off + size] = payload[job.pos : job.pos + size]
            header = dict(job.header, z=[at, size])
            if job.pos:
                self._frames_sent += 1  # (the first is counted by send)
            else:
                header["zn"] = n
            headers.append(header)
            job.pos += size
        if headers:
            self._announce(headers)
        return job.pos == n

    def _announce(self, headers: list[dict[str, Any]]) -> None:
        """Send the headers of the pieces just placed: through the lane while the
        peer polls it, else in one socket write. After one went on the socket the
        next go there too, until the reader has given that piece's space back: a
        header in the lane must not overtake one still unread on the socket."""
        if self._writer.freed >= self._socket_upto:
            while headers and self._lane_put(encode_header(Kind.DATA, headers[0], 0), _EMPTY):
                headers = headers[1:]
        if headers:
            pos, size = headers[-1]["z"]
            self._socket_upto = pos + size
            try:
                self.proto.write_headers(Kind.DATA, headers)
            except RuntimeError:  # written after our BYE: the link is closing
                raise ConnectionResetError("the link is closing") from None

    async def _send_direct(self, header: dict[str, Any], payload: memoryview) -> None:
        """Announce where ``payload`` is and wait until the peer has read it (one copy, the
        peer's). The lock is held until then: nothing of ours overtakes the announcement."""
        await self._lock.acquire()
        try:
            if self.lost is not None:
                raise connection_error(self.lost)
            done = self._direct_done = asyncio.get_running_loop().create_future()
            self._announce_direct(dict(header, zv=[cma.address(payload), payload.nbytes]))
            self.direct_sent += 1
        except BaseException:
            self._direct_done = None
            self._lock.release()
            raise
        task = asyncio.get_running_loop().create_task(self._read_by_peer(done, payload))  # releases the lock
        task.add_done_callback(_retrieve)
        await asyncio.shield(task)  # cancelled: the task keeps the payload alive until the peer has read it

    async def _read_by_peer(self, done: asyncio.Future[None], payload: memoryview) -> None:
        try:
            await done  # (payload is referenced here until then: its memory stays where the peer reads)
        finally:
            self._direct_done = None
            self._lock.release()

    def _announce_direct(self, header: dict[str, Any]) -> None:
        """The header of direct DATA: through the lane while the peer polls it (and no ring
        header of ours is still unread on the socket), else on the socket."""
        if self._writer.freed >= self._socket_upto and self._lane_put(encode_header(Kind.DATA, header, 0), _EMPTY):
            return
        try:
            self.proto.write_headers(Kind.DATA, [header])
        except RuntimeError:  # written after our BYE: the link is closing
            raise ConnectionResetError("the link is closing") from None

    def _credit(self, header: dict[str, Any]) -> None:
        """A CREDIT of this link's own (``n: 0``): ring space back (``z``) or a direct read done (``zd``)."""
        self._frames_received += 1
        if "zd" not in header:
            self._freed(header)
            return
        count, done = header["zd"], self._direct_done
        if done is None or done.done() or count != self.direct_sent:
            raise ProtocolError(f"a direct read done ({count!r}) for no direct DATA awaiting it")
        done.set_result(None)
        if header["n"]:
            self.flow.credited(header["n"])

    def _freed(self, header: dict[str, Any]) -> None:
        """``CREDIT {z}``: the peer consumed our ring up to ``z``."""
        if self._writer.released(header.get("z")) and self._room is not None and not self._room.done():
            self._room.set_result(None)
        if header["n"]:
            self.flow.credited(header["n"])

    # -- receiving ----------------------------------------------------------------------
    def sink(self, kind: Kind, header: dict[str, Any], n: int) -> memoryview | None:
        if self._in is not None and self._poll is not None:
            self._drain_lane()  # the rest of the ring message may be in the lane, put there before this
        if self._in is not None:
            raise ProtocolError("a DATA payload on the socket while a ring message was part-way")
        self._no_direct_waiting()
        return super().sink(kind, header, n)

    def receive(self, frame: Frame) -> None:
        if self._poll is not None:  # what the lane holds was sent before this frame
            self._poll.warm()
            self._drain_lane()
        header = frame.header
        if frame.kind is Kind.BELL:
            self._frames_received += 1
        elif frame.kind is Kind.DATA and "zv" in header:
            if frame.payload.nbytes:
                raise ProtocolError("a direct DATA frame also carries a payload")
            self._direct(header)
        elif frame.kind is Kind.CREDIT and ("z" in header or "zd" in header):
            self._credit(header)  # this link's own: ring space back, or a direct read done
        elif "z" not in header:
            if frame.kind is Kind.DATA:
                if self._in is not None:
                    raise ProtocolError("a DATA frame on the socket while a ring message was part-way")
                self._no_direct_waiting()
            super().receive(frame)
        elif frame.kind is Kind.DATA:
            self._piece(frame)
        else:
            super().receive(frame)
        if self._poll is not None and frame.kind is Kind.DATA:  # held back while its payload arrived
            self._drain_lane()

    def _lane_blocked(self) -> bool:
        # a payload part-way on the socket; or a ring message part-way whose rest is
        # there, the lane's next frame waiting for it (its flow control sets _cur_n too)
        return self._lane_waits if self._in is not None else bool(self._cur_n)

    def _lane_frame(self, raw: memoryview) -> bool:
        """Eager DATA, a ring piece's header, or a ring CREDIT from the lane; eager DATA
        that finds a ring message part-way waits in the lane for the rest of it."""
        kind, header, payload = lane.parse(raw, self.proto.limits)
        if kind is Kind.CREDIT:
            self._credit(header)
        elif "zv" in header:
            self._direct(header)
        elif "z" in header:
            self._piece(Frame(Kind.DATA, header, _EMPTY))
        elif self._in is not None:
            return False
        else:
            self._no_direct_waiting()
            self._lane_data(header, payload)
        self.lane_received += 1
        return True

    def _piece(self, frame: Frame) -> None:
        """One DATA frame pointing into the peer's ring."""
        if self.lost is not None:
            return
        header = frame.header
        if frame.payload.nbytes:
            raise ProtocolError("a DATA frame pointing into the ring also carries a payload")
        self._no_direct_waiting()
        off, size = self._reader.take(header["z"])
        inc = self._in
        if "zn" in header:
            inc = self._begin(header)
        elif inc is None or any(header[k] != inc.header[k] for k in ("g", "q", "s", "c")):
            raise ProtocolError("a ring piece that belongs to no message arriving now")
        if inc.got + size > inc.n:
            raise ProtocolError(f"ring pieces of more than the {inc.n} bytes announced")
        if inc.fold is not None:
            try:
                inc.fold.apply(self.segment.rx[off : off + size])
            except ValueError as exc:
                raise ProtocolError(f"a ring piece the posted reduction cannot take: {exc}") from None
        elif inc.target is not None:
            inc.target[inc.got : inc.got + size] = self.segment.rx[off : off + size]
        inc.got += size
        self._report_soon()
        if inc.got < inc.n:
            self._frames_received += 1
            return
        self._in = None
        FramedLink.receive(self, Frame(Kind.DATA, inc.header, _EMPTY if inc.target is None else inc.target))

    def _begin(self, header: dict[str, Any]) -> _Incoming:
        """The first piece of a message: flow control and the destination, as a socket frame's sink."""
        n = header["zn"]
        if self._in is not None:
            raise ProtocolError("a ring message began before the last one ended")
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ProtocolError(f"malformed ring message length {n!r}")
        target, fold = self._destination(header, n)
        self._in = _Incoming(header, n, target, fold=fold)
        return self._in

    def _destination(self, header: dict[str, Any], n: int) -> tuple[memoryview, Fold | None]:
        """Flow control for a message of ``n`` bytes read out of shared memory (the ring or the
        peer's), and where it goes: the posted buffer, or one of its own (held, not zero-filled
        first); and the posted receive's fold, if it reduces the whole message."""
        self.admit(Kind.DATA, header, n)
        buf = self.mailbox.sink(self.peer, header, n)
        self._cur_hit = buf is not None
        if buf is None:
            return held_buffer(n), None
        fold = self.mailbox.fold(self.peer, header)
        return memoryview(buf).cast("B"), fold if fold is not None and fold.nbytes == n else None

    def _direct(self, header: dict[str, Any]) -> None:
        """Direct DATA: checked now, read once its receive is posted, or when the wait for
        that ends (:func:`.cma.post_wait`; then into a buffer of its own, as eager DATA is
        held). Either way the read runs after the callbacks ready then: the rank's own sends
        of the step, issued right after its receives are posted, are announced first, so two
        ranks lending each other read at once. Until it is read the peer sends no DATA
        (its link's lock is held until our read-done)."""
        if self.lost is not None:
            return
        identity = self.segment.identity
        if identity is None or not identity.peer_pid:
            raise ProtocolError("direct DATA from a peer this side never said it reads")
        self._no_direct_waiting()
        if self._in is not None:
            raise ProtocolError("direct DATA while a ring message was part-way")
        n = _direct_at(header["zv"])[1]
        self._waiting = header
        self._wait_timer = asyncio.get_running_loop().call_later(cma.post_wait(n), self._posted, header, False)
        self._on_posted = functools.partial(self._posted, header)
        self.mailbox.when_posted(self.peer, header, self._on_posted)

    def _no_direct_waiting(self) -> None:
        if self._waiting is not None:
            raise ProtocolError("DATA from a peer whose direct DATA has not been read yet")

    def _posted(self, header: dict[str, Any], posted: bool) -> None:
        """The receive for waiting direct DATA is posted (or its operation ended, or the wait
        did): read it soon, once."""
        if self._waiting is not header or self._wait_timer is None:
            return
        self._wait_timer.cancel()
        self._wait_timer = None
        if not posted and self._on_posted is not None:
            self.mailbox.unwait(self.peer, header, self._on_posted)
        self._on_posted = None
        asyncio.get_running_loop().call_soon(self._read_waiting, header)

    def _read_waiting(self, header: dict[str, Any]) -> None:
        """Read the waiting direct DATA; a failure breaks the link (this runs on its own)."""
        if self._waiting is not header:
            return  # the link was lost meanwhile
        self._waiting = None
        try:
            self._read_direct(header)
        except ProtocolError as exc:
            self.proto.fail(exc, tell_peer=True)
        except Exception as exc:  # noqa: BLE001 - a handler bug must not kill the event loop
            self.proto.fail(ProtocolError(f"error reading direct DATA: {exc!r}"), tell_peer=True)

    def _read_direct(self, header: dict[str, Any]) -> None:
        """Read direct DATA out of the peer's memory (into the posted buffer, or folded
        through a scratch piece, or into a held buffer), then say so and deliver it."""
        identity = self.segment.identity
        assert identity is not None  # (checked when it arrived)
        remote, n = _direct_at(header["zv"])
        target, fold = self._destination(header, n)
        try:
            if fold is not None:
                self._read_folded(identity.peer_pid, remote, fold)
            else:
                cma.read(identity.peer_pid, remote, target)
        except OSError as exc:
            raise ProtocolError(f"cannot read rank {self.peer}'s direct DATA: {exc}") from None
        self.direct_received += 1
        if not self._cur_hit:
            self.direct_held += 1
        self._say_read()
        FramedLink.receive(self, Frame(Kind.DATA, header, target))

    def _read_folded(self, pid: int, remote: int, fold: Fold) -> None:
        """Read and reduce direct DATA a scratch piece at a time (the piece stays in cache)."""
        if self._scratch is None:
            self._scratch = held_buffer(cma.FOLD_PIECE)
        n = fold.nbytes
        for at in range(0, n, cma.FOLD_PIECE):
            piece = self._scratch[: min(cma.FOLD_PIECE, n - at)]
            cma.read(pid, remote + at, piece)
            try:
                fold.apply(piece)
            except ValueError as exc:
                raise ProtocolError(f"direct DATA the posted reduction cannot take: {exc}") from None

    def _say_read(self) -> None:
        """``CREDIT {n: 0, zd}``: the peer's direct DATA has been read (``zd`` counts them)."""
        self._own_credit({"n": 0, "zd": self.direct_received})

    def _own_credit(self, header: dict[str, Any]) -> None:
        """One of this link's own CREDITs (``n: 0``): through the lane while the peer polls it, else on the socket."""
        if self._lane_put(encode_header(Kind.CREDIT, header, 0), _EMPTY):
            self._frames_sent += 1
            return
        try:
            self._emit(Kind.CREDIT, header)
        except (ConnectionError, RuntimeError):
            pass  # the link is going (or we said BYE): its end is reported on its own

    def _report_soon(self) -> None:
        """Give ring space back once the frames of this read are handled: the
        pieces of a message arrive together, and one CREDIT covers them all."""
        if not self._reporting:
            self._reporting = True
            asyncio.get_running_loop().call_soon(self._give_ring)

    def _give_ring(self) -> None:
        self._reporting = False
        upto = self._reader.report()
        if upto is not None and self.lost is None:
            self._own_credit({"n": 0, "z": upto})

    def divert(self) -> None:
        if self._in is not None:  # between pieces: the rest is consumed and dropped
            self._in.target = self._in.fold = None
        else:
            super().divert()

    # -- ending -----------------------------------------------------------------------
    def _lost(self, exc: BaseException | None) -> None:
        if self.lost is None and self._poll is not None:  # what was sent before the end still counts
            self._poll_lane()
        super()._lost(exc)
        for fut in (self._room, self._direct_done):
            if fut is not None and not fut.done():
                fut.set_exception(connection_error(self.lost))
                fut.exception()
        if self._wait_timer is not None:  # the peer's direct DATA is not read: it is gone with the link
            self._wait_timer.cancel()
            self._wait_timer = None
        if self._waiting is not None and self._on_posted is not None:
            self.mailbox.unwait(self.peer, self._waiting, self._on_posted)
        self._waiting = self._on_posted = None
        self._in = None
        self._close_lanes()
        self.segment.close()

    def stats(self) -> LinkStats:
        return replace(
            super().stats(),
            direct_sent=self.direct_sent,
            direct_received=self.direct_received,
            direct_held=self.direct_held,
        )


def _direct_at(zv: object) -> tuple[int, int]:
    """``zv: [address, n]`` of a direct DATA header, checked (ProtocolError)."""
    if not isinstance(zv, list) or len(zv) != 2 or any(isinstance(x, bool) or not isinstance(x, int) for x in zv):
        raise ProtocolError(f"malformed direct DATA location {zv!r}")
    remote, n = zv
    if not 0 < remote < 1 << 64 or not 0 < n < 1 << 63 or remote + n > 1 << 64:
        raise ProtocolError(f"direct DATA location {zv!r} out of range")
    return remote, n


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def possible() -> bool:
    """Whether this host has a shared-memory directory at all."""
    return sys.platform.startswith("linux") and os.path.isdir(shmring.SHM_DIR)


def make_segment(ring: int) -> tuple[Segment | None, str]:
    """A new segment for a pair, or None and why not."""
    try:
        return Segment.create(ring), ""
    except OSError as exc:
        size = shmring.segment_bytes(ring)
        return None, f"cannot make a {size}-byte segment in {shmring.SHM_DIR}: {exc.strerror or exc}"


def attach_segment(theirs: Capabilities, peer: int) -> tuple[Segment | None, str]:
    """Map the segment rank ``peer`` offers in ``theirs`` (and unlink its file:
    both sides have it now), or None and why not."""
    if not theirs.bits & SHM or "shm" not in theirs.extra:
        return None, f"rank {peer} does not offer it"
    try:
        segment = Segment.attach(theirs.extra["shm"])
    except ShmRefused as exc:
        return None, str(exc)
    segment.unlink()
    return segment, ""


__all__ = ["ShmLink", "RING_MIN", "possible", "make_segment", "attach_segment"]
