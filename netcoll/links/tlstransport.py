"""TLS straight on the socket: a :class:`~.sockettransport.SocketTransport` whose
socket is an ``ssl.SSLSocket`` (OpenSSL reads and writes the file descriptor).

asyncio's own TLS layer (``loop.start_tls``) runs OpenSSL over memory BIOs in
Python: every byte read is copied from the socket into a 256 KiB buffer, from
there into the incoming BIO, and decrypted out of it; a payload written is
encrypted whole into the outgoing BIO and copied out of it into ``bytes`` for
the socket transport's queue (so ciphertext of the segments in flight is held).

Here OpenSSL reads records from the socket and decrypts them straight into the
buffer the protocol hands out (a large payload's destination), and encrypts
straight from the caller's buffer into the socket: besides the kernel's copy
and the cipher, the only pass over the data is OpenSSL's own copy into and out
of its record buffer. The price is system calls: one read (with the
read-ahead :func:`netcoll.mesh.tlstuning.tune` sets; two without it) and one
write per 16 KiB record. Measured, the two ways cost about the same CPU per byte
(``docs/reliability.md``, "What TLS costs"); this one holds no copies. Everything else
is the socket transport's: the queue of caller's buffers for zero-copy
:meth:`writev`, the write buffer limits and flow control, closing and failing.
What differs:

* one ``SSL_write`` per queued buffer (no ``sendmsg`` vectors), and a write
  that would block is retried with the same buffer (what OpenSSL requires);
* a readable event reads up to :data:`READ_RECORDS` records; when that
  budget is spent, or reading resumes, reading goes on at the next loop turn
  (until OpenSSL wants to read), since bytes OpenSSL already holds (decrypted,
  or records read ahead: :mod:`netcoll.mesh.tlstuning`) make the socket
  signal nothing;
* TLS has no half-close: :meth:`close` sends ``close_notify`` once everything
  queued is sent, then reads (and discards) until the peer's ``close_notify``
  or end of stream, for at most ``SHUTDOWN_TIMEOUT`` seconds; the peer's
  ``close_notify`` is end of stream.

:func:`handshake` runs the TLS handshake on the event loop before the
transport is made. A connection with an emulated delay line keeps asyncio's
TLS layer (:func:`netcoll.links.connection.start_tls`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Final

from ..mesh.certs import SHUTDOWN_TIMEOUT
from .sockettransport import SocketTransport

#: records (of at most 16 KiB) read per readable event: large enough that a
#: multi-MiB payload does not cost an event-loop turn per record, small enough
#: that a forwarding step of a pipelined collective is not held up
READ_RECORDS: Final = 64
_DISCARD_BYTES: Final = 16 * 1024 + 256  # what a close reads into and drops: one record


async def handshake(sock: ssl.SSLSocket, timeout: float) -> None:
    """Run ``sock``'s TLS handshake on the running loop (a non-blocking socket).
    Raises the handshake's error (``ssl.SSLError``, a reset...), or
    ``ConnectionAbortedError`` when it takes longer than ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    sock.do_handshake()
                    return
                except ssl.SSLWantReadError:
                    await _ready(loop, fd, write=False)
                except ssl.SSLWantWriteError:
                    await _ready(loop, fd, write=True)
    except TimeoutError:
        raise ConnectionAbortedError(f"the TLS handshake did not finish within {timeout:g} s") from None


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool) -> None:
    """Until ``fd`` is readable (or writable)."""
    done = loop.create_future()
    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    add(fd, wake)
    try:
        await done
    finally:
        remove(fd)


class TlsTransport(SocketTransport):
    """A connected ``ssl.SSLSocket`` (handshake done, non-blocking) and a
    ``BufferedProtocol``. Unlike :class:`SocketTransport` it does not call the
    protocol's ``connection_made`` (the protocol already has the connection:
    its plain transport was :meth:`~SocketTransport.release`\\ d); it sets
    ``protocol.transport``."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket, protocol: asyncio.BufferedProtocol
    ) -> None:
        self._tls = sock
        self._shutdown_timer: asyncio.TimerHandle | None = None
        self._discard: memoryview | None = None
        extra = {
            "ssl_object": sock,
            "sslcontext": sock.context,
            "peercert": sock.getpeercert(),
            "cipher": sock.cipher(),
            "compression": sock.compression(),
        }
        # (an emulated delay line stays with asyncio's TLS: see start_tls)
        super().__init__(loop, sock, _Adopt(), extra, reading=False, delay_line=False)
        self._protocol = protocol
        protocol.transport = self  # type: ignore[attr-defined]  # FramedProtocol's attribute
        self.resume_reading()

    def can_write_eof(self) -> bool:
        return False  # TLS has no half-close: close() says goodbye

    def write_eof(self) -> None:
        raise NotImplementedError("TLS has no half-close; close() sends close_notify")

    # -- reading --------------------------------------------------------------
    def resume_reading(self) -> None:
        was = self._reading
        super().resume_reading()
        if self._reading and not was:  # bytes OpenSSL holds (pending, or read ahead): the socket will not signal them
            self._loop.call_soon(self._read_ready)

    def _read_ready(self) -> None:
        """Up to :data:`READ_RECORDS` records, decrypted straight into the
        protocol's buffers; each buffer is filled by as many records as fit
        before the protocol hears of them (one ``buffer_updated``, not one per record)."""
        records = READ_RECORDS
        while records > 0 and self._reading:
            try:
                buf = memoryview(self._protocol.get_buffer(-1))
                if not len(buf):
                    raise RuntimeError("get_buffer() returned an empty buffer")
                got, records, more = self._fill(buf, records)
                if got:
                    self._protocol.buffer_updated(got)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:  # noqa: BLE001 - a bad record (MAC), a reset, a protocol bug
                self.fail(exc)
                return
            if more is None:
                self.end_of_stream()
                return
            if not more:
                return
        if self._reading:  # the budget is spent, and OpenSSL may hold more than pending() shows (read ahead)
            self._loop.call_soon(self._read_ready)

    def _fill(self, buf: memoryview, records: int) -> tuple[int, int, bool | None]:
        """Read records into ``buf`` until it is full, ``records`` are read or the
        socket has no more: (bytes read, records left, whether more may be
        readable now: None at the end of the stream)."""
        tls, got, size = self._tls, 0, len(buf)
        while got < size and records > 0:
            try:
                n = tls.recv_into(buf[got:])
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
                return got, records, False
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                n = 0  # the peer's close_notify, or its end of stream without one
            if not n:
                return got, records, None
            got += n
            records -= 1
        return got, records, True

    # -- writing --------------------------------------------------------------
    def _send_now(self, views: list[memoryview]) -> int | None:
        """Bytes of ``views`` OpenSSL has sent (0 when the socket is full: the
        buffer it stopped in must be offered again, unchanged, which the queue
        does); ``None`` after an error, which has closed the transport."""
        sent = 0
        try:
            for view in views:
                n = self._tls.send(view)
                sent += n
                if n < len(view):
                    break
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError, InterruptedError):
            pass
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - a reset, or the fd closed under us
            self.fail(exc)
            return None
        return sent

    # -- closing --------------------------------------------------------------
    def _drained(self) -> None:
        """Everything queued is sent after :meth:`close`: send ``close_notify``."""
        if self._lost:
            return
        if self._writing:  # waiting for the socket to take close_notify
            self._loop.remove_writer(self._fd)
            self._writing = False
        try:
            self._tls.unwrap()  # sends close_notify; returns when the peer's came too
        except ssl.SSLWantReadError:  # ours is sent: read until the peer's (or its end)
            self._await_goodbye()
            return
        except ssl.SSLWantWriteError:  # ours did not fit: again when the socket is writable
            self._loop.add_writer(self._fd, self._drained)
            self._writing = True
            return
        except (ssl.SSLError, OSError, ValueError):
            pass  # broken, or already unwrapped: close anyway
        self._finish(None)

    def _await_goodbye(self) -> None:
        self._discard = memoryview(bytearray(_DISCARD_BYTES))
        self._loop.add_reader(self._fd, self._read_goodbye)
        self._reading = True  # so _drop removes the reader
        self._shutdown_timer = self._loop.call_later(SHUTDOWN_TIMEOUT, self._finish, None)

    def _read_goodbye(self) -> None:
        """Read and drop what the peer still sends, until its ``close_notify``."""
        assert self._discard is not None
        for _ in range(READ_RECORDS):
            try:
                if not self._tls.recv_into(self._discard):
                    break
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
                return
            except (ssl.SSLError, OSError, ValueError):
                break  # close_notify (SSLZeroReturnError), end of stream, a reset
        else:
            return
        self._finish(None)

    def _finish(self, exc: BaseException | None) -> None:
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
            self._shutdown_timer = None
        super()._finish(exc)


class _Adopt(asyncio.BufferedProtocol):
    """Stands in for the protocol while :class:`SocketTransport` initialises
    (its ``connection_made`` must not reach the real protocol again)."""

    def get_buffer(self, sizehint: int) -> bytearray:
        raise RuntimeError("not reading yet")

    def buffer_updated(self, nbytes: int) -> None:
        raise RuntimeError("not reading yet")


def wrap(
    sock: socket.socket, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None
) -> ssl.SSLSocket:
    """``sock`` (connected, non-blocking) wrapped in TLS, its handshake not yet run."""
    return context.wrap_socket(
        sock, server_side=server_side, server_hostname=server_hostname, do_handshake_on_connect=False
    )


__all__ = ["TlsTransport", "handshake", "wrap", "READ_RECORDS"]
