"""Request/response RPC over netcoll frames (REQUEST / RESPONSE / EVENT).

Used by the rendezvous coordinator and by the job service. Every request runs
in its own task on the server, so long-polling calls (``join``, ``wait``)
never block other requests on the same connection. Requests and responses may
carry one raw binary payload (array bodies); parameters are msgpack maps.

Errors travel as ``{"type": name, "message": text}`` and are raised on the
client as the netcoll error type of that name (``RendezvousError``...) or the
builtin ``TypeError``/``ValueError``/``KeyError``/``TimeoutError``, else
:class:`RpcError`.
"""

from __future__ import annotations

import asyncio
import builtins
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from . import errors
from .errors import NetcollError, ProtocolError
from .escape import escape
from .limits import DEFAULT as DEFAULT_LIMITS
from .limits import Limits
from .links.connection import FramedProtocol, open_connection
from .mesh.certs import TlsConfig
from .mesh.handshake import client_handshake, server_handshake
from .mesh.server import Server
from .wire import Frame, Kind

log = logging.getLogger("netcoll.rpc")

_ACTIVE_KEY = "rpc.last_answer"  # Session.data: loop time of the last answered request
#: a client PINGs every ``idle_timeout / KEEPALIVE_DIVISOR`` (from the server's WELCOME)
KEEPALIVE_DIVISOR = 3.0

_BUILTIN_ERRORS = {"TypeError", "ValueError", "KeyError", "TimeoutError", "LookupError"}


class RpcError(NetcollError):
    """The server failed a request with an error of a type the client does not map."""


class Reply:
    """A handler's answer with a binary payload attached."""

    __slots__ = ("result", "payload")

    def __init__(self, result: Any, payload: bytes | memoryview | None = None) -> None:
        self.result, self.payload = result, payload


Handler = Callable[["Session", dict[str, Any], memoryview], Awaitable[Any]]


def error_to_wire(exc: BaseException) -> dict[str, str]:
    if isinstance(exc, NetcollError):
        return {"type": type(exc).__name__, "message": str(exc)}
    for base in (KeyError, TimeoutError, TypeError, ValueError):  # subclasses (pydantic's ValidationError...)
        if isinstance(exc, base):
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            return {"type": base.__name__, "message": str(text)}
    return {"type": "RpcError", "message": f"internal error: {type(exc).__name__}: {exc}"}


def error_from_wire(err: Any) -> BaseException:
    if not isinstance(err, dict):
        return RpcError(f"malformed error from server: {err!r}")
    name, message = str(err.get("type", "")), str(err.get("message", ""))
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, NetcollError):
        return cls(message)
    if name in _BUILTIN_ERRORS:
        return getattr(builtins, name)(message)  # type: ignore[no-any-return]
    return RpcError(message)


class Session:
    """The server's side of one client connection."""

    def __init__(self, proto: FramedProtocol, hello: dict[str, Any]) -> None:
        self.proto = proto
        self.hello = hello
        self.peer = proto.peername
        self.data: dict[str, Any] = {}
        #: loop time of the last frame received from the client (liveness checks)
        self.last_seen = asyncio.get_running_loop().time()

    async def push(
        self, topic: str, fields: dict[str, Any] | None = None, payload: bytes | memoryview | None = None
    ) -> None:
        await self.proto.send(
            Kind.EVENT, dict(fields or {}, topic=topic), None if payload is None else memoryview(payload).cast("B")
        )


class RpcServer:
    """Serves ``methods`` to authenticated clients.

    Args:
        methods: name -> ``async handler(session, params, payload)``; returns a
            msgpack-able result or a :class:`Reply`.
        token: shared secret every client must prove (None: no auth) -- the member token.
        client_token: a second secret; sessions proven with it hold role ``client``
            (``session.proto.credential``), and the methods decide what a client may call.
        role: announced in the CHALLENGE (``"coordinator"``...).
        on_open / on_close: called with each session (``on_open`` may raise to refuse).
        limits: per-source connection limits, handshake and idle timeouts
            (default :data:`netcoll.limits.DEFAULT`). A session with no request
            in flight that sends no frame for ``idle_timeout_s`` (0: never) is
            closed with an ERROR; the WELCOME announces it as ``idle_timeout``
            so :class:`RpcClient` PINGs well within it.
        tls: mutual TLS on every connection (clients must use it too).
    """

    def __init__(
        self,
        methods: dict[str, Handler],
        *,
        token: str | None = None,
        client_token: str | None = None,
        role: str = "rpc",
        on_open: Callable[[Session], Awaitable[None]] | None = None,
        on_close: Callable[[Session], Awaitable[None]] | None = None,
        limits: Limits | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.limits = DEFAULT_LIMITS if limits is None else limits
        self.methods = methods
        self.token = token
        self.client_token = client_token
        self.role = role
        self.on_open = on_open
        self.on_close = on_close
        #: called with each PING's session and body (a heartbeat may carry a report); what it
        #: returns is the PONG's body (None: empty)
        self.on_ping: Callable[[Session, dict[str, Any]], dict[str, Any] | None] | None = None
        self.sessions: set[Session] = set()
        self._server = Server(self._serve, settings=self.limits, tls=tls)
        self.address: tuple[str, int] = ("", 0)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self.address = await self._server.start(host, port)
        return self.address

    async def close(self) -> None:
        await self._server.close()

    async def _serve(self, proto: FramedProtocol) -> None:
        idle = self.limits.idle_timeout_s
        hello = await server_handshake(
            proto,
            token=self.token,
            role=self.role,
            accept=lambda _hello: {"idle_timeout": float(idle)} if idle else {},
            timeout=self.limits.handshake_timeout_s,
            client_token=self.client_token,
        )
        session = Session(proto, hello)
        tasks: set[asyncio.Task[None]] = set()
        if self.on_open is not None:
            try:
                await self.on_open(session)
            except (NetcollError, ValueError, TypeError) as exc:
                proto.fail(exc, tell_peer=True)
                return
        self.sessions.add(session)
        try:
            while True:
                try:
                    frame = await self._next_frame(session, tasks)
                except (ConnectionError, NetcollError):
                    return
                if frame is None:
                    log.info("closing idle RPC connection from %s:%s", *session.peer)
                    proto.fail(
                        ConnectionAbortedError(
                            f"idle for {self.limits.idle_timeout_s:g}s with no request in flight; closing "
                            "(PING to keep a connection open)"
                        ),
                        tell_peer=True,
                    )
                    return
                session.last_seen = asyncio.get_running_loop().time()
                if frame.kind == Kind.PING:
                    answer = None
                    if frame.header and self.on_ping is not None:
                        answer = self.on_ping(session, frame.header)
                    await proto.send(Kind.PONG, answer or {})
                elif frame.kind != Kind.REQUEST:
                    proto.fail(ProtocolError(f"expected REQUEST, got {frame.kind.name}"), tell_peer=True)
                    return
                else:
                    task = asyncio.create_task(self._handle(session, frame))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        finally:
            self.sessions.discard(session)
            for task in tasks:
                task.cancel()
            if self.on_close is not None:
                await self.on_close(session)

    async def _next_frame(self, session: Session, tasks: set[asyncio.Task[None]]) -> Frame | None:
        """The client's next frame, or None once the session has been idle (no
        frame received, no request in flight) for ``idle_timeout_s``."""
        idle = self.limits.idle_timeout_s
        if not idle:
            return await session.proto.next_frame()
        loop = asyncio.get_running_loop()
        while True:
            if tasks:
                left = idle  # a request in flight: not idle; look again later
            else:
                left = max(session.last_seen, session.data.get(_ACTIVE_KEY, 0.0)) + idle - loop.time()
                if left <= 0:
                    return None
            try:
                async with asyncio.timeout(left):
                    return await session.proto.next_frame()
            except TimeoutError:
                continue

    async def _handle(self, session: Session, frame: Frame) -> None:
        rid, method = frame.header["id"], frame.header["method"]
        params = frame.header.get("params") or {}
        handler = self.methods.get(method)
        payload: bytes | memoryview | None = None
        try:
            if handler is None:
                raise ValueError(f"unknown method {escape(method, 100)}; known: {', '.join(sorted(self.methods))}")
            if not isinstance(params, dict):
                raise TypeError(f"params of {escape(method, 100)} must be a map")
            result = await handler(session, params, frame.payload)
            if isinstance(result, Reply):
                result, payload = result.result, result.payload
            header: dict[str, Any] = {"id": rid, "ok": True, "result": result}
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure becomes an error reply
            if not isinstance(exc, (NetcollError, ValueError, TypeError, KeyError, TimeoutError)):
                log.exception("RPC %s failed", escape(method))
            header = {"id": rid, "ok": False, "error": error_to_wire(exc)}
        body = None if payload is None else memoryview(payload).cast("B")
        try:
            try:
                await session.proto.send(Kind.RESPONSE, header, body)
            except NetcollError as exc:  # the answer cannot be framed (over a limit): say so, never leave it unanswered
                log.warning("RPC %s: cannot send its answer: %s", escape(method), escape(str(exc)))
                await session.proto.send(Kind.RESPONSE, {"id": rid, "ok": False, "error": error_to_wire(exc)}, None)
        except (ConnectionError, NetcollError):
            pass
        finally:
            session.data[_ACTIVE_KEY] = asyncio.get_running_loop().time()  # idle counts from the last answer


class RpcClient:
    """Client side: ``await RpcClient.connect("host:port")``, then ``call``."""

    def __init__(self, proto: FramedProtocol, welcome: dict[str, Any]) -> None:
        self.proto = proto
        self.welcome = welcome
        self.events: asyncio.Queue[tuple[dict[str, Any], memoryview]] = asyncio.Queue()
        #: called with the body of each PONG that has one (a heartbeat's answer)
        self.on_pong: Callable[[dict[str, Any]], None] | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[Any, memoryview]]] = {}
        proto.on_frame = self._on_frame
        proto.on_lost = self._on_lost
        self._keepalive: asyncio.Task[None] | None = None
        idle = welcome.get("idle_timeout")
        if isinstance(idle, (int, float)) and not isinstance(idle, bool) and idle > 0:
            self._keepalive = asyncio.get_running_loop().create_task(
                self._ping(idle / KEEPALIVE_DIVISOR), name="netcoll-rpc-keepalive"
            )

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        token: str | None = None,
        role: str = "client",
        hello: dict[str, Any] | None = None,
        timeout: float = 10.0,
        local_host: str | None = None,
        credential: str = "member",
        tls: TlsConfig | None = None,
    ) -> RpcClient:
        host, port = split_address(address)
        try:
            async with asyncio.timeout(timeout):
                proto = await open_connection(host, port, local_host=local_host, tls=tls, timeout=timeout)
        except TimeoutError:
            raise TimeoutError(f"could not connect to {address} within {timeout:g}s") from None
        except OSError as exc:
            why = os.strerror(exc.errno).lower() if exc.errno else (exc.strerror or str(exc))
            raise ConnectionRefusedError(f"could not connect to {address}: {why}") from None
        try:
            welcome = await client_handshake(
                proto, token=token, role=role, hello=hello, timeout=timeout, credential=credential, probe=True
            )
        except BaseException:
            proto.close()
            raise
        pushed = list(proto.queue)  # anything the server sent right after WELCOME
        proto.queue.clear()
        client = cls(proto, welcome)
        for frame in pushed:
            client._on_frame(frame)
        return client

    def _on_frame(self, frame: Frame) -> None:
        if frame.kind == Kind.RESPONSE:
            fut = self._pending.pop(frame.header["id"], None)
            if fut is None or fut.done():
                return
            if frame.header["ok"]:
                fut.set_result((frame.header.get("result"), frame.payload))
            else:
                fut.set_exception(error_from_wire(frame.header.get("error")))
        elif frame.kind == Kind.EVENT:
            self.events.put_nowait((frame.header, frame.payload))
        elif frame.kind == Kind.PONG:
            if frame.header and self.on_pong is not None:
                self.on_pong(frame.header)
        else:
            self.proto.fail(ProtocolError(f"unexpected {frame.kind.name} frame from server"), tell_peer=True)

    async def _ping(self, interval: float) -> None:
        """PING the server often enough that it never finds this connection idle."""
        try:
            while self.proto.lost is None:
                await asyncio.sleep(interval)
                await self.proto.send(Kind.PING, {})
        except (ConnectionError, NetcollError):
            return

    def _stop_keepalive(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None

    def _on_lost(self, exc: BaseException | None) -> None:
        self._stop_keepalive()
        err = (
            exc
            if isinstance(exc, (ConnectionError, NetcollError))
            else ConnectionResetError(f"connection to the server lost: {exc}")
        )
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()

    @property
    def closed(self) -> bool:
        return self.proto.lost is not None

    async def call_payload(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        payload: bytes | memoryview | None = None,
        timeout: float | None = None,
    ) -> tuple[Any, memoryview]:
        """Call ``method``; return (result, response payload)."""
        if self.proto.lost is not None:
            raise ConnectionResetError(f"connection to the server is closed ({self.proto.lost})")
        rid = next(self._ids)
        fut: asyncio.Future[tuple[Any, memoryview]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            await self.proto.send(
                Kind.REQUEST,
                {"id": rid, "method": method, "params": params or {}},
                None if payload is None else memoryview(payload).cast("B"),
            )
            if timeout is None:
                return await fut
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            if not fut.cancelled():  # the server's own error (RendezvousTimeout...): keep it
                raise
            raise TimeoutError(f"{method} got no answer within {timeout:g}s") from None
        finally:
            self._pending.pop(rid, None)

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        payload: bytes | memoryview | None = None,
        timeout: float | None = None,
    ) -> Any:
        result, _ = await self.call_payload(method, params, payload, timeout)
        return result

    async def close(self) -> None:
        self._stop_keepalive()
        self.proto.close()
        if self.proto.transport is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.proto.closed), 2.0)
            except (TimeoutError, asyncio.CancelledError):
                self.proto.abort()


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) -> (host, port); ValueError when malformed."""
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"address must be 'host:port', got {address!r}")
    host, _, port_s = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"address must be 'host:port' with a numeric port, got {address!r}") from None
    if not host or not 0 < port < 65536:
        raise ValueError(f"address must be 'host:port' with 0 < port < 65536, got {address!r}")
    return host, port
