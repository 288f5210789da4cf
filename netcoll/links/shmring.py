"""Shared-memory segments and the ring bookkeeping of ``shm`` links
(:mod:`netcoll.links.shm`); the rings themselves are sans-IO.

A :class:`Segment` is one file directly under ``/dev/shm``, made by the
dialing rank of a pair and mapped by both. Layout (``docs/protocol.md`` §5.4)::

    0         header (4096 bytes): magic b"NCSHM4\\0\\0", u64 ring size R (little-endian),
              16-byte nonce; at 64 and 96 the two sides' identities for direct DATA
              (:mod:`netcoll.links.cma`)
    4096      ring 0, R bytes: dialer -> acceptor
    4096+R    ring 1, R bytes: acceptor -> dialer
    4096+2R   lane 0, LS = lane_span(R) bytes: dialer -> acceptor (:mod:`netcoll.links.lane`)
    ...+LS    lane 1, LS bytes: acceptor -> dialer

The positions of both rings travel in frames over the pair's socket (``z`` in
DATA, ``z`` in CREDIT): the rings share no counters. The lanes, which carry
small frames without a system call, do (:mod:`netcoll.links.lane`).

The file is created ``O_CREAT | O_EXCL`` with mode ``0600`` under a random
name (``netcoll-<pid>-<32 hex>``), its pages reserved with
``posix_fallocate`` (a full ``/dev/shm`` is then an ``OSError`` here, not a
``SIGBUS`` later), and unlinked as soon as the peer has mapped it (or the
pair does not use it): a crash after the handshake leaks nothing. A file
can only outlive a handshake if its maker died during it; making a segment
first removes such files (netcoll names older than :data:`STALE_AFTER`
seconds, which no live handshake can be).

:class:`RingWriter` / :class:`RingReader` are one ring's positions on each
side. Positions are absolute byte counts (they only grow); a piece occupies
``[pos, pos + n)`` at offset ``pos % R`` and never wraps: when the rest of
the ring is too short the writer skips to its start. The reader consumes
every piece as soon as its frame arrives, so its position is where the next
piece must start; it gives the space back in batches of ``R / 4``. Pieces
are at most ``R / 4``, which guarantees a writer waiting for room gets it
once the reader has caught up: no "I am waiting" message is needed.
"""

from __future__ import annotations

import hmac
import mmap
import os
import re
import secrets
import stat
import struct
import time
from typing import Any, Final

from ..errors import ProtocolError
from . import cma
from .lane import lane_span

SHM_DIR: Final = "/dev/shm"
HEADER_BYTES: Final = 4096
MAGIC: Final = b"NCSHM4\0\0"
_HEAD: Final = struct.Struct("<8sQ16s")
NONCE_BYTES: Final = 16
MIN_RING: Final = 64 << 10
MAX_RING: Final = 1 << 30
DEFAULT_RING: Final = 4 << 20
#: rings of one rank (both directions, every peer on the host) hold at most about this
#: much when the ring size is not set: 4 MiB rings up to 9 ranks, smaller beyond
RANK_BUDGET: Final = 64 << 20
#: names a peer may ask us to open: nothing that could leave the directory
NAME: Final = re.compile(r"netcoll-[0-9]{1,10}-[0-9a-f]{32}\Z")
#: a segment file this old was left by a rank that died in its handshake (which lasts seconds)
STALE_AFTER: Final = 600.0


class ShmRefused(Exception):
    """A segment cannot be made or mapped here (the reason is the message)."""


def check_ring(size: object, what: str = "the shared-memory ring size") -> int:
    """``size`` if it is a valid ring size (an int, a multiple of 4096, in range), else ValueError."""
    if isinstance(size, bool) or not isinstance(size, int) or not MIN_RING <= size <= MAX_RING or size % 4096:
        raise ValueError(f"{what} must be a multiple of 4 KiB from {MIN_RING} to {MAX_RING} bytes, got {size!r}")
    return size


def auto_ring(peers: int) -> int:
    """The ring size when none is configured, for a rank with ``peers`` peers."""
    share = RANK_BUDGET // (2 * max(1, peers)) // 4096 * 4096
    return max(256 << 10, min(DEFAULT_RING, share))


class Segment:
    """One mapped segment: ``tx`` is the ring this side writes, ``rx`` the one it reads."""

    def __init__(self, path: str, fd: int, ring: int, nonce: bytes, *, creator: bool) -> None:
        self.path = path
        self.ring = ring
        self.nonce = nonce
        self.creator = creator
        try:  # MAP_POPULATE: map every page now, not on the first lap of each ring
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._mm: mmap.mmap | None = mmap.mmap(fd, segment_bytes(ring), flags=flags)
        finally:
            os.close(fd)  # the mapping stays valid without it
        self._view = view = memoryview(self._mm)
        lanes = HEADER_BYTES + 2 * ring
        first, second = view[HEADER_BYTES : HEADER_BYTES + ring], view[HEADER_BYTES + ring : lanes]
        self.tx, self.rx = (first, second) if creator else (second, first)
        span = lane_span(ring)
        first, second = view[lanes : lanes + span], view[lanes + span : lanes + 2 * span]
        #: this side's outgoing lane and the peer's lane into it (control page + data each)
        self.lane_tx, self.lane_rx = (first, second) if creator else (second, first)
        self._head_page = view[:HEADER_BYTES]
        #: who this side is for direct DATA (:mod:`.cma`): published before the handshake goes on
        self.identity: cma.Identity | None = None
        if cma.enabled():
            self.identity = cma.Identity(self._head_page, nonce, creator=creator)
            self.identity.publish()

    @classmethod
    def create(cls, ring: int, directory: str = SHM_DIR) -> Segment:
        """A new segment with a fresh nonce (OSError if ``directory`` cannot hold it)."""
        check_ring(ring)
        sweep(directory)
        path = os.path.join(directory, f"netcoll-{os.getpid()}-{secrets.token_hex(16)}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        nonce = secrets.token_bytes(NONCE_BYTES)
        try:
            os.posix_fallocate(fd, 0, segment_bytes(ring))
            os.pwrite(fd, _HEAD.pack(MAGIC, ring, nonce), 0)
        except BaseException:
            os.close(fd)
            _unlink(path)
            raise
        try:
            return cls(path, fd, ring, nonce, creator=True)
        except BaseException:
            _unlink(path)
            raise

    @classmethod
    def attach(cls, offer: object, directory: str = SHM_DIR) -> Segment:
        """Map the peer's segment described by ``offer`` (``{name, nonce, size}``)
        and check it is the one the peer made: ShmRefused (with the reason) if not."""
        name, nonce, ring = _parse_offer(offer)
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise ShmRefused(f"cannot open {path}: {exc.strerror} (not on this host, or no shared IPC)") from None
        try:
            st = os.fstat(fd)
            head = os.pread(fd, _HEAD.size, 0)
        except OSError as exc:
            os.close(fd)
            raise ShmRefused(f"cannot read {path}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode) or st.st_size != segment_bytes(ring) or len(head) != _HEAD.size:
            os.close(fd)
            raise ShmRefused(f"{path} is not a segment of {ring}-byte rings")
        magic, size, theirs = _HEAD.unpack(head)
        if magic != MAGIC or size != ring or not hmac.compare_digest(theirs, nonce):
            os.close(fd)
            raise ShmRefused(f"{path} does not hold the peer's nonce (another host's segment of that name?)")
        try:
            return cls(path, fd, ring, nonce, creator=False)
        except OSError as exc:  # (the fd is closed)
            raise ShmRefused(f"cannot map {path}: {exc.strerror or exc}") from None

    def offer(self) -> dict[str, Any]:
        """What the handshake announces: ``{name, nonce, size}``."""
        return {"name": os.path.basename(self.path), "nonce": self.nonce, "size": self.ring}

    def unlink(self) -> None:
        """Remove the file (the mappings stay valid); no error if it is gone."""
        _unlink(self.path)

    def close(self) -> None:
        """Unmap (once every view of the rings is gone; until then the GC will)."""
        mm, self._mm = self._mm, None
        if mm is None:
            return
        for view in (self.tx, self.rx, self.lane_tx, self.lane_rx, self._head_page, self._view):
            try:
                view.release()
            except BufferError:  # a lane's words are still referenced: the GC unmaps it
                pass
        try:
            mm.close()
        except BufferError:  # a view is still alive somewhere: unmapped when it is collected
            pass


def segment_bytes(ring: int) -> int:
    """The size of a segment with rings of ``ring`` bytes."""
    return HEADER_BYTES + 2 * ring + 2 * lane_span(ring)


def sweep(directory: str = SHM_DIR, now: float | None = None) -> list[str]:
    """Remove segment files older than :data:`STALE_AFTER` (ours or any user's we
    may delete); the names removed."""
    now = time.time() if now is None else now
    removed: list[str] = []
    try:
        names = [name for name in os.listdir(directory) if NAME.match(name)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        try:
            if now - os.lstat(path).st_mtime > STALE_AFTER:
                os.unlink(path)
                removed.append(name)
        except OSError:  # gone already, or another user's
            continue
    return removed


def _parse_offer(offer: object) -> tuple[str, bytes, int]:
    if not isinstance(offer, dict):
        raise ShmRefused(f"malformed shared-memory offer {offer!r}")
    name, nonce, ring = offer.get("name"), offer.get("nonce"), offer.get("size")
    if not isinstance(name, str) or not NAME.match(name):
        raise ShmRefused(f"bad segment name {name!r}")
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise ShmRefused("bad segment nonce")
    try:
        return name, nonce, check_ring(ring, "the offered ring size")
    except ValueError as exc:
        raise ShmRefused(str(exc)) from None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class RingWriter:
    """The sending side of one ring: where the next piece goes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.piece = size // 4  # the largest piece
        self.head = 0  # bytes placed so far
        self.freed = 0  # bytes the reader gave back so far

    def place(self, n: int) -> int | None:
        """The position of a new piece of ``0 < n <= piece`` bytes, or None if there is no room yet."""
        pos = self.head
        off = pos % self.size
        if off + n > self.size:  # it would wrap: skip to the start
            pos += self.size - off
        if pos + n - self.freed > self.size:
            return None
        self.head = pos + n
        return pos

    def released(self, upto: object) -> bool:
        """The reader consumed everything before ``upto``; whether that frees anything.
        An older position than one already heard of changes nothing: a CREDIT
        through the lane may overtake one on the socket."""
        if isinstance(upto, bool) or not isinstance(upto, int) or not 0 <= upto <= self.head:
            raise ProtocolError(f"ring position {upto!r} outside [0, {self.head}]")
        if upto <= self.freed:
            return False
        self.freed = upto
        return True


class RingReader:
    """The receiving side of one ring: checks each piece and says when to give space back."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.tail = 0  # bytes consumed so far
        self.reported = 0  # ...of which the writer has been told

    def take(self, piece: object) -> tuple[int, int]:
        """Check a piece ``[pos, n]`` from a frame and consume it: its ``(offset, n)``
        in the ring. ProtocolError for anything out of order or out of bounds."""
        if not isinstance(piece, list) or len(piece) != 2:
            raise ProtocolError(f"malformed ring piece {piece!r}")
        pos, n = piece
        if any(isinstance(x, bool) or not isinstance(x, int) for x in (pos, n)):
            raise ProtocolError(f"malformed ring piece {piece!r}")
        tail, size = self.tail, self.size
        if pos not in (tail, tail + (-tail) % size):
            raise ProtocolError(f"ring piece at {pos}, expected {tail}")
        off = pos % size
        if not 0 < n <= size // 4 or off + n > size or pos + n > self.reported + size:
            raise ProtocolError(f"ring piece [{pos}, +{n}] outside the {size}-byte ring")
        self.tail = pos + n
        return off, n

    def report(self) -> int | None:
        """The position to give back now (a quarter of the ring consumed), or None."""
        if self.tail - self.reported < self.size // 4:
            return None
        self.reported = self.tail
        return self.tail


__all__ = [
    "SHM_DIR",
    "DEFAULT_RING",
    "RANK_BUDGET",
    "auto_ring",
    "MIN_RING",
    "MAX_RING",
    "NAME",
    "Segment",
    "ShmRefused",
    "RingWriter",
    "RingReader",
    "check_ring",
    "sweep",
    "STALE_AFTER",
    "segment_bytes",
]
