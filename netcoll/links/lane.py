"""The lane of a shared-memory link: whole frames through shared memory, no
system call per message (``docs/protocol.md`` §5.4). It carries small eager
DATA, the headers of ring pieces and the CREDITs that give ring space back.

A :class:`~netcoll.links.shmring.Segment` holds one lane per direction next to
its two rings. A lane is a control page and a byte ring of ``L`` bytes, a quarter of
the link's ring size within :data:`LANE_BYTES`–:data:`LANE_MAX_BYTES`
(:func:`lane_bytes`)::

    control page (4096 bytes), each word a little-endian u64 on its own cache line:
      0    head    bytes written so far (the writer's)
      64   tail    bytes consumed so far (the reader's)
      128  polled  1 while the reader polls this lane, else 0 (the reader's)
      192  sleep   even: the reader is awake; odd: asleep in epoll (the reader's)
    data (L bytes)

A record is ``u32 n, u32 0`` then one frame exactly as on the socket (prefix,
msgpack header, payload), padded to 8 bytes; ``n = 0`` means "skip to the
start of the ring" (a record never wraps). The writer copies a record in and
then moves ``head``; the reader reads ``head``, copies frames out, then moves
``tail``. Each word has one writer and is read and written whole (ctypes'
aligned 8-byte loads and stores), and x86-64 keeps stores in order with
stores and loads with loads, so a reader never sees a ``head`` ahead of the
bytes it covers. Lanes are used on x86-64 only (:func:`supported`).

Waking a sleeping reader is the one place where a store must be ordered
before a load (Dekker's pattern): the reader stores ``sleep`` (odd), then
loads ``head`` once more before it blocks; the writer stores ``head``, then
loads ``sleep`` and rings the socket (a BELL frame) if it is odd and it has
not rung for that sleep yet. A full fence between each store and its load
(:func:`fence`: a lock acquired and released, a locked instruction on x86)
means at least one side sees the other's store: a message is never left in a
lane while its reader sleeps.

Sans-IO: nothing here touches sockets or the event loop.
"""

from __future__ import annotations

import ctypes
import platform
import struct
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Final

from .. import settings, wire
from ..errors import ProtocolError

if TYPE_CHECKING:
    from ..loop import SpinSelector

LANE_CONTROL: Final = 4096
#: the smallest lane (rings of up to 1 MiB) and the largest (rings of 4 MiB and more)
LANE_BYTES: Final = 256 << 10
LANE_MAX_BYTES: Final = 1 << 20
LANE_SPAN: Final = LANE_CONTROL + LANE_BYTES  # the smallest lane with its control page
#: room for a frame's prefix and header beside a payload of a quarter lane
_HEADER_ROOM: Final = 4096
#: what a lane may carry (:func:`parse`)
_LANE_KINDS: Final = frozenset({wire.Kind.DATA, wire.Kind.CREDIT})


def lane_bytes(ring: int) -> int:
    """The data bytes of each lane of a segment whose rings have ``ring`` bytes."""
    return max(LANE_BYTES, min(LANE_MAX_BYTES, ring // 4 // 4096 * 4096))


def lane_span(ring: int) -> int:
    """One direction's lane in a segment with rings of ``ring`` bytes (control page and data)."""
    return LANE_CONTROL + lane_bytes(ring)


def record_max(size: int) -> int:
    """The largest record (8-byte record header and frame) of a lane of ``size`` data bytes;
    larger frames take the ring or the socket. A payload of a quarter lane fits, with up to 4 KiB of
    prefix and header: at least 64 KiB (``shm.RING_MIN``), so every payload below the ring fits
    the smallest lane, and up to 256 KiB with 4 MiB rings. Measured (2026-11-26, 4 ranks): a
    256 KiB all_reduce took 1167–1185 µs through 1 MiB lanes against 2069–2678 µs through the ring,
    whose every piece is announced on the socket (a system call and a wake-up)."""
    return size // 4 + _HEADER_ROOM


#: the largest record of the smallest lane (68 KiB)
LANE_RECORD_MAX: Final = record_max(LANE_BYTES)
_REC: Final = struct.Struct("<II")
_HEAD, _TAIL, _POLLED, _SLEEP = 0, 64, 128, 192
_FENCE: Final = threading.Lock()
#: empty polls in a row before a reader stops polling a lane and waits for its bell
COLD_AFTER: Final = 2000


def supported() -> bool:
    """Whether lanes are used on this machine (x86-64: its ordering rules are the ones relied on)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def enabled() -> bool:
    """Whether shm links send small frames through lanes: on x86-64, unless
    ``NETCOLL_SHM_LANE=0`` (ValueError for a value other than 0 or 1)."""
    return settings.shm_lane() and supported()


def parse(raw: memoryview, limits: wire.FrameLimits) -> tuple[wire.Kind, dict[str, Any], memoryview]:
    """The kind, header and payload of one frame read from a lane, checked as a
    socket frame is (ProtocolError). It must be whole, and one of: eager DATA
    (no ``z``, no ``rz``); a ring piece's header-only DATA (``z``); a ring
    CREDIT (``{n: 0, z}``)."""
    if raw.nbytes < wire.PREFIX_SIZE:
        raise ProtocolError(f"a lane record of {raw.nbytes} bytes is shorter than a frame prefix")
    kind, _, hlen, plen = wire.decode_prefix(raw[: wire.PREFIX_SIZE], limits)
    if kind not in _LANE_KINDS or wire.PREFIX_SIZE + hlen + plen != raw.nbytes:
        raise ProtocolError(f"a lane record holds a {kind.name} frame or one of another length")
    header = wire.decode_header(kind, raw[wire.PREFIX_SIZE : wire.PREFIX_SIZE + hlen])
    if kind is wire.Kind.CREDIT:
        if header["n"] != 0 or ("z" not in header and "zd" not in header):
            raise ProtocolError("a CREDIT in a lane may only give ring space back ({n: 0, z}) or say a read done (zd)")
    elif "z" in header or "zv" in header:
        if plen:
            raise ProtocolError("a ring piece's or direct DATA's header in a lane also carries a payload")
    elif "rz" in header:
        raise ProtocolError("a DATA frame in a lane is eager or a ring piece's header")
    return kind, header, raw[wire.PREFIX_SIZE + hlen :]


def fence() -> None:
    """A full memory fence: an uncontended lock taken and given back."""
    _FENCE.acquire()
    _FENCE.release()


def record_bytes(frame_bytes: int) -> int:
    """The lane space a frame of ``frame_bytes`` takes (record header, padding)."""
    return (_REC.size + frame_bytes + 7) & ~7


class _Words:
    """The four control words of one lane."""

    def __init__(self, lane: memoryview) -> None:
        self.head = ctypes.c_uint64.from_buffer(lane, _HEAD)
        self.tail = ctypes.c_uint64.from_buffer(lane, _TAIL)
        self.polled = ctypes.c_uint64.from_buffer(lane, _POLLED)
        self.sleep = ctypes.c_uint64.from_buffer(lane, _SLEEP)


def _data_of(lane: memoryview) -> memoryview:
    """The data part of a lane (``lane``: its control page and data; ValueError if the
    data is not a whole number of pages within the lane sizes)."""
    size = lane.nbytes - LANE_CONTROL
    if size % 4096 or not LANE_BYTES <= size <= LANE_MAX_BYTES:
        raise ValueError(f"a lane holds {LANE_BYTES}-{LANE_MAX_BYTES} bytes in whole pages, not {size}")
    return lane[LANE_CONTROL:]


class _LaneEnd:
    """One side's view of a lane (``lane``: its control page and data, :func:`lane_span` bytes)."""

    def __init__(self, lane: memoryview) -> None:
        self._data = _data_of(lane)
        self._w: _Words | None = _Words(lane)
        self.size = self._data.nbytes
        #: the largest record this lane takes (:func:`record_max`)
        self.record_max = record_max(self.size)


class LaneWriter(_LaneEnd):
    """This side's outgoing lane."""

    def __init__(self, lane: memoryview) -> None:
        super().__init__(lane)
        self._rung = 0  # the reader's sleep we rang the bell for

    def polled(self) -> bool:
        """Whether the reader polls the lane (else frames go on the socket)."""
        w = self._w
        return w is not None and w.polled.value == 1

    def put(self, head: bytes, payload: memoryview) -> bool:
        """Copy one frame (``head``: prefix and header; then ``payload``) into the
        lane and publish it; False (nothing written) if its record would be
        larger than :attr:`record_max` or there is no room."""
        w = self._w
        n = len(head) + payload.nbytes
        need = record_bytes(n)
        if w is None or need > self.record_max:
            return False
        size = self.size
        pos = w.head.value
        off = pos % size
        skip = size - off if off + need > size else 0
        if pos + skip + need - w.tail.value > size:
            return False
        data = self._data
        if skip:
            _REC.pack_into(data, off, 0, 0)
            pos, off = pos + skip, 0
        _REC.pack_into(data, off, n, 0)
        start = off + _REC.size
        data[start : start + len(head)] = head
        data[start + len(head) : start + n] = payload
        w.head.value = pos + need
        return True

    def should_ring(self) -> bool:
        """After :meth:`put`: whether the reader sleeps and must be woken (at
        most once per sleep). Fences first: see the module doc."""
        w = self._w
        if w is None:
            return False
        fence()
        s = w.sleep.value
        if s & 1 and s != self._rung:
            self._rung = s
            return True
        return False

    def close(self) -> None:
        self._w = None
        self._data.release()


class LaneReader(_LaneEnd):
    """The peer's lane into this side: frames out, and the words that say this side polls and sleeps."""

    def __init__(self, lane: memoryview) -> None:
        super().__init__(lane)
        assert self._w is not None
        self._w.polled.value = 1

    def pending(self) -> bool:
        """Whether the writer has published anything not yet consumed."""
        w = self._w
        return w is not None and w.head.value != w.tail.value

    def frames(self) -> Generator[memoryview, None, None]:
        """Each frame published so far, in order (a view into the lane: copy
        what must outlive the next step). A frame is consumed when the next one
        is asked for; the space of those consumed is given back when the
        iteration ends. Closing the iterator while it holds a frame leaves that
        frame in the lane, to be read again. ProtocolError for a record that
        cannot be one."""
        w = self._w
        if w is None:
            return
        size, data = self.size, self._data
        head, tail = w.head.value, w.tail.value
        if head - tail > size or head < tail:
            raise ProtocolError(f"lane head {head} outside [{tail}, {tail + size}]")
        try:
            while tail < head:
                off = tail % size
                n, pad = _REC.unpack_from(data, off)
                if n == 0 and pad == 0:  # the rest of the ring is skipped
                    tail += size - off
                    continue
                need = record_bytes(n)
                if pad or need > self.record_max or off + need > size or tail + need > head:
                    raise ProtocolError(f"malformed lane record of {n} bytes at {tail}")
                yield data[off + _REC.size : off + _REC.size + n]
                tail += need
        finally:
            if self._w is not None:
                self._w.tail.value = tail

    def sleep(self) -> None:
        """About to block: the writer must ring from now on. Fences after
        saying so; the caller then looks for frames once more (see the module doc)."""
        w = self._w
        if w is not None:
            if not w.sleep.value & 1:
                w.sleep.value += 1
            fence()

    def wake(self) -> None:
        """Awake again: no bell needed."""
        w = self._w
        if w is not None and w.sleep.value & 1:
            w.sleep.value += 1

    def close(self) -> None:
        """Stop polling: the writer uses the socket from now on."""
        w, self._w = self._w, None
        if w is not None:
            w.polled.value = 0
            w.sleep.value = 0
        self._data.release()


class LanePoll:
    """One lane as a poller of its loop's selector, left to the bell while idle.

    ``drain()`` handles what the lane holds (never raising) and says whether
    there was anything. After :data:`COLD_AFTER` empty polls in a row the lane
    goes *cold*: it says it sleeps, for good, and leaves the selector, so a
    rank with many quiet peers polls only the lanes in use; the writer rings
    the next frame's BELL, and the link calls :meth:`warm` for any frame that
    arrives on its socket."""

    def __init__(self, reader: LaneReader, selector: SpinSelector, drain: Callable[[], bool]) -> None:
        self.reader, self.selector, self._drain = reader, selector, drain
        self.cold = False
        self._idle = 0
        selector.add_poller(self)

    def poll(self) -> bool:
        if self._drain():
            self._idle = 0
            return True
        self._idle += 1
        if self._idle >= COLD_AFTER:
            self._cool()
        return False

    def sleep(self) -> None:
        if not self.cold:
            self.reader.sleep()

    def wake(self) -> None:
        if not self.cold:
            self.reader.wake()

    def _cool(self) -> None:
        self.cold = True
        self.selector.remove_poller(self)
        self.reader.sleep()  # (fenced) from now on a writer rings
        if self._drain():  # a frame raced in before the writer could see that
            self.warm()

    def warm(self) -> None:
        """Something came on the socket (a BELL): poll the lane again."""
        if self.cold:
            self.cold, self._idle = False, 0
            self.reader.wake()
            self.selector.add_poller(self)

    def close(self) -> None:
        """Stop polling, for good: the writer uses the socket from now on."""
        if not self.cold:
            self.cold = True
            self.selector.remove_poller(self)
        self.reader.close()


__all__ = [
    "LANE_BYTES",
    "LANE_CONTROL",
    "LANE_MAX_BYTES",
    "LANE_RECORD_MAX",
    "LANE_SPAN",
    "COLD_AFTER",
    "LanePoll",
    "LaneReader",
    "LaneWriter",
    "lane_bytes",
    "lane_span",
    "record_max",
    "enabled",
    "fence",
    "parse",
    "record_bytes",
    "supported",
]
