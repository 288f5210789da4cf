"""Client of the rendezvous coordinator.

::

    async with await RendezvousClient.connect("coord:29400", token=tok) as rdzv:
        me = await rdzv.join(group="default", world_size=4, rank=None, listen_port=29500)
        me.rank, me.peers            # peer table sorted by rank
        await rdzv.kv_set("addr", b"...")
        await rdzv.barrier("ready", timeout=30)

Liveness has two parts, so a busy event loop is not mistaken for a dead process:

* **The process** -- a daemon thread of the client (:class:`~netcoll.rendezvous.lease.Lease`) with its own
  event loop and its own connection claims this connection's *lease* and PINGs
  at the interval the coordinator grants (``liveness_timeout_s / 4``). A user
  event loop blocked by a training step or a checkpoint write does not stop it;
  the process dying or being stopped (SIGSTOP) does, and after
  ``liveness_timeout_s`` without a heartbeat the coordinator declares the member
  *gone* (like torch elastic's keep-alive thread, or an etcd lease).
* **The event loop** -- the client's loop also sends a PING every ``heartbeat``
  seconds on this connection (declared in its HELLO). When those stop for
  ``progress_timeout_s`` while the process still heartbeats, the coordinator
  reports the member *unresponsive* (log and ``status``) but keeps it. The client
  closes a connection on which the coordinator has been silent for
  ``3 x heartbeat``, so both sides notice a dead peer without relying on TCP
  timeouts.

The heartbeat thread stops when the client closes (``close()`` waits for it),
when the connection is lost, or when the client's event loop is closed.

Server pushes (``member_lost`` / ``member_left`` and, locally,
``coordinator_lost``) arrive through the ``on_event`` callback when one is
set, else as dicts on :attr:`RendezvousClient.events` -- a bounded queue
(:data:`EVENT_QUEUE_MAX`; when nobody reads it the oldest events are dropped,
counted in ``events_dropped`` and logged once), so a subscriber that never
reads cannot make the process grow: the rank daemon gets every job (with its
inline input bytes) as an event and consumes them through ``on_event``.

When the connection is lost the client unhooks itself from the protocol (and
drops ``on_event``), so a closed client is freed by reference counting alone,
without waiting for the cycle collector.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import NetcollError, RendezvousError
from ..escape import escape
from ..mesh.certs import TlsConfig
from ..rpc import RpcClient
from ..wire import Frame, Kind
from .groups import parse_join
from .lease import Lease
from .liveness import LIVENESS_FACTOR

log = logging.getLogger("netcoll.rendezvous")

DEFAULT_HEARTBEAT = 2.0
DEFAULT_JOIN_TIMEOUT = 300.0
_REPLY_MARGIN = 5.0  # extra client-side wait so the coordinator's own timeout error wins
#: events kept for a reader of :attr:`RendezvousClient.events` (oldest dropped beyond)
EVENT_QUEUE_MAX = 256


@dataclass(frozen=True, slots=True)
class Peer:
    """One row of the peer table."""

    rank: int
    host: str
    port: int
    member_id: str

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class JoinResult:
    """What every member of a completed group learns: its rank and the peer table."""

    rank: int
    world_size: int
    generation: int
    session: str
    peers: tuple[Peer, ...]

    @classmethod
    def from_wire(cls, result: dict[str, Any]) -> JoinResult:
        try:
            peers = tuple(
                Peer(int(p["rank"]), str(p["host"]), int(p["port"]), str(p["member_id"])) for p in result["peers"]
            )
            return cls(
                int(result["rank"]), int(result["world_size"]), int(result["generation"]), str(result["session"]), peers
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RendezvousError(f"malformed join result from the coordinator: {exc!r}") from None


def new_member_id() -> str:
    """``"<hostname>-<pid>-<random hex>"``: unique without any orchestrator help."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class RendezvousClient:
    """A connection to the coordinator; create it with :meth:`connect`."""

    def __init__(self, rpc: RpcClient, *, address: str, heartbeat: float | None, lease: Lease | None = None) -> None:
        self.rpc = rpc
        self.address = address
        self.heartbeat = heartbeat
        self.member_id = new_member_id()
        self.group: str | None = None
        self.result: JoinResult | None = None
        #: pushed events while no ``on_event`` is set (bounded: the oldest are dropped)
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue(EVENT_QUEUE_MAX)
        self.events_dropped = 0
        #: called with every pushed event instead of queueing it on :attr:`events`
        self.on_event: Callable[[dict[str, Any]], None] | None = None
        self._closing = False
        loop = asyncio.get_running_loop()
        self._unanswered_since: float | None = None  # when the oldest unanswered PING went out
        self._inner_frame: Callable[[Frame], None] | None = rpc.proto.on_frame
        self._inner_lost: Callable[[BaseException | None], None] | None = rpc.proto.on_lost
        rpc.proto.on_frame, rpc.proto.on_lost = self._on_frame, self._on_lost
        self._heartbeat_task: asyncio.Task[None] | None = None
        if heartbeat:
            self._heartbeat_task = loop.create_task(self._beat(heartbeat), name="netcoll-rendezvous-heartbeat")
        #: the heartbeat thread (None without heartbeats)
        self.lease = lease
        if lease is not None:
            lease.start()

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        local_host: str | None = None,
        heartbeat: float | None = DEFAULT_HEARTBEAT,
        tls: TlsConfig | None = None,
    ) -> RendezvousClient:
        """Connect and authenticate (``AuthenticationError`` on a token mismatch;
        with ``tls``, both connections run mutual TLS).

        ``heartbeat`` is how often the event loop PINGs; the heartbeat thread
        starts at once and beats at the interval the coordinator grants.
        ``heartbeat=None`` sends no heartbeats at all (and starts no thread); the
        coordinator then relies on TCP alone to notice this client is gone."""
        if heartbeat is not None and not (isinstance(heartbeat, (int, float)) and heartbeat > 0):
            raise ValueError(f"heartbeat must be a positive number of seconds or None, got {heartbeat!r}")
        lease_id = secrets.token_hex(16) if heartbeat else None
        hello = {"heartbeat": float(heartbeat), "lease": lease_id} if heartbeat else {}
        rpc = await RpcClient.connect(
            address, token=token, role="rendezvous", hello=hello, timeout=timeout, local_host=local_host, tls=tls
        )
        lease = None
        if lease_id is not None:
            lease = Lease(
                address,
                lease_id,
                token=token,
                local_host=local_host,
                timeout=timeout,
                main_loop=asyncio.get_running_loop(),
                tls=tls,
            )
        return cls(rpc, address=address, heartbeat=heartbeat, lease=lease)

    # -- frames, events, liveness ---------------------------------------------------
    def _on_frame(self, frame: Frame) -> None:
        self._unanswered_since = None
        if frame.kind == Kind.EVENT:
            event = dict(frame.header)
            if frame.payload.nbytes:
                event["payload"] = frame.payload
            self._emit(event)
        elif self._inner_frame is not None:
            self._inner_frame(frame)

    def _on_lost(self, exc: BaseException | None) -> None:
        if self.lease is not None:
            self.lease.request_stop()  # nothing left to keep alive (close() waits for it)
        try:
            if self._inner_lost is not None:
                self._inner_lost(exc)
            if not self._closing:
                self._emit({"topic": "coordinator_lost", "reason": str(exc) if exc else "connection closed"})
        finally:
            self._unhook()

    def _unhook(self) -> None:
        """Break the reference cycles through the protocol (proto -> our bound
        methods -> self -> rpc -> proto) once nothing more can arrive on it."""
        proto = self.rpc.proto
        if proto.on_frame == self._on_frame:
            proto.on_frame = None
        if proto.on_lost == self._on_lost:
            proto.on_lost = None
        self._inner_frame = self._inner_lost = None
        self.on_event = None

    def _emit(self, event: dict[str, Any]) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # a callback bug must not break the connection
                log.exception("rendezvous on_event callback failed")
            return
        if self.events.full():
            self.events.get_nowait()  # nobody reads: keep the newest, bounded
            self.events_dropped += 1
            if self.events_dropped == 1:
                log.warning(
                    "rendezvous events from %s are not being read; keeping the last %d (dropped %s)",
                    escape(self.address),
                    EVENT_QUEUE_MAX,
                    escape(event.get("topic")),
                )
        self.events.put_nowait(event)

    async def _beat(self, interval: float) -> None:
        loop = asyncio.get_running_loop()
        proto = self.rpc.proto
        try:
            while proto.lost is None:
                await asyncio.sleep(interval)
                # Measured from our oldest unanswered PING, not from the last frame, so a
                # stall of our own event loop is not mistaken for a dead coordinator.
                now = loop.time()
                silent = 0.0 if self._unanswered_since is None else now - self._unanswered_since
                if silent > LIVENESS_FACTOR * interval:
                    proto.fail(
                        RendezvousError(
                            f"the coordinator at {self.address} has not answered for "
                            f"{silent:.1f}s; closing the connection"
                        ),
                        tell_peer=True,
                    )
                    if proto.transport is not None and proto.transport.get_write_buffer_size():
                        proto.abort()
                    return
                if self._unanswered_since is None:
                    self._unanswered_since = now
                await proto.send(Kind.PING, {})
        except (ConnectionError, NetcollError):
            return

    # -- calls ------------------------------------------------------------------------
    def _group(self, group: str | None) -> str:
        name = group or self.group
        if name is None:
            raise RendezvousError("join a group first (or pass group=)")
        return name

    @staticmethod
    def _wait(timeout: float | None) -> float | None:
        return None if timeout is None else timeout + _REPLY_MARGIN

    async def join(
        self,
        group: str = "default",
        *,
        world_size: int,
        rank: int | None = None,
        member_id: str | None = None,
        listen_port: int = 0,
        advertise_host: str | None = None,
        timeout: float | None = DEFAULT_JOIN_TIMEOUT,
    ) -> JoinResult:
        """Wait until ``world_size`` members have joined ``group``; return this
        member's rank and the peer table (``RendezvousTimeout`` lists who is missing)."""
        params = {
            "group": group,
            "world_size": world_size,
            "rank": rank,
            "member_id": member_id if member_id is not None else self.member_id,
            "listen_port": listen_port,
            "advertise_host": advertise_host,
            "timeout": timeout,
        }
        parse_join(params)  # bad arguments fail here, before any byte is sent
        result = JoinResult.from_wire(await self.rpc.call("join", params, timeout=self._wait(timeout)))
        self.member_id, self.group, self.result = str(params["member_id"]), group, result
        return result

    async def kv_set(self, key: str, value: Any, *, group: str | None = None) -> None:
        """Store any msgpack-able ``value`` (bytes included) under ``key``."""
        packed = msgpack.packb(value, use_bin_type=True)
        await self.rpc.call("kv_set", {"group": self._group(group), "key": key}, payload=packed)

    async def kv_get(self, key: str, timeout: float | None = None, *, group: str | None = None) -> Any:
        """The value of ``key``, waiting until some member sets it."""
        _, payload = await self.rpc.call_payload(
            "kv_get", {"group": self._group(group), "key": key, "timeout": timeout}, timeout=self._wait(timeout)
        )
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)

    async def kv_add(self, key: str, amount: int = 1, *, group: str | None = None) -> int:
        """Atomically add ``amount`` to the int under ``key`` (missing: 0); return the new value."""
        return int(await self.rpc.call("kv_add", {"group": self._group(group), "key": key, "amount": amount}))

    async def kv_decide(
        self, key: str, seq: int, value: Any, *, group: str | None = None, timeout: float | None = None
    ) -> Any:
        """Set-once: the value decided for ``(key, seq)``, ``value`` if this call was the
        first for it, else the first caller's (:meth:`~.store.Store.decide`)."""
        packed = msgpack.packb(value, use_bin_type=True)
        _, payload = await self.rpc.call_payload(
            "kv_decide", {"group": self._group(group), "key": key, "seq": seq}, payload=packed, timeout=timeout
        )
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)

    async def kv_delete(self, key: str, *, group: str | None = None) -> bool:
        """Delete ``key``; True if it existed."""
        result = await self.rpc.call("kv_delete", {"group": self._group(group), "key": key})
        return bool(result["deleted"])

    async def barrier(self, name: str = "barrier", timeout: float | None = None, *, group: str | None = None) -> None:
        """Return once every member of the group has reached barrier ``name``."""
        await self.rpc.call(
            "barrier", {"group": self._group(group), "name": name, "timeout": timeout}, timeout=self._wait(timeout)
        )

    async def leave(self, *, group: str | None = None) -> None:
        """Leave the group (the others get a ``member_left`` event)."""
        name = self._group(group)
        await self.rpc.call("leave", {"group": name})
        if name == self.group:
            self.group = None

    def report_with(
        self, report: Callable[[], dict[str, Any] | None], view: Callable[[Any], None] | None = None
    ) -> None:
        """Let every heartbeat carry ``report()`` (called from the heartbeat thread: it must
        be thread-safe), e.g. ``mesh.mailbox.snapshot``: the operations this rank is
        in, from which the coordinator builds its arrival board. ``view`` (also called in
        that thread) gets what the coordinator answers of the ranks this one waits for,
        e.g. ``mesh.answers.seen``."""
        if self.lease is not None:
            self.lease.report = report
            self.lease.view = view

    async def status(self) -> dict[str, Any]:
        """The coordinator's ``{groups: [...]}``."""
        return dict(await self.rpc.call("status", {}))

    @property
    def local_address(self) -> tuple[str, int]:
        """(host, port) this end of the coordinator connection is bound to: the
        local interface that routes to the coordinator (a good listen address)."""
        return self.rpc.proto.sockname

    @property
    def closed(self) -> bool:
        return self.rpc.closed

    async def close(self) -> None:
        """Leave the joined group (if any; best effort) and close the connection."""
        if self._closing:
            return
        self._closing = True
        if self.group is not None and not self.closed:
            try:  # a graceful goodbye: the others see member_left, not member_lost
                await self.rpc.call("leave", {"group": self.group}, timeout=1.0)
            except (NetcollError, ConnectionError, TimeoutError):
                pass
            self.group = None
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            await asyncio.gather(self._heartbeat_task, return_exceptions=True)
            self._heartbeat_task = None
        await self.rpc.close()
        if self.lease is not None:  # after the main connection: its close is the orderly goodbye
            await self.lease.join()
        if self.rpc.proto.closed.done():  # connection_lost ran (else _on_lost unhooks us when it does)
            self._unhook()

    async def __aenter__(self) -> RendezvousClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["RendezvousClient", "JoinResult", "Peer", "new_member_id"]
