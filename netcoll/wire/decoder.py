"""The incremental, sans-IO frame decoder: bytes in any pieces, whole frames out;
payload buffers are the caller's (a sink) or grow as bytes arrive."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Final

from ..errors import ProtocolError
from .frames import (
    DEFAULT_LIMITS,
    PREFIX_SIZE,
    SCHEMA,
    Frame,
    FrameLimits,
    Kind,
    decode_header,
    decode_prefix,
)


class Pieces(abc.ABC):
    """A payload's destination that takes it piece by piece (a receive that reduces
    the payload as it reads it, through one small buffer that stays in cache).

    The decoder writes the next bytes of the payload into :meth:`room` (an I/O layer
    may ``recv_into`` it, as into a posted buffer) and reports how many with
    :meth:`took`; when the payload is complete the frame carries :attr:`result`.
    """

    __slots__ = ()

    #: what the complete frame carries as its payload
    result: memoryview

    @abc.abstractmethod
    def room(self) -> memoryview:
        """Where the next payload bytes go: non-empty while any are left, never
        longer than what is left."""

    @abc.abstractmethod
    def took(self, n: int) -> None:
        """``n`` bytes were written at the start of the last :meth:`room`."""


#: ``sink(kind, header, payload_len)`` returns a writable buffer of exactly
#: ``payload_len`` bytes for the payload, a :class:`Pieces` that takes exactly
#: that many, or ``None`` to let the decoder allocate.
Sink = Callable[[Kind, dict[str, Any], int], "memoryview | bytearray | Pieces | None"]

#: The decoder's own payload buffers grow in chunks of at most this many bytes,
#: allocated as the bytes arrive: a declared length alone never allocates more.
CHUNK: Final = 1 << 20
_UNINIT_MIN: Final = 64 * 1024  # chunks this big skip zero-filling (numpy.empty)
_DROP_BYTES: Final = 64 * 1024  # scratch that the rest of a diverted payload is read into

_PREFIX, _HEADER, _PAYLOAD, _BROKEN = range(4)
_SINK, _OWN, _DROP = range(3)  # where the current payload goes (the sink: a buffer or a Pieces)
_EMPTY: Final = memoryview(b"")


def _chunk(n: int) -> memoryview:
    """``n`` writable bytes (n <= CHUNK), uninitialized when large."""
    if n >= _UNINIT_MIN:
        import numpy  # lazily: wire users that never see a large payload do not pay the import

        return numpy.empty(n, dtype=numpy.uint8).data
    return memoryview(bytearray(n))


def _give(pieces: Pieces, data: memoryview) -> memoryview:
    """A whole payload, already here, handed to ``pieces``; the frame's payload."""
    pos, n = 0, len(data)
    while pos < n:
        room = pieces.room()
        take = min(len(room), n - pos)
        room[:take] = data[pos : pos + take]
        pieces.took(take)
        pos += take
    return pieces.result


def _join(chunks: list[memoryview], size: int) -> memoryview:
    import numpy

    out = numpy.empty(size, dtype=numpy.uint8).data
    pos = 0
    for c in chunks:
        out[pos : pos + len(c)] = c
        pos += len(c)
    return out


class FrameDecoder:
    """Incremental decoder: ``feed`` bytes in any pieces, get whole frames out.

    Between frames the decoder buffers at most one prefix and one header
    (bounded by ``limits.max_header``). A payload goes into the buffer the
    ``sink`` returns for it, or else into the decoder's own buffer, which grows
    in chunks of at most :data:`CHUNK` bytes as the bytes arrive (joined when
    the frame is complete): a frame that merely *declares* a large payload
    costs nothing. While a payload is incomplete, :meth:`payload_target` is
    the unfilled room of its current destination; an I/O layer may write into
    it directly and report with :meth:`payload_written` (a view from
    :meth:`payload_target` is valid until the next call into the decoder).
    After a :class:`ProtocolError` the decoder is broken and keeps raising.
    """

    def __init__(
        self,
        limits: FrameLimits = DEFAULT_LIMITS,
        sink: Sink | None = None,
        unlock: tuple[Kind, FrameLimits] | None = None,
    ) -> None:
        self.limits = limits
        self.sink = sink
        #: (kind, limits): once a frame of ``kind`` is decoded, later frames are
        #: checked against these limits, even later frames of the same ``feed``
        #: (a client raises its handshake limits at the server's WELCOME).
        self.unlock = unlock
        self._state = _PREFIX
        self._buf = bytearray()
        self._kind = Kind.PING
        self._flags = 0
        self._header_len = 0
        self._payload_len = 0
        self._header: dict[str, Any] = {}
        self._mode = _SINK
        self._target: memoryview = _EMPTY  # the current destination: a posted buffer, a chunk, or scratch
        self._tfill = 0  # bytes of _target filled
        self._filled = 0  # bytes of the payload received
        self._chunks: list[memoryview] = []  # own mode: the chunks filled before _target
        self._diverted = False
        self._drop: memoryview | None = None
        self._pieces: Pieces | None = None  # the sink's taker of the current payload, if it gave one

    @property
    def at_boundary(self) -> bool:
        """True when no partial frame is buffered."""
        return self._state == _PREFIX and not self._buf

    @property
    def payload_left(self) -> int:
        """Bytes of the current frame's payload not received yet (0 outside a payload)."""
        return self._payload_len - self._filled if self._state == _PAYLOAD else 0

    def payload_target(self) -> memoryview | None:
        if self._state != _PAYLOAD:
            return None
        return self._target[self._tfill :]

    def payload_written(self, n: int) -> Frame | None:
        """``n`` bytes were written into :meth:`payload_target`; return the frame if complete."""
        if self._state != _PAYLOAD or n < 0 or self._tfill + n > len(self._target):
            raise ProtocolError("payload_written outside a payload or past its end")
        return self._advance(n)

    def divert(self) -> None:
        """Stop writing the current payload into its posted buffer (the receive
        it was posted for is gone): the rest of it is read and dropped, and the
        frame comes out with ``diverted=True`` and an empty payload."""
        if self._state == _PAYLOAD and self._mode == _SINK:
            self._mode, self._diverted, self._pieces = _DROP, True, None
            self._set_drop()

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Decode ``data``; return the frames it completes. (The sink of a
        later frame may run before an earlier frame is handled: use
        :meth:`feed_each` when that matters.)"""
        out: list[Frame] = []
        self.feed_each(data, out.append)
        return out

    def feed_each(self, data: bytes | bytearray | memoryview, on_frame: Callable[[Frame], None]) -> None:
        """Decode ``data``, calling ``on_frame`` for each frame as soon as it is
        complete, before the next frame's header reaches the sink: a receiver
        sees ``sink(frame 1)``, ``on_frame(frame 1)``, ``sink(frame 2)``, ... An
        exception from ``on_frame`` breaks the decoder, like one from the sink."""
        if self._state == _BROKEN:
            raise ProtocolError("decoder is broken by an earlier protocol error")
        if isinstance(data, memoryview) and data.format == "B" and data.ndim == 1:
            mv = data
        else:
            mv = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        try:
            self._feed(mv, on_frame)
        except BaseException:  # the stream position is now unknown (a sink may raise too)
            self._state = _BROKEN
            raise

    def _feed(self, mv: memoryview, emit: Callable[[Frame], None]) -> None:
        pos, n = 0, len(mv)
        while pos < n:
            if self._state == _PREFIX and n - pos >= PREFIX_SIZE and not self._buf:
                # fast path: a whole frame in this chunk (what small messages are)
                kind, flags, hlen, plen = decode_prefix(mv[pos : pos + PREFIX_SIZE], self.limits)
                start = pos + PREFIX_SIZE
                end = start + hlen + plen
                if hlen and end <= n:
                    header = decode_header(kind, mv[start : start + hlen])
                    target = self._sink_buffer(kind, header, plen) if (self.sink and plen) else None
                    if target is None:  # the bytes are all here: a copy of exactly them
                        target = memoryview(bytearray(mv[start + hlen : end])) if plen else _EMPTY
                    elif isinstance(target, Pieces):
                        target = _give(target, mv[start + hlen : end])
                    else:
                        target[:] = mv[start + hlen : end]
                    if self.unlock is not None and kind == self.unlock[0]:
                        self.limits, self.unlock = self.unlock[1], None
                    pos = end
                    emit(Frame(kind, header, target, flags))
                    continue
                self._kind, self._flags, self._header_len, self._payload_len = kind, flags, hlen, plen
                self._state = _HEADER
                pos = start
                if hlen == 0:
                    frame = self._on_header(b"")
                    if frame is not None:
                        emit(frame)
                continue
            if self._state == _PAYLOAD:
                take = min(len(self._target) - self._tfill, n - pos)
                if self._mode != _DROP:
                    self._target[self._tfill : self._tfill + take] = mv[pos : pos + take]
                pos += take
                frame = self._advance(take)
                if frame is not None:
                    emit(frame)
                continue
            want = PREFIX_SIZE if self._state == _PREFIX else self._header_len
            if not self._buf and n - pos >= want:  # fast path: whole piece in this chunk
                piece: bytes | memoryview = mv[pos : pos + want]
                pos += want
            else:
                take = min(want - len(self._buf), n - pos)
                self._buf += mv[pos : pos + take]
                pos += take
                if len(self._buf) < want:
                    break
                piece, self._buf = bytes(self._buf), bytearray()
            frame = self._on_prefix(piece) if self._state == _PREFIX else self._on_header(piece)
            if frame is not None:
                emit(frame)

    def _on_prefix(self, piece: bytes | memoryview) -> Frame | None:
        self._kind, self._flags, self._header_len, self._payload_len = decode_prefix(piece, self.limits)
        self._state = _HEADER
        if self._header_len == 0:
            return self._on_header(b"")
        return None

    def _on_header(self, piece: bytes | memoryview) -> Frame | None:
        self._header = decode_header(self._kind, piece) if piece else self._empty_header()
        size = self._payload_len
        self._state, self._filled, self._tfill, self._diverted = _PAYLOAD, 0, 0, False
        if size == 0:
            self._target = _EMPTY
            return self._finish()
        target = self._sink_buffer(self._kind, self._header, size) if self.sink else None
        if target is None:
            self._mode, self._target = _OWN, _chunk(min(size, CHUNK))
        elif isinstance(target, Pieces):
            self._mode, self._pieces, self._target = _SINK, target, target.room()
        else:
            self._mode, self._target = _SINK, target
        return None

    def _advance(self, n: int) -> Frame | None:
        """``n`` more payload bytes are in place; move on to the next chunk, or finish."""
        self._filled += n
        left = self._payload_len - self._filled
        if self._pieces is not None:  # a Pieces takes the payload: hand the bytes on, then the next room
            if n:
                self._pieces.took(n)
            if left:
                self._target = self._pieces.room()
                return None
        else:
            self._tfill += n
        if left == 0:
            return self._finish()
        if self._tfill == len(self._target):  # own chunk or drop scratch full (a posted buffer never is)
            if self._mode == _OWN:
                self._chunks.append(self._target)
                self._target, self._tfill = _chunk(min(left, CHUNK)), 0
            else:
                self._set_drop()
        return None

    def _set_drop(self) -> None:
        if self._drop is None:
            self._drop = memoryview(bytearray(_DROP_BYTES))
        self._target = self._drop[: min(_DROP_BYTES, self._payload_len - self._filled)]
        self._tfill = 0

    def _sink_buffer(self, kind: Kind, header: dict[str, Any], size: int) -> memoryview | Pieces | None:
        """The sink's buffer for a payload of ``size`` bytes, checked; None: allocate."""
        target = self.sink(kind, header, size)  # type: ignore[misc]
        if target is None or isinstance(target, Pieces):
            return target
        try:  # always a flat byte view, so slicing and len() count bytes, not items
            tmv = memoryview(target).cast("B")
        except (TypeError, ValueError) as exc:  # not a buffer, not C-contiguous, or e.g. bfloat16
            raise ProtocolError(
                f"the posted payload buffer is unusable ({exc}); post a C-contiguous "
                "writable byte view such as arr.view(numpy.uint8)"
            ) from None
        if tmv.readonly or tmv.nbytes != size:
            raise ProtocolError(f"payload of {size} bytes does not fit the posted buffer of {tmv.nbytes}")
        return tmv

    def _empty_header(self) -> dict[str, Any]:
        if SCHEMA[self._kind]:
            raise ProtocolError(f"{self._kind.name} frame without a header")
        return {}

    def _finish(self) -> Frame:
        if self._diverted:
            payload = _EMPTY
        elif self._pieces is not None:
            payload, self._pieces = self._pieces.result, None
        elif self._chunks:
            payload = _join([*self._chunks, self._target], self._payload_len)
            self._chunks = []
        else:
            payload = self._target
        frame = Frame(self._kind, self._header, payload, self._flags, self._diverted)
        if self.unlock is not None and self._kind == self.unlock[0]:
            self.limits, self.unlock = self.unlock[1], None
        self._state, self._target, self._tfill, self._filled, self._header = _PREFIX, _EMPTY, 0, 0, {}
        self._mode, self._diverted = _SINK, False
        return frame
