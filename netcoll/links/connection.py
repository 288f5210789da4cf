"""A framed TCP connection: the socket end of every netcoll conversation (a peer
link's, an RPC client's or server's).

:class:`FramedProtocol` is an ``asyncio.BufferedProtocol``: the event loop
reads straight into buffers we hand out. Small frames are read many at a time
into a scratch buffer and parsed by :class:`~netcoll.wire.FrameDecoder`; once
a large payload has started, reads go directly into its destination (a posted
receive buffer when there is one), so the payload is never copied.

Connections run on :class:`~netcoll.links.sockettransport.SocketTransport`.
:meth:`FramedProtocol.send` hands a large payload to the kernel without copying
it (``sendmsg`` of header and payload) and returns once the kernel has all of
it, so the caller may then reuse the buffer; small frames are written (and
copied if the socket is full) at once, with drain-aware backpressure above
``HIGH_WATER`` queued bytes. :func:`open_connection` dials one, :func:`start_tls`
runs TLS under it.

Until its handshake is done a connection accepts only small header-only frames.
The handshake itself (CHALLENGE / HELLO / WELCOME, ``docs/protocol.md``) is the
mesh's: :mod:`netcoll.mesh.handshake`; accepting connections is :class:`netcoll.mesh.server.Server`.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import errors, wire
from ..errors import AuthenticationError, NetcollError, ProtocolError
from ..limits import DEFAULT as DEFAULT_SETTINGS
from ..mesh.certs import SHUTDOWN_TIMEOUT as TLS_SHUTDOWN_TIMEOUT
from ..mesh.certs import TlsConfig, describe_failure
from ..wire import Frame, Kind
from . import dialer, sockettransport, tlstransport

if TYPE_CHECKING:
    from ..mesh.server import Server


COALESCE_MAX = 64 * 1024  # payloads up to this size are copied behind their header: one write
#: small frames are read many at a time into this; room for a whole coalesced frame (a
#: header of up to 4 KiB), so that one arrives in one read, not two: 64 KiB exactly read
#: into 64 KiB cost a second system call and event-loop turn for the header's worth of
#: payload left over (docs/performance.md, "A 64 KiB frame in one read")
SCRATCH_BYTES = COALESCE_MAX + 4096
DIRECT_MIN = 32 * 1024  # a payload remainder at least this big is read straight into place, not via the scratch
HIGH_WATER = 4 * 1024 * 1024
HANDSHAKE_TIMEOUT = DEFAULT_SETTINGS.handshake_timeout_s
HANDSHAKE_LIMITS = wire.FrameLimits(max_header=4096, max_payload=0)
ERROR_MESSAGE_MAX = 4096  # characters of an ERROR frame's message (a control frame: small header)


class FramedProtocol(asyncio.BufferedProtocol):
    """Feeds received bytes to a decoder and frames to ``on_frame``."""

    def __init__(self, limits: wire.FrameLimits = wire.DEFAULT_LIMITS) -> None:
        # Until the handshake is done only small header-only frames are accepted,
        # so an unauthenticated peer cannot make us allocate anything large.
        self.limits = limits
        self.decoder = wire.FrameDecoder(HANDSHAKE_LIMITS, unlock=(Kind.WELCOME, limits))
        self.transport: asyncio.Transport | None = None
        self.on_frame: Callable[[Frame], None] | None = None
        self.on_lost: Callable[[BaseException | None], None] | None = None
        self.queue: collections.deque[Frame] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._scratch = memoryview(bytearray(SCRATCH_BYTES))
        self._direct = False
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.lost: BaseException | None = None
        self.closed = asyncio.get_running_loop().create_future()
        #: the accepting :class:`Server` (per-source limits, failed-auth policy); None when dialed
        self.gate: Server | None = None
        #: the role the peer proved in the handshake (``auth.MEMBER`` / ``auth.CLIENT``);
        #: None until :func:`server_handshake` has checked its HELLO
        self.credential: str | None = None
        self._names = [("?", 0), ("?", 0)]  # peername, sockname
        #: the first bytes of a read the decoder refused (what kind of server sent them: .sniff)
        self.refused: bytes = b""

    # -- asyncio callbacks ----------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # kept: a TLS transport forgets them once the connection is lost
        names = [transport.get_extra_info(key) for key in ("peername", "sockname")]
        self._names = [(info[0], info[1]) if info else ("?", 0) for info in names]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.set_write_buffer_limits(high=HIGH_WATER)  # type: ignore[union-attr]

    def get_buffer(self, sizehint: int) -> memoryview:
        target = self.decoder.payload_target()
        self._direct = target is not None and len(target) >= DIRECT_MIN
        return target if self._direct else self._scratch  # type: ignore[return-value]

    def bytes_due(self) -> int:
        """Bytes surely coming next: the rest of the frame being read (the transport's
        ``SO_RCVLOWAT``: :mod:`.readmark`)."""
        return self.decoder.payload_left

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._direct:
                frame = self.decoder.payload_written(nbytes)
                if frame is not None:
                    self._dispatch(frame)
            else:  # each frame is handled before the next one's header reaches the sink
                self.decoder.feed_each(self._scratch[:nbytes], self._dispatch)
        except ProtocolError as exc:
            if not self._direct:
                self.refused = bytes(self._scratch[: min(nbytes, 16)])
            self.fail(exc, tell_peer=True)
        except Exception as exc:  # noqa: BLE001 - a handler bug must not kill the loop's reader
            self.fail(ProtocolError(f"error handling a frame: {exc!r}"), tell_peer=True)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed.done():  # already told (a failed TLS upgrade reports it itself)
            return
        if self.lost is None:
            self.lost = exc or ConnectionResetError("connection closed by peer")
        self._can_write.set()
        self._wake()
        if not self.closed.done():
            self.closed.set_result(None)
        if self.on_lost is not None:
            self.on_lost(self.lost)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # -- our API ----------------------------------------------------------------
    def _dispatch(self, frame: Frame) -> None:
        if frame.kind == Kind.ERROR:
            self.fail(remote_error(frame.header))
            return
        if self.on_frame is not None:
            self.on_frame(frame)
        else:
            self.queue.append(frame)
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_frame(self) -> Frame:
        """Next queued frame (only while no ``on_frame`` handler is set)."""
        while not self.queue:
            if self.lost is not None:
                raise _as_connection_error(self.lost)
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self.queue.popleft()

    def write(self, kind: Kind, header: dict[str, Any], payload: memoryview | None = None) -> None:
        """Queue one frame without waiting (the payload is copied only if the
        socket cannot take it at once)."""
        if self.lost is not None or self.transport is None:
            raise _as_connection_error(self.lost)
        n = 0 if payload is None else payload.nbytes
        head = wire.encode_header(kind, header, n)
        if n == 0:
            self.transport.write(head)
        elif n <= COALESCE_MAX:  # one syscall and one TCP segment for small frames
            self.transport.write(b"".join((head, payload)))  # type: ignore[arg-type]
        else:
            self.transport.write(head)
            self.transport.write(payload)  # type: ignore[arg-type]

    def write_headers(self, kind: Kind, headers: list[dict[str, Any]]) -> None:
        """Queue header-only frames in one write (one system call, one wake-up of the peer)."""
        if self.lost is not None or self.transport is None:
            raise _as_connection_error(self.lost)
        self.transport.write(b"".join([wire.encode_header(kind, header, 0) for header in headers]))

    def writable_now(self) -> bool:
        """Whether a frame written now goes out with nothing to wait for (not
        lost or closing, no backpressure)."""
        t = self.transport
        return self.lost is None and t is not None and self._can_write.is_set() and not t.is_closing()

    async def send(self, kind: Kind, header: dict[str, Any], payload: memoryview | None = None) -> None:
        """Write one frame and return when the caller may reuse ``payload``:
        a large payload goes to the kernel without a copy (this waits until the
        kernel has all of it); otherwise wait while the outgoing buffer is
        above its high-water mark."""
        writev = getattr(self.transport, "writev", None)
        if payload is not None and payload.nbytes > COALESCE_MAX and writev is not None:
            if self.lost is not None:
                raise _as_connection_error(self.lost)
            done = writev([wire.encode_header(kind, header, payload.nbytes), payload])
            if done is not None:
                try:
                    await done
                except asyncio.CancelledError:
                    self.transport.detach(done)  # type: ignore[union-attr]  # copy what is unsent
                    raise
                except ConnectionError:
                    raise _as_connection_error(self.lost) from None
            return
        self.write(kind, header, payload)
        if not self._can_write.is_set():
            await self._can_write.wait()
            if self.lost is not None:
                raise _as_connection_error(self.lost)

    def fail(self, exc: BaseException, tell_peer: bool = False) -> None:
        """Close the connection because of ``exc`` (optionally telling the peer why)."""
        if self.lost is None:
            self.lost = exc
        if self.transport is not None and not self.transport.is_closing():
            if tell_peer:
                try:
                    self.transport.write(
                        wire.encode_header(
                            Kind.ERROR, {"message": str(exc)[:ERROR_MESSAGE_MAX], "type": type(exc).__name__}
                        )
                    )
                except Exception:  # noqa: BLE001
                    pass
            self.transport.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    @property
    def peername(self) -> tuple[str, int]:
        return self._names[0]

    @property
    def sockname(self) -> tuple[str, int]:
        return self._names[1]


def remote_error(header: dict[str, Any]) -> BaseException:
    """The exception a peer's ERROR frame stands for: the netcoll error type it
    names (if it names one), else ConnectionAbortedError."""
    cls = getattr(errors, str(header.get("type", "")), None)
    if not (isinstance(cls, type) and issubclass(cls, NetcollError)):
        cls = ConnectionAbortedError
    return cls(f"peer reported: {header['message']}")


def _as_connection_error(exc: BaseException | None) -> BaseException:
    if isinstance(exc, (ConnectionError, NetcollError)):
        return exc
    return ConnectionResetError(f"connection lost: {exc}" if exc else "connection closed")


async def open_connection(
    host: str,
    port: int,
    *,
    local_host: str | None = None,
    limits: wire.FrameLimits = wire.DEFAULT_LIMITS,
    tls: TlsConfig | None = None,
    timeout: float = HANDSHAKE_TIMEOUT,
) -> FramedProtocol:
    """Connect to ``host:port``; with ``tls``, run the TLS handshake (within
    ``timeout``) before returning: ``AuthenticationError`` when it fails."""
    _, proto = await dialer.connect(
        host, port, lambda: FramedProtocol(limits), local_host=local_host, reading=tls is None
    )
    assert isinstance(proto, FramedProtocol)
    if tls is not None:
        try:
            await start_tls(proto, tls.client_context(), server_hostname=tls.server_hostname(host), timeout=timeout)
        except (OSError, TimeoutError) as exc:
            raise AuthenticationError(
                f"TLS handshake with {host}:{port} failed: {describe_failure(exc)} "
                "(does the server use TLS with a certificate of this CA?)"
            ) from None
    return proto


async def start_tls(
    proto: FramedProtocol,
    context: ssl.SSLContext,
    *,
    server_side: bool = False,
    server_hostname: str | None = None,
    timeout: float = HANDSHAKE_TIMEOUT,
) -> None:
    """Run TLS under ``proto``'s connection: OpenSSL on the socket itself
    (:class:`~.tlstransport.TlsTransport`), or asyncio's TLS layer over an
    emulated delay line. Raises the handshake's error (an ``OSError``:
    ``ssl.SSLError``, a reset, ``ConnectionAbortedError`` past ``timeout``),
    after which the connection is closed and ``proto`` knows it is lost."""
    raw = proto.transport
    if raw is None or proto.lost is not None:
        raise _as_connection_error(proto.lost)
    if not isinstance(raw, sockettransport.SocketTransport) or raw.delayed:
        await _start_asyncio_tls(proto, raw, context, server_side, server_hostname, timeout)
        return
    sock = raw.release()
    try:
        secure = tlstransport.wrap(sock, context, server_side=server_side, server_hostname=server_hostname)
        sock = secure
        await tlstransport.handshake(secure, max(0.1, timeout))
    except BaseException as exc:
        sock.close()
        proto.connection_lost(exc if isinstance(exc, Exception) else None)
        raise
    tlstransport.TlsTransport(asyncio.get_running_loop(), secure, proto)
    secure_transport = proto.transport
    assert secure_transport is not None
    secure_transport.set_write_buffer_limits(high=HIGH_WATER)


async def _start_asyncio_tls(
    proto: FramedProtocol,
    raw: asyncio.Transport,
    context: ssl.SSLContext,
    server_side: bool,
    server_hostname: str | None,
    timeout: float,
) -> None:
    """asyncio's TLS layer (memory BIOs) over ``raw``, which can then keep its delay line."""
    try:
        secure = await asyncio.get_running_loop().start_tls(
            raw,
            proto,
            context,
            server_side=server_side,
            server_hostname=server_hostname,
            ssl_handshake_timeout=max(0.1, timeout),
            ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT,
        )
        if secure is None:  # closed during the handshake
            raise ConnectionResetError("connection closed during the TLS handshake")
    except BaseException as exc:
        raw.abort()
        proto.connection_lost(exc if isinstance(exc, Exception) else None)
        raise
    proto.transport = secure
    secure.set_write_buffer_limits(high=HIGH_WATER)


def is_tls(proto: FramedProtocol) -> bool:
    """Whether ``proto``'s connection runs TLS."""
    return proto.transport is not None and proto.transport.get_extra_info("ssl_object") is not None
