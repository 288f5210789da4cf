"""A lean asyncio transport over one non-blocking TCP socket, with zero-copy sends.

asyncio's own socket transport (Python 3.11) copies every byte the kernel does
not take at once into a ``bytearray`` and compacts that buffer after each
partial send; for multi-MiB collective segments that is a second full pass
over the data plus repeated ``memmove``. :class:`SocketTransport` is a
drop-in ``asyncio.Transport`` for a ``BufferedProtocol`` that instead

* sends a frame's header and payload in one ``sendmsg`` call, and queues what
  the socket did not take as *memoryviews of the caller's buffers*
  (:meth:`SocketTransport.writev`, whose future tells the caller when the
  kernel has every byte and the buffers may change again);
* reads with one ``recv_into`` per readiness event, straight into the
  buffers the protocol hands out;
* still copies what plain :meth:`write` queues, so ``write`` keeps asyncio's
  "the caller may reuse the buffer at once" contract.

It runs on any event loop with ``add_reader``/``add_writer`` (the selector
loops, :mod:`netcoll.loop`, uvloop). :func:`~netcoll.links.dialer.connect` makes connected transports,
:class:`~netcoll.links.listener.Listener` accepted ones; :mod:`.readmark` decides how
much a read waits for.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import itertools
import logging
import socket
from typing import Any, Final

from . import delayline, readmark

IOV_MAX = 64  # buffers per sendmsg call
_RETRY = (BlockingIOError, InterruptedError)

_log = logging.getLogger("netcoll.transport")


class _Item:
    """A queued buffer; ``done`` (if any) is resolved once it is fully sent."""

    __slots__ = ("view", "done")

    def __init__(self, view: memoryview, done: asyncio.Future[None] | None) -> None:
        self.view, self.done = view, done


_GONE: Final = asyncio.BufferedProtocol()  # the protocol of a finished transport


class SocketTransport(asyncio.Transport):
    """An ``asyncio.Transport`` for a connected non-blocking socket and a
    ``BufferedProtocol`` (``get_buffer``/``buffer_updated``).

    TLS runs on its socket (:class:`~.tlstransport.TlsTransport`, after
    :meth:`release`), or over it with ``loop.start_tls`` (asyncio's own TLS
    layer, which copies and encrypts: :meth:`writev` is then not used) when
    reads pass an emulated delay line."""

    _start_tls_compatible = True  # asyncio.loop.start_tls() accepts this transport

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol: asyncio.BufferedProtocol,
        extra: dict[str, Any] | None = None,
        *,
        reading: bool = True,
        delay_line: bool = True,
    ) -> None:
        super().__init__(extra)
        sock.setblocking(False)
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._queue: collections.deque[_Item] = collections.deque()
        self._queued = 0  # bytes in _queue
        self._high, self._low = 64 * 1024, 16 * 1024
        self._paused_writing = False
        self._reading = False
        self._writing = False
        self._closing = False
        self._eof_pending = False
        self._lost = False
        self._mark = readmark.ReadMark(sock)  # how much a read waits for (SO_RCVLOWAT)
        #: an emulated network delay on what is read (NETCOLL_EMULATE_DELAY_US; benchmarks only;
        #: ``delay_line=False``: never, for a subclass whose socket is not read directly)
        self._line = delayline.line_for(loop, sock, self) if delay_line else None
        info: dict[str, Any] = self._extra  # type: ignore[attr-defined]  # set by BaseTransport.__init__
        info.setdefault("socket", sock)
        for key, get in (("sockname", sock.getsockname), ("peername", sock.getpeername)):
            try:
                info.setdefault(key, get())
            except OSError:
                info.setdefault(key, None)
        protocol.connection_made(self)
        if not self._closing and reading:  # not reading: until the caller resumes it (start_tls does)
            self.resume_reading()

    # -- reading ------------------------------------------------------------------
    def is_reading(self) -> bool:
        return self._reading

    def pause_reading(self) -> None:
        if self._reading and not self._lost:
            self._reading = False
            if self._line is None:
                self._loop.remove_reader(self._fd)
            else:
                self._line.pause()

    def resume_reading(self) -> None:
        if not self._reading and not self._closing and not self._lost:
            self._reading = True
            if self._line is None:
                self._loop.add_reader(self._fd, self._read_ready)
            else:
                self._line.resume()

    def _read_ready(self) -> None:
        """One ``recv_into`` per readable event, straight into the protocol's
        buffer (reading until drained measured slower: it delays forwarding in
        pipelined collectives)."""
        try:
            buf = self._protocol.get_buffer(-1)
            if not len(buf):  # type: ignore[arg-type]  # a memoryview or bytearray
                raise RuntimeError("get_buffer() returned an empty buffer")
            n = self._sock.recv_into(buf)
            if n:
                self._protocol.buffer_updated(n)
                self._mark.after_read(self._protocol)
        except _RETRY:
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - a reset, the fd closed under us, or a protocol bug
            self.fail(exc)
            return
        if not n:
            self.end_of_stream()

    def feed(self, data: memoryview) -> int:
        """Hand ``data`` to the protocol as if just read (the delay line's release);
        the bytes it took, fewer if it paused reading part-way."""
        done = 0
        while done < len(data) and self._reading:
            buf = memoryview(self._protocol.get_buffer(len(data) - done)).cast("B")
            k = min(len(buf), len(data) - done)
            if not k:
                raise RuntimeError("get_buffer() returned an empty buffer")
            buf[:k] = data[done : done + k]
            done += k
            self._protocol.buffer_updated(k)
        return done

    def end_of_stream(self) -> None:
        """The peer's end of the stream (read now, or released by the delay line)."""
        self.pause_reading()
        keep_open = self._protocol.eof_received()
        if not keep_open:
            self.close()

    # -- writing ------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self._closing or self._lost:  # closed here, by the peer (EOF), or broken
            raise ConnectionResetError("the connection is closing")
        if self._eof_pending:
            raise RuntimeError("cannot write after write_eof()")

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data``; what the socket cannot take now is copied and sent later."""
        self._check_writable()
        if not data:
            return
        view = memoryview(data).cast("B")
        if not self._queue:
            n = self._send_now([view])
            if n is None or n == len(view):
                return
            view = view[n:]
        if not isinstance(data, bytes) or view.obj is not data:
            view = memoryview(bytes(view))
        self._enqueue([view], None)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def writev(self, buffers: list[bytes | memoryview]) -> asyncio.Future[None] | None:
        """Send ``buffers`` in order without copying them. Returns ``None`` when
        the kernel took every byte at once, else a future that completes when
        it has (until then the caller must leave the buffers unchanged, or call
        :meth:`detach` with the future)."""
        self._check_writable()
        views = [memoryview(b).cast("B") for b in buffers]
        views = [v for v in views if len(v)]
        if not views:
            return None
        if not self._queue:
            n = self._send_now(views)
            if n is None:
                return None
            while views and n >= len(views[0]):
                n -= len(views.pop(0))
            if not views:
                return None
            views[0] = views[0][n:]
        done = self._loop.create_future()
        self._enqueue(views, done)
        return done

    def _send_now(self, views: list[memoryview]) -> int | None:
        """Bytes of ``views`` the socket takes right now (0 when it is full);
        ``None`` after an error, which has closed the transport."""
        try:
            return self._sock.sendmsg(views[:IOV_MAX]) if len(views) > 1 else self._sock.send(views[0])
        except _RETRY:
            return 0
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - a reset, or the fd closed under us
            self.fail(exc)
            return None

    def detach(self, done: asyncio.Future[None]) -> None:
        """The caller of :meth:`writev` stops guaranteeing its buffers: copy
        what is still queued of that call, so later changes cannot reach the wire."""
        first = True
        for item in reversed(self._queue):
            if item.done is done:
                first = False
            elif not first and item.done is not None:
                break
            if not first and not isinstance(item.view.obj, bytes):
                item.view = memoryview(bytes(item.view))

    def _enqueue(self, views: list[memoryview], done: asyncio.Future[None] | None) -> None:
        for v in views[:-1]:
            self._queue.append(_Item(v, None))
        self._queue.append(_Item(views[-1], done))
        self._queued += sum(len(v) for v in views)
        if not self._writing and not self._lost:
            self._loop.add_writer(self._fd, self._write_ready)
            self._writing = True
        self._maybe_pause()

    def _write_ready(self) -> None:
        queue = self._queue
        while queue:
            n = self._send_now([item.view for item in itertools.islice(queue, IOV_MAX)])
            if not n:
                return  # the socket is still full, or the connection broke
            self._queued -= n
            while queue and n >= len(queue[0].view):
                item = queue.popleft()
                n -= len(item.view)
                if item.done is not None and not item.done.done():
                    item.done.set_result(None)
            if n:
                queue[0].view = queue[0].view[n:]
                break  # the socket is full
        self._maybe_resume()
        if not queue:
            self._loop.remove_writer(self._fd)
            self._writing = False
            if self._closing:
                self._loop.call_soon(self._drained)
            elif self._eof_pending:
                self._shutdown_write()

    def _maybe_pause(self) -> None:
        if not self._paused_writing and self._queued > self._high:
            self._paused_writing = True
            self._protocol.pause_writing()

    def _maybe_resume(self) -> None:
        if self._paused_writing and self._queued <= self._low:
            self._paused_writing = False
            self._protocol.resume_writing()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._closing or self._eof_pending:
            return
        self._eof_pending = True
        if not self._queue:
            self._shutdown_write()

    def _shutdown_write(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                self.fail(exc)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        high = 64 * 1024 if high is None else high
        low = high // 4 if low is None else low
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._maybe_pause()

    def get_write_buffer_size(self) -> int:
        return self._queued

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    # -- closing ------------------------------------------------------------------
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Stop reading; close once everything queued has been sent."""
        if self._closing:
            return
        self._closing = True
        self.pause_reading()
        if not self._queue:
            self._loop.call_soon(self._drained)

    def _drained(self) -> None:
        """Everything queued is sent after :meth:`close`: finish (a TLS transport
        says goodbye first)."""
        self._finish(None)

    def release(self) -> socket.socket:
        """Stop all I/O and hand over the socket, still open, without telling the
        protocol (:func:`netcoll.links.connection.start_tls` wraps it in TLS).
        Only with nothing queued: bytes written before TLS would be lost."""
        if self._queue or self._lost:
            raise RuntimeError("cannot hand over a socket with bytes queued, or a lost one")
        self._mark.reset()
        self._drop()
        self._lost = True
        self._protocol = _GONE
        return self._sock

    @property
    def delayed(self) -> bool:
        """Whether reads pass an emulated delay line (``NETCOLL_EMULATE_DELAY_US``)."""
        return self._line is not None

    def abort(self) -> None:
        self._closing = True
        self._loop.call_soon(self._finish, None)
        self._drop()

    def _force_close(self, exc: BaseException | None) -> None:
        """asyncio's TLS layer closes a broken connection with this."""
        if exc is None:
            self.abort()
        else:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """Close at once because of ``exc`` (a broken socket; the protocol hears it next turn)."""
        self._closing = True
        self._loop.call_soon(self._finish, exc)
        self._drop()

    def _drop(self) -> None:
        """Stop all I/O now; queued bytes are discarded (their futures fail)."""
        self.pause_reading()
        if self._line is not None:
            self._line.close()
        if self._writing:
            self._loop.remove_writer(self._fd)
            self._writing = False
        err = ConnectionResetError("connection closed before the data was sent")
        while self._queue:
            item = self._queue.popleft()
            if item.done is not None and not item.done.done():
                item.done.set_exception(err)
                item.done.exception()
        self._queued = 0

    def _finish(self, exc: BaseException | None) -> None:
        if self._lost:
            return
        self._drop()
        self._lost = True
        try:
            self._protocol.connection_lost(exc if isinstance(exc, Exception) else None)
        finally:
            self._sock.close()
            # as asyncio's transports do: drop the protocol, so the pair is freed by
            # reference counting rather than waiting for the cycle collector
            self._protocol = _GONE

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    def __del__(self) -> None:
        if not self._lost and self._sock.fileno() != -1:
            self._sock.close()


__all__ = ["SocketTransport", "IOV_MAX"]
