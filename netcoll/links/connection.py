"""A framed, authenticated TCP connection: the only place that touches sockets.

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
``HIGH_WATER`` queued bytes.

:func:`client_handshake` / :func:`server_handshake` run the CHALLENGE / HELLO
/ WELCOME exchange of ``docs/protocol.md`` (token proofs from :mod:`.auth`).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import errors, wire
from ..errors import AuthenticationError, NetcollError, ProtocolError
from ..escape import escape
from ..limits import DEFAULT as DEFAULT_SETTINGS
from ..limits import Limits
from ..mesh import auth, sniff
from ..mesh.certs import SHUTDOWN_TIMEOUT as TLS_SHUTDOWN_TIMEOUT
from ..mesh.certs import TlsConfig, describe_failure
from ..wire import Frame, Kind
from . import sockettransport

log = logging.getLogger("netcoll.transport")

COALESCE_MAX = 64 * 1024  # payloads up to this size are copied behind their header: one write
#: small frames are read many at a time into this; room for a whole coalesced frame (a
#: header of up to 4 KiB), so that one arrives in one read, not two: 64 KiB exactly read
#: into 64 KiB cost a second system call and event-loop turn for the header's worth of
#: payload left over (docs/performance.md, "A 64 KiB frame in one read")
SCRATCH_BYTES = COALESCE_MAX + 4096
DIRECT_MIN = 32 * 1024  # a payload remainder at least this big is read straight into place, not via the scratch
HIGH_WATER = 4 * 1024 * 1024
HANDSHAKE_TIMEOUT = DEFAULT_SETTINGS.handshake_timeout_s
HANDSHAKE_LIMITS = wire.Limits(max_header=4096, max_payload=0)
ERROR_MESSAGE_MAX = 4096  # characters of an ERROR frame's message (a control frame: small header)
MAX_PROBES = 2  # PING frames a server skips before the HELLO (a client's probe: .sniff)


class FramedProtocol(asyncio.BufferedProtocol):
    """Feeds received bytes to a decoder and frames to ``on_frame``."""

    def __init__(self, limits: wire.Limits = wire.DEFAULT_LIMITS) -> None:
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
    limits: wire.Limits = wire.DEFAULT_LIMITS,
    tls: TlsConfig | None = None,
    timeout: float = HANDSHAKE_TIMEOUT,
) -> FramedProtocol:
    """Connect to ``host:port``; with ``tls``, run the TLS handshake (within
    ``timeout``) before returning: ``AuthenticationError`` when it fails."""
    _, proto = await sockettransport.connect(host, port, lambda: FramedProtocol(limits), local_host=local_host)
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
    """Run TLS (asyncio's TLS layer) under ``proto``'s connection; raises the
    handshake's error (an ``OSError``: ``ssl.SSLError``, a reset...), after which
    the connection is closed and ``proto`` knows it is lost."""
    raw = proto.transport
    if raw is None or proto.lost is not None:
        raise _as_connection_error(proto.lost)
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


def _is_tls(proto: FramedProtocol) -> bool:
    return proto.transport is not None and proto.transport.get_extra_info("ssl_object") is not None


async def _challenge(proto: FramedProtocol, probe: bool = False) -> Frame:
    """The server's first frame, which must be its CHALLENGE. ``probe``: after
    :data:`~.sniff.PROBE_AFTER` seconds of silence send the probe PING, which an HTTP or
    TLS server answers (or refuses) at once, so a wrong port is named at once."""
    where = f"server {proto.peername[0]}:{proto.peername[1]}"
    try:
        challenge = await _first_frame(proto, probe)
    except ProtocolError as exc:
        met = sniff.rpc_met(where, proto.refused)
        raise ProtocolError(met or str(exc)) from None
    except ConnectionResetError as exc:
        hint = (
            "it refused the TLS session: is this process's certificate signed by the CA the server trusts? "
            if _is_tls(proto)
            else f"does it require TLS ({sniff.TLS_SETTINGS})? "
        )
        raise ConnectionResetError(f"{where} closed the connection before the handshake ({hint}see its log)") from exc
    if challenge.kind != Kind.CHALLENGE:
        raise ProtocolError(f"expected CHALLENGE from the server, got {challenge.kind.name}")
    return challenge


async def _first_frame(proto: FramedProtocol, probe: bool) -> Frame:
    if not probe:
        return await proto.next_frame()
    first = asyncio.ensure_future(proto.next_frame())
    try:
        done, _ = await asyncio.wait({first}, timeout=sniff.PROBE_AFTER)
        if not done and proto.lost is None:
            proto.write(Kind.PING, dict(sniff.PROBE))  # a netcoll server ignores it before the HELLO
        return await first
    finally:
        first.cancel()


async def client_handshake(
    proto: FramedProtocol,
    *,
    token: str | None,
    role: str,
    hello: dict[str, Any] | None = None,
    timeout: float = HANDSHAKE_TIMEOUT,
    credential: str = auth.MEMBER,
    probe: bool = False,
) -> dict[str, Any]:
    """Answer the server's CHALLENGE; return the WELCOME header (raises on refusal).
    ``credential`` is the role ``token`` stands for (a client token: ``auth.CLIENT``).
    ``probe``: find out soon what a silent server speaks (:func:`_challenge`): for clients
    a user points at an address (RPC), not for peer links (their addresses are the
    coordinator's)."""
    challenge: Frame | None = None
    try:
        async with asyncio.timeout(timeout):
            challenge = await _challenge(proto, probe)
            mine = auth.new_nonce()
            header = dict(hello or {}, role=role, nonce=mine)
            if token is not None:
                header["proof"] = auth.proof(token, "hello", challenge.header["nonce"], mine, credential)
                if credential != auth.MEMBER:
                    header["cred"] = credential
            await proto.send(Kind.HELLO, header)
            welcome = await proto.next_frame()
    except TimeoutError:
        if challenge is None and not _is_tls(proto):  # a TLS listener waits for a ClientHello
            raise TimeoutError(
                f"server {proto.peername[0]}:{proto.peername[1]} sent no CHALLENGE within {timeout:g}s "
                "(does it require TLS: NETCOLL_TLS_CERT/KEY/CA?)"
            ) from None
        raise
    assert challenge is not None
    if welcome.kind != Kind.WELCOME:
        raise ProtocolError(f"expected WELCOME from the server, got {welcome.kind.name}")
    auth.check(
        token,
        "welcome",
        mine,
        challenge.header["nonce"],
        welcome.header.get("proof"),
        f"server {proto.peername[0]}:{proto.peername[1]}",
        credential,
    )
    return welcome.header


async def server_handshake(
    proto: FramedProtocol,
    *,
    token: str | None,
    role: str,
    accept: Callable[[dict[str, Any]], Any] | None = None,
    timeout: float = HANDSHAKE_TIMEOUT,
    client_token: str | None = None,
) -> dict[str, Any]:
    """Challenge a new client, check its HELLO (``accept`` may raise to refuse it
    or return extra WELCOME fields), and return the HELLO header. On failure the
    client gets an ERROR frame with the reason and the connection is closed.

    On a connection accepted by a :class:`Server`, the handshake ends by the
    server's deadline (``handshake_timeout_s`` from the connect) if sooner, the
    source's handshake slot is given back as soon as the proof checks out, and a
    failure before that is logged (rate-limited per source) and answered only
    after ``auth_fail_delay_s``.

    ``token`` is the member token; with ``client_token`` too, a HELLO proven with
    the client token is accepted as role ``client`` (``proto.credential`` says which;
    without either token every peer is a member)."""
    mine = auth.new_nonce()
    gate = proto.gate
    if gate is not None:
        timeout = min(timeout, gate.time_left(proto))
    hello: Frame | None = None
    authenticated = False
    try:
        has_auth = token is not None or client_token is not None
        await proto.send(Kind.CHALLENGE, {"nonce": mine, "role": role, "auth": has_auth})
        async with asyncio.timeout(timeout):
            hello = await proto.next_frame()
            for _ in range(MAX_PROBES):  # a client's probe (.sniff): ignored
                if hello.kind != Kind.PING:
                    break
                hello = await proto.next_frame()
        if hello.kind != Kind.HELLO:
            raise ProtocolError(f"expected HELLO, got {hello.kind.name}")
        who = f"client {proto.peername[0]}:{proto.peername[1]}"
        theirs, got, claimed = hello.header["nonce"], hello.header.get("proof"), hello.header.get("cred")
        credential, key = auth.verify_hello(token, client_token, mine, theirs, got, claimed, who, role)
        proto.credential = credential
        authenticated = True
        if gate is not None:
            gate.authenticated(proto)
        extra = accept(hello.header) if accept else None
        if inspect.isawaitable(extra):
            extra = await extra
        extra = extra or {}
        proto.decoder.limits, proto.decoder.unlock = proto.limits, None  # authenticated: full frames now
        welcome = dict(extra)
        if key is not None:
            welcome["proof"] = auth.proof(key, "welcome", hello.header["nonce"], mine, credential)
        await proto.send(Kind.WELCOME, welcome)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("accepted a %s handshake from %s:%s as %s", role, *proto.peername[:2], credential)
        return hello.header
    except TimeoutError:
        if gate is not None and not authenticated:
            gate.failed(proto, "handshake timed out", None)
        proto.fail(ProtocolError("handshake timed out"), tell_peer=True)
        raise ProtocolError(f"handshake with {proto.peername} timed out") from None
    except (ProtocolError, AuthenticationError, NetcollError, ValueError) as exc:
        if gate is not None and not authenticated:
            gate.failed(proto, str(exc), None if hello is None else hello.header)
            await gate.penalty(proto)
        proto.fail(exc, tell_peer=True)
        raise


class _Source:
    """Connections from one source address: all of them, and those still in the handshake."""

    __slots__ = ("total", "unauth", "waiters")

    def __init__(self) -> None:
        self.total = 0
        self.unauth = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()


class RateLimitedLog:
    """At most one log line per key per ``interval`` seconds; the next line
    says how many were suppressed in between. Keeps at most ``max_keys`` keys."""

    def __init__(self, interval: float, max_keys: int = 4096) -> None:
        self.interval = interval
        self.max_keys = max_keys
        self._keys: collections.OrderedDict[Any, list[float]] = collections.OrderedDict()  # key -> [next, suppressed]

    def allow(self, key: Any) -> int | None:
        """``None`` when this event is suppressed; else how many were suppressed before it."""
        now = time.monotonic()
        entry = self._keys.get(key)
        if entry is not None and now < entry[0]:
            entry[1] += 1
            return None
        suppressed = 0 if entry is None else int(entry[1])
        self._keys[key] = [now + self.interval, 0.0]
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
        return suppressed


class Server:
    """A listening socket whose every accepted connection runs ``handler(proto)``
    in its own task; closing the server cancels those tasks and closes the links.

    Per source address (``settings``, default :data:`netcoll.limits.DEFAULT`): a
    connection beyond ``max_conns_per_source`` is refused at once (an ERROR frame
    with the reason, then close: no handshake work); beyond
    ``max_unauth_conns_per_source`` still in the handshake, a new connection
    waits (without a CHALLENGE) for one of them to finish, and is refused the
    same way if none does within half of ``handshake_timeout_s`` (so legitimate
    bursts from one host, e.g. many ranks dialing at once, just queue briefly).
    Failed handshakes are logged at most once per source per
    ``auth_fail_log_interval_s`` and answered after ``auth_fail_delay_s`` (in
    that connection's task only)."""

    def __init__(
        self,
        handler: Callable[[FramedProtocol], Awaitable[None]],
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        *,
        settings: Limits | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits
        #: with TLS, every accepted connection runs the TLS handshake before ``handler``
        self.tls = tls
        self.settings = DEFAULT_SETTINGS if settings is None else settings
        self.server: sockettransport.Listener | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.protos: set[FramedProtocol] = set()
        self.sources: dict[str, _Source] = {}
        self.refused = 0  # connections refused by a per-source limit
        self.auth_failures = 0  # handshakes that failed before the peer proved itself
        self._log = RateLimitedLog(self.settings.auth_fail_log_interval_s)

    def _factory(self) -> FramedProtocol:
        proto = _AcceptedProtocol(self, self.limits)
        return proto

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self.server = sockettransport.Listener(self._factory, paused=self.tls is not None)
        return self.server.start(host, port)

    def _spawn(self, proto: _AcceptedProtocol) -> None:
        source = self.sources.setdefault(proto.peername[0], _Source())
        if source.total >= self.settings.max_conns_per_source:
            if not source.total:
                self.sources.pop(proto.peername[0], None)
            self._refuse(
                proto,
                f"too many connections from {proto.peername[0]} (at most "
                f"{self.settings.max_conns_per_source} per source address); try again later",
            )
            return
        source.total += 1
        proto.counted = True
        proto.deadline = asyncio.get_running_loop().time() + self.settings.handshake_timeout_s
        self.protos.add(proto)
        task = asyncio.get_running_loop().create_task(self._run(proto))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _refuse(self, proto: FramedProtocol, reason: str) -> None:
        self.refused += 1
        suppressed = self._log.allow((proto.peername[0], "limit"))
        if suppressed is not None:
            more = f" ({suppressed} more refused since the last report)" if suppressed else ""
            log.warning("refused a connection: %s%s", reason, more)
        proto.fail(ConnectionRefusedError(reason), tell_peer=True)

    async def _admit(self, proto: _AcceptedProtocol) -> bool:
        """Take one of the source's handshake slots (waiting for one until the deadline)."""
        source = self.sources.get(proto.peername[0])
        if source is None or proto.lost is not None:  # gone before its task started
            return False
        if source.unauth < self.settings.max_unauth_conns_per_source and not source.waiters:
            source.unauth += 1
            proto.unauth = True
            return True
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        source.waiters.append(slot)
        self._wake(source)  # skips waiters that gave up
        try:
            if not slot.done():
                # wait at most half the handshake time, so an admitted connection has the other half
                wait = self.time_left(proto) - self.settings.handshake_timeout_s / 2
                await asyncio.wait([slot, proto.closed], timeout=max(0.0, wait), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not slot.done():
                slot.cancel()
        if slot.cancelled() or proto.lost is not None:
            if not slot.cancelled():  # we were handed a slot but cannot use it: pass it on
                source.unauth -= 1
                self._wake(source)
            if proto.lost is None:
                self._refuse(
                    proto,
                    f"too many connections still in the handshake from {proto.peername[0]} (at most "
                    f"{self.settings.max_unauth_conns_per_source} per source address); try again later",
                )
            return False
        proto.unauth = True  # the slot was counted for us by _wake
        return True

    def _wake(self, source: _Source) -> None:
        while source.waiters and source.unauth < self.settings.max_unauth_conns_per_source:
            slot = source.waiters.popleft()
            if not slot.done():
                source.unauth += 1
                slot.set_result(None)

    def authenticated(self, proto: FramedProtocol) -> None:
        """``proto``'s peer proved itself: give its handshake slot back."""
        if isinstance(proto, _AcceptedProtocol) and proto.unauth:
            proto.unauth = False
            source = self.sources.get(proto.peername[0])
            if source is not None:
                source.unauth -= 1
                self._wake(source)
                self._forget(proto.peername[0], source)

    def _release(self, proto: _AcceptedProtocol) -> None:
        if not proto.holding:
            self.authenticated(proto)
        if proto.counted:
            proto.counted = False
            source = self.sources.get(proto.peername[0])
            if source is not None:
                source.total -= 1
                self._forget(proto.peername[0], source)

    def _forget(self, host: str, source: _Source) -> None:
        if source.total <= 0 and not source.waiters and source.unauth <= 0:
            self.sources.pop(host, None)

    def time_left(self, proto: FramedProtocol) -> float:
        """Seconds until ``proto``'s handshake deadline."""
        if not isinstance(proto, _AcceptedProtocol) or proto.deadline is None:
            return self.settings.handshake_timeout_s
        return proto.deadline - asyncio.get_running_loop().time()

    def failed(self, proto: FramedProtocol, reason: str, hello: dict[str, Any] | None) -> None:
        """Log a handshake that failed before the peer proved itself (rate-limited per source)."""
        self.auth_failures += 1
        host, port = proto.peername
        suppressed = self._log.allow((host, "auth"))
        if suppressed is None:
            return
        who = ""
        if hello is not None:
            fields = [f"{k} {escape(hello[k], 100)}" for k in ("role", "member_id", "rank") if k in hello]
            who = f" ({', '.join(fields)})" if fields else ""
        more = (
            f"; {suppressed} more from this address in the last {self.settings.auth_fail_log_interval_s:g}s"
            if suppressed
            else ""
        )
        log.warning("failed handshake from %s:%s%s: %s%s", host, port, who, escape(reason, 300), more)

    async def penalty(self, proto: FramedProtocol) -> None:
        """Wait ``auth_fail_delay_s`` before refusing ``proto`` (reading nothing from it meanwhile)."""
        delay = self.settings.auth_fail_delay_s
        if delay <= 0 or proto.transport is None:
            return
        proto.transport.pause_reading()
        await asyncio.sleep(delay)

    async def _run(self, proto: _AcceptedProtocol) -> None:
        try:
            if not await self._admit(proto):
                return
            if self.tls is not None and not await self._start_tls(proto, self.tls):
                return
            await self.handler(proto)
        except (ConnectionError, NetcollError, TimeoutError):
            proto.close()
        except asyncio.CancelledError:
            proto.close()
            raise
        except Exception as exc:  # noqa: BLE001 - one bad connection never takes the server down
            proto.fail(ProtocolError(f"internal error: {exc!r}"), tell_peer=True)
        finally:
            self.authenticated(proto)  # the handler is done with the handshake either way
            self.protos.discard(proto)

    async def _start_tls(self, proto: _AcceptedProtocol, config: TlsConfig) -> bool:
        """The TLS handshake (within the connection's handshake deadline). A failure
        is logged like a failed authentication, and the source's handshake slot
        stays taken for ``auth_fail_delay_s`` after the connection is closed."""
        proto.holding = True
        try:
            await start_tls(proto, config.server_context(), server_side=True, timeout=self.time_left(proto))
        except (OSError, TimeoutError) as exc:
            # asyncio aborts a handshake past ssl_handshake_timeout with ConnectionAbortedError
            why = (
                "no TLS handshake in time (a client without TLS?)"
                if isinstance(exc, ConnectionAbortedError)
                else describe_failure(exc)
            )
            self.failed(proto, f"TLS handshake failed: {why}", None)
            if self.settings.auth_fail_delay_s > 0:
                await asyncio.sleep(self.settings.auth_fail_delay_s)
            return False
        finally:
            proto.holding = False
        return True

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for proto in list(self.protos):
            proto.abort()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)


class _AcceptedProtocol(FramedProtocol):
    def __init__(self, server: Server, limits: wire.Limits) -> None:
        super().__init__(limits)
        self._server = server
        self.gate = server
        self.counted = False  # counted in its source's connections
        self.unauth = False  # holds one of its source's handshake slots
        self.deadline: float | None = None  # loop time by which the handshake must be done
        self.holding = False  # in the TLS handshake: the handshake slot is given back by its task only

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._server._spawn(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._release(self)
        super().connection_lost(exc)
