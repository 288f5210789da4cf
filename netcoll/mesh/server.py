"""A listening socket for netcoll connections, with the limits every listener
keeps per source address (the coordinator's, the RPC servers', a rank's peer port).

:class:`Server` accepts connections (:class:`~netcoll.links.listener.Listener`)
as :class:`~netcoll.links.connection.FramedProtocol`, runs TLS under each when
configured, and hands each to its handler in a task of its own; it counts
connections and handshakes in progress per source, refuses what is over the
limits, and logs failed handshakes at a bounded rate (:class:`RateLimitedLog`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import wire
from ..errors import NetcollError, ProtocolError
from ..escape import escape
from ..limits import DEFAULT as DEFAULT_SETTINGS
from ..limits import Limits
from ..links import listener
from ..links.connection import FramedProtocol, start_tls
from .certs import TlsConfig, describe_failure

log = logging.getLogger("netcoll.transport")


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
        limits: wire.FrameLimits = wire.DEFAULT_LIMITS,
        *,
        settings: Limits | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits
        #: with TLS, every accepted connection runs the TLS handshake before ``handler``
        self.tls = tls
        self.settings = DEFAULT_SETTINGS if settings is None else settings
        self.server: listener.Listener | None = None
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
        self.server = listener.Listener(self._factory, paused=self.tls is not None)
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
    def __init__(self, server: Server, limits: wire.FrameLimits) -> None:
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
