"""The rendezvous coordinator: named groups, rank assignment, peer table,
a key-value store and barriers per group instance, liveness, generations.

One :class:`~netcoll.rpc.RpcServer` serves every group. A group is created by
its first joiner, which fixes its ``world_size``; ``join`` long-polls until
``world_size`` members are in, then every joiner gets the same peer table and
its rank (see :mod:`.groups` for the rules). The group is then *running*:
membership is frozen, members stay connected, and a member whose connection
drops (or who stops sending heartbeats) is reported to the others with a
``member_lost`` EVENT. When no member of a running group is left connected,
the group is deleted and its name can be used again; each instance of a name
gets the next ``generation`` and a fresh random ``session`` id, and the
key-value store and barriers belong to that instance alone.

RPC methods (params -> result; errors are ``RendezvousError`` /
``RendezvousTimeout`` / ``TypeError`` / ``ValueError``):

========== ============================================================ =====================================
method     params                                                       result
========== ============================================================ =====================================
join       group, world_size, rank|None, member_id, listen_port,        rank, world_size, generation, session,
           advertise_host|None, timeout                                 peers=[{rank, host, port, member_id}]
kv_set     group, key, value (or the msgpack bytes of it as payload)    {}
kv_get     group, key, timeout                                          {key}; payload = msgpack of the value
kv_add     group, key, amount                                           the new int
kv_delete  group, key                                                   {deleted: bool}
barrier    group, name, timeout                                         {}
leave      group                                                        {}
status     (none)                                                       {groups: [{name, world_size, state,
                                                                        generation, session, members: [...]}]}
========== ============================================================ =====================================

Values in the store travel as an opaque msgpack payload, so they are not
bound by the frame header limit and may use any msgpack type (bytes, int map
keys...).

Limits (:mod:`netcoll.limits`, ``Coordinator(limits=...)``): every count or
size a request declares is checked before anything is allocated or looped
over by it -- ``world_size`` against ``max_world_size``, timeouts against
``max_deadline_s``, keys and barrier names against ``max_kv_key_bytes``,
values against ``max_kv_value_bytes``, a group's keys (plus keys being waited
for, plus open barriers) against ``max_kv_keys`` and its stored bytes against
``max_kv_bytes``. A refusal is a ``RendezvousError`` naming the limit and its
``NETCOLL_LIMIT_*`` variable, and a WARNING log line here. Peer-supplied
strings are logged through :func:`netcoll.escape.escape`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import RendezvousError, RendezvousTimeout
from ..escape import escape
from ..limits import DEFAULT, Limits
from ..rpc import Handler, Reply, RpcServer, Session
from ..wire import Kind
from .groups import (
    INT64_MAX,
    INT64_MIN,
    Member,
    assign_ranks,
    barrier_timeout_message,
    check_join,
    group_name,
    key_param,
    limit_error,
    loopback_conflict,
    parse_join,
    resolve_host,
    show,
    timeout_message,
    timeout_param,
)

log = logging.getLogger("netcoll.rendezvous")

PENDING, RUNNING = "pending", "running"
#: a session is dropped when silent for this many of its declared heartbeat intervals
LIVENESS_FACTOR = 3.0
_SESSION_KEY = "rendezvous"  # Session.data[...] -> {group name: (_Group, Member)}


@dataclass(eq=False)
class _Barrier:
    arrived: set[int] = field(default_factory=set)
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass(eq=False)
class _Group:
    """One instance of a named group."""

    name: str
    world_size: int
    generation: int
    session_id: str
    state: str = PENDING
    pending: list[Member] = field(default_factory=list)
    waiters: dict[Member, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    members: list[Member] = field(default_factory=list)  # by rank, once running
    kv: dict[str, bytes] = field(default_factory=dict)
    kv_bytes: int = 0  # sum of the stored values' sizes
    kv_waiters: dict[str, set[asyncio.Future[None]]] = field(default_factory=dict)
    barriers: dict[str, _Barrier] = field(default_factory=dict)
    broken: str | None = None  # why barriers can no longer complete (a member is gone)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail a future its waiters may already have abandoned (no "never retrieved" noise)."""
    if not fut.done():
        fut.set_exception(exc)
        fut.exception()


class Coordinator:
    """Runs the rendezvous server in-process.

    ``async with Coordinator() as c:`` starts it on ``host:port`` (``port=0``:
    any free port); ``c.address`` is ``"host:port"`` with the real port. Every
    client must prove ``token`` when one is set. Other services may add RPC
    methods with :meth:`register` (the job service does).
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, token: str | None = None, *, limits: Limits | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.token = token
        self.limits = DEFAULT if limits is None else limits
        own: dict[str, Handler] = {
            "join": self._join,
            "leave": self._leave,
            "status": self._status,
            "barrier": self._barrier,
            "kv_set": self._kv_set,
            "kv_get": self._kv_get,
            "kv_add": self._kv_add,
            "kv_delete": self._kv_delete,
        }
        self.methods: dict[str, Handler] = {name: _logged(name, h) for name, h in own.items()}
        self.groups: dict[str, _Group] = {}
        self._generations: dict[str, int] = {}
        self._rpc: RpcServer | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._stopped: asyncio.Event | None = None
        self._closing = False
        self._wake_reaper: asyncio.Event | None = None
        #: ``async hook(session)`` run when any client connection closes (the job service uses it)
        self.close_hooks: list[Callable[[Session], Awaitable[None]]] = []

    # -- lifecycle -------------------------------------------------------------
    @property
    def address(self) -> str:
        if self._rpc is None:
            raise RuntimeError("the coordinator is not started")
        host, port = self._rpc.address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def register(self, method: str, handler: Handler) -> None:
        """Serve another RPC method (``async handler(session, params, payload)``)."""
        self.methods[method] = handler

    @property
    def sessions(self) -> set[Session]:
        return self._rpc.sessions if self._rpc is not None else set()

    async def start(self) -> Coordinator:
        if self._rpc is not None:
            return self
        self._stopped = asyncio.Event()
        self._wake_reaper = asyncio.Event()
        self._rpc = RpcServer(
            self.methods, token=self.token, role="coordinator", on_open=self._on_open, on_close=self._on_close
        )
        await self._rpc.start(self.host, self.port)
        self._reaper = asyncio.create_task(self._reap(), name="netcoll-rendezvous-liveness")
        log.info(
            "rendezvous coordinator listening on %s%s", self.address, " (token auth)" if self.token is not None else ""
        )
        return self

    async def close(self) -> None:
        if self._rpc is None or self._closing:
            return
        rpc, self._closing = self._rpc, True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        await rpc.close()
        for group in list(self.groups.values()):
            self._delete(group, "the coordinator is shutting down")
        self._rpc, self._closing = None, False
        if self._stopped is not None:
            self._stopped.set()

    async def serve_forever(self) -> None:
        """Start (if needed) and serve until :meth:`close` or cancellation."""
        await self.start()
        assert self._stopped is not None
        try:
            await self._stopped.wait()
        finally:
            await self.close()

    async def __aenter__(self) -> Coordinator:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- join / leave ------------------------------------------------------------
    async def _join(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        req = parse_join(params, self.limits)  # every size checked before anything is sized by it
        host = resolve_host(req.member_id, req.advertise_host, session.peer[0])
        group = self.groups.get(req.group)
        if group is not None and group.state == RUNNING:
            raise RendezvousError(
                f"group {req.group!r} is already running with {group.world_size} ranks (generation "
                f"{group.generation}); use another group name or wait until it closes"
            )
        mine: dict[str, tuple[_Group, Member]] = session.data.setdefault(_SESSION_KEY, {})
        if req.group in mine:
            raise RendezvousError(f"this connection is already a member of group {req.group!r}")
        evicted = check_join(
            req.group, group.world_size if group else req.world_size, group.pending if group else [], req, host
        )
        if group is None:
            group = self._create(req.group, req.world_size)
        member = Member(req.member_id, req.rank, host, req.listen_port, session.peer, session=session)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        group.pending.append(member)
        group.waiters[member] = fut
        mine[group.name] = (group, member)
        for other in evicted:
            self._drop_pending(
                group, other, RendezvousError(loopback_conflict(other.member_id, other.host, req.member_id, host))
            )
        log.info(
            "group %r: %s joined from %s:%s (%d/%d)",
            group.name,
            escape(member.member_id),
            *session.peer,
            len(group.pending),
            group.world_size,
        )
        if len(group.pending) == group.world_size:
            self._complete(group)
        message = ""
        try:
            await asyncio.wait([fut], timeout=req.timeout)
        finally:
            if not fut.done():  # timed out, or the connection went away
                message = timeout_message(group.name, group.world_size, group.pending, req.timeout)
                self._drop_pending(group, member, None)
        if not fut.done():
            log.info("group %r: %s timed out: %s", group.name, escape(member.member_id), escape(message, 1000))
            raise RendezvousTimeout(message)
        return fut.result()

    def _create(self, name: str, world_size: int) -> _Group:
        generation = self._generations.get(name, 0) + 1
        self._generations[name] = generation
        group = _Group(name, world_size, generation, secrets.token_hex(8))
        self.groups[name] = group
        return group

    def _complete(self, group: _Group) -> None:
        group.members = assign_ranks(group.pending, group.world_size)
        group.pending, group.state = [], RUNNING
        peers = [m.peer() for m in group.members]
        for m in group.members:
            fut = group.waiters.pop(m)
            if not fut.done():
                fut.set_result(
                    {
                        "rank": m.rank,
                        "world_size": group.world_size,
                        "generation": group.generation,
                        "session": group.session_id,
                        "peers": peers,
                    }
                )
        log.info(
            "group %r generation %d complete: %s",
            group.name,
            group.generation,
            ", ".join(f"{p['rank']}={escape(p['member_id'])}@{escape(p['host'])}:{p['port']}" for p in peers),
        )

    def _drop_pending(self, group: _Group, member: Member, exc: BaseException | None) -> None:
        """Remove a joiner from a pending group (failing its join with ``exc``)."""
        if member not in group.pending:
            return
        group.pending.remove(member)
        fut = group.waiters.pop(member, None)
        if fut is not None and exc is not None:
            _fail(fut, exc)
        self._forget(member, group)
        if not group.pending:
            self._delete(group, f"group {group.name!r} was abandoned before it completed")

    def _forget(self, member: Member, group: _Group) -> None:
        if member.session is not None:
            mine = member.session.data.get(_SESSION_KEY, {})
            if mine.get(group.name, (None,))[0] is group:
                del mine[group.name]

    def _delete(self, group: _Group, reason: str) -> None:
        if self.groups.get(group.name) is group:
            del self.groups[group.name]
        err = RendezvousError(reason)
        for m in list(group.pending) + group.members:
            self._forget(m, group)
        for fut in group.waiters.values():
            _fail(fut, err)
        group.waiters.clear()
        for futs in group.kv_waiters.values():
            for f in futs:
                _fail(f, err)
        group.kv_waiters.clear()
        for b in group.barriers.values():
            _fail(b.done, err)
        group.barriers.clear()
        log.info("group %r generation %d deleted: %s", group.name, group.generation, reason)

    def _member_gone(self, group: _Group, member: Member, topic: str, reason: str) -> None:
        """A member of a running group disconnected or left."""
        if not member.connected:
            return
        member.connected = False
        self._forget(member, group)
        member.session = None
        what = "left" if topic == "member_left" else "was lost"
        group.broken = f"rank {member.rank} (member {member.member_id!r}) {what}: {reason}"
        for b in group.barriers.values():
            _fail(b.done, RendezvousError(f"barrier cannot complete: {group.broken}"))
        group.barriers.clear()
        log.log(
            logging.INFO if topic == "member_left" else logging.WARNING,
            "group %r: %s",
            group.name,
            escape(group.broken, 1000),
        )
        event = {
            "topic": topic,
            "group": group.name,
            "generation": group.generation,
            "rank": member.rank,
            "member_id": member.member_id,
            "reason": reason,
        }
        alive = [m for m in group.members if m.connected]
        for m in alive:
            try:
                m.session.proto.write(Kind.EVENT, event)  # tiny; never blocks on a slow reader
            except (ConnectionError, RendezvousError, OSError, RuntimeError):
                pass
            except Exception:  # one broken link must not stop the others' events
                log.debug("could not notify %s", escape(m.member_id), exc_info=True)
        if not alive:
            self._delete(group, f"every member of group {group.name!r} has gone")

    async def _on_open(self, session: Session) -> None:
        if "heartbeat" in session.hello and self._wake_reaper is not None:
            self._wake_reaper.set()  # it may need to check more often now

    async def _on_close(self, session: Session) -> None:
        for hook in self.close_hooks:
            await hook(session)
        if self._closing:
            return  # close() deletes every group itself
        reason = session.data.get("drop_reason", "connection closed")
        for group, member in list(session.data.get(_SESSION_KEY, {}).values()):
            if group.state == PENDING:
                self._drop_pending(group, member, None)
            else:
                self._member_gone(group, member, "member_lost", reason)

    async def _leave(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        name = group_name(params)
        entry = session.data.get(_SESSION_KEY, {}).get(name)
        if entry is None:
            raise RendezvousError(f"this connection is not a member of group {name!r}")
        group, member = entry
        if group.state == PENDING:
            self._drop_pending(group, member, RendezvousError(f"left group {name!r} before it completed"))
        else:
            self._member_gone(group, member, "member_left", "left the group")
        return {}

    # -- key-value store and barrier ----------------------------------------------
    def _running(self, session: Session, params: dict[str, Any]) -> tuple[_Group, Member]:
        name = group_name(params)
        entry: tuple[_Group, Member] | None = session.data.get(_SESSION_KEY, {}).get(name)
        if entry is None:
            raise RendezvousError(f"this connection is not a member of group {name!r} (join it first)")
        if entry[0].state != RUNNING:
            raise RendezvousError(f"group {name!r} is still pending (it has not filled yet)")
        return entry

    def _check_value(self, group: _Group, key: str, nbytes: int) -> None:
        """Refuse storing ``nbytes`` under ``key`` over a store limit (before any copy)."""
        lim = self.limits
        if nbytes > lim.max_kv_value_bytes:
            raise limit_error(f"value for key {show(key)} of", f"{nbytes} bytes", "max_kv_value_bytes", lim)
        total = group.kv_bytes - len(group.kv.get(key, b"")) + nbytes
        if total > lim.max_kv_bytes:
            raise limit_error(f"key-value store of group {group.name!r} at", f"{total} bytes", "max_kv_bytes", lim)

    def _count_open(self, group: _Group, what: str) -> None:
        """Refuse a new stored key, awaited key or barrier over ``max_kv_keys``."""
        n = len(group.kv) + len(group.kv_waiters) + len(group.barriers)
        if n >= self.limits.max_kv_keys:
            raise limit_error(
                f"{what} in group {group.name!r} with", f"{n} keys and barriers", "max_kv_keys", self.limits
            )

    def _store(self, group: _Group, key: str, packed: bytes) -> None:
        group.kv_bytes += len(packed) - len(group.kv.get(key, b""))
        group.kv[key] = packed
        for fut in group.kv_waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    async def _kv_set(self, session: Session, params: dict[str, Any], payload: memoryview) -> dict[str, Any]:
        group, _ = self._running(session, params)
        key = key_param(params, limits=self.limits)
        if "value" in params:
            try:
                packed = msgpack.packb(params["value"], use_bin_type=True)
            except (OverflowError, ValueError, TypeError) as exc:
                raise TypeError(f"kv_set: the value for key {show(key)} is not msgpack-able: {exc}") from None
        else:
            packed = None
        nbytes = len(packed) if packed is not None else payload.nbytes
        if key not in group.kv:
            self._count_open(group, f"new key {show(key)}")
        self._check_value(group, key, nbytes)
        self._store(group, key, packed if packed is not None else bytes(payload))
        return {}

    async def _kv_get(self, session: Session, params: dict[str, Any], _: memoryview) -> Reply:
        group, _m = self._running(session, params)
        key, timeout = key_param(params, limits=self.limits), timeout_param(params, limits=self.limits)
        if key not in group.kv:
            if key not in group.kv_waiters:
                self._count_open(group, f"awaited key {show(key)}")
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            group.kv_waiters.setdefault(key, set()).add(fut)
            try:
                await asyncio.wait([fut], timeout=timeout)
            finally:
                waiting = group.kv_waiters.get(key)
                if waiting is not None:
                    waiting.discard(fut)
                    if not waiting:
                        del group.kv_waiters[key]
            if not fut.done():
                raise RendezvousTimeout(f"key {key!r} of group {group.name!r} was not set within {timeout:g}s")
            fut.result()  # raises when the group closed meanwhile
            if key not in group.kv:  # set, then deleted before we ran
                raise RendezvousError(f"key {key!r} of group {group.name!r} was deleted right after being set")
        return Reply({"key": key}, group.kv[key])

    async def _kv_add(self, session: Session, params: dict[str, Any], _: memoryview) -> int:
        group, _m = self._running(session, params)
        key, amount = key_param(params, limits=self.limits), params.get("amount", 1)
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise TypeError(f"amount must be an int, got {show(amount)}")
        if not INT64_MIN <= amount <= INT64_MAX:
            raise ValueError(f"amount must be a 64-bit signed integer, got {show(amount)}")
        try:
            current = msgpack.unpackb(group.kv[key], strict_map_key=False) if key in group.kv else 0
        except Exception as exc:  # noqa: BLE001 - the payload was never validated
            raise TypeError(f"kv_add: key {key!r} does not hold a msgpack int ({exc})") from None
        if not isinstance(current, int) or isinstance(current, bool):
            raise TypeError(f"kv_add: key {key!r} holds a {type(current).__name__}, not an int")
        new = current + amount
        if not INT64_MIN <= new <= INT64_MAX:
            raise ValueError(f"kv_add: key {show(key)} would overflow a 64-bit signed integer ({current} + {amount})")
        packed = msgpack.packb(new)
        if key not in group.kv:
            self._count_open(group, f"new key {show(key)}")
        self._check_value(group, key, len(packed))
        self._store(group, key, packed)
        return new

    async def _kv_delete(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        group, _m = self._running(session, params)
        old = group.kv.pop(key_param(params, limits=self.limits), None)
        if old is not None:
            group.kv_bytes -= len(old)
        return {"deleted": old is not None}

    async def _barrier(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        group, member = self._running(session, params)
        name = key_param(params, "name", limits=self.limits)
        timeout = timeout_param(params, limits=self.limits)
        if group.broken is not None:
            raise RendezvousError(f"barrier {name!r} of group {group.name!r} cannot complete: {group.broken}")
        assert member.rank is not None
        if name not in group.barriers:
            self._count_open(group, f"barrier {show(name)}")
        barrier = group.barriers.setdefault(name, _Barrier())
        if member.rank in barrier.arrived:
            raise RendezvousError(f"rank {member.rank} is already waiting at barrier {name!r}")
        barrier.arrived.add(member.rank)
        if len(barrier.arrived) == group.world_size:
            del group.barriers[name]
            barrier.done.set_result(None)
            return {}
        message = ""
        try:
            await asyncio.wait([barrier.done], timeout=timeout)
        finally:
            if not barrier.done.done():
                message = barrier_timeout_message(group.name, name, group.world_size, barrier.arrived, timeout)
                barrier.arrived.discard(member.rank)
                if not barrier.arrived and group.barriers.get(name) is barrier:
                    del group.barriers[name]
        if not barrier.done.done():
            raise RendezvousTimeout(message)
        barrier.done.result()
        return {}

    # -- status and liveness -------------------------------------------------------
    async def _status(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        return self.status()

    def status(self) -> dict[str, Any]:
        """``{groups: [...]}`` as the ``status`` RPC returns it."""
        out = []
        for group in sorted(self.groups.values(), key=lambda g: g.name):
            members = group.members if group.state == RUNNING else group.pending
            out.append(
                {
                    "name": group.name,
                    "world_size": group.world_size,
                    "state": group.state,
                    "generation": group.generation,
                    "session": group.session_id,
                    "members": [
                        {
                            "rank": m.rank if m.rank is not None else m.requested_rank,
                            "member_id": m.member_id,
                            "host": m.host,
                            "port": m.port,
                            "connected": m.connected,
                        }
                        for m in members
                    ],
                }
            )
        return {"groups": out}

    async def _reap(self) -> None:
        """Drop sessions silent for more than LIVENESS_FACTOR x their declared heartbeat."""
        loop = asyncio.get_running_loop()
        while True:
            pause = self._check_liveness(loop.time())  # (no session stays referenced while we wait)
            assert self._wake_reaper is not None
            try:
                async with asyncio.timeout(pause):
                    await self._wake_reaper.wait()
            except TimeoutError:
                pass
            self._wake_reaper.clear()

    def _check_liveness(self, now: float) -> float:
        """Drop the silent sessions; return how long to wait before checking again."""
        pause = 1.0
        for session in list(self.sessions):
            beat = session.hello.get("heartbeat")
            if not isinstance(beat, (int, float)) or isinstance(beat, bool) or not beat > 0:
                continue  # plain RPC clients that do not heartbeat are never reaped
            if isinstance(beat, int) and beat.bit_length() > 64:
                beat = 1e18  # (float() of a huge int overflows) effectively never
            beat = max(float(beat), 0.02)
            silent = now - session.last_seen
            if silent > LIVENESS_FACTOR * beat and "drop_reason" not in session.data:
                self._drop(session, f"no heartbeat for {silent:.2f}s (limit {LIVENESS_FACTOR:g} x {beat:g}s)")
            pause = min(pause, beat / 2)
        return pause

    def _drop(self, session: Session, reason: str) -> None:
        log.warning("dropping %s:%s: %s", *session.peer, reason)
        session.data["drop_reason"] = reason
        proto = session.proto
        proto.fail(RendezvousError(f"coordinator closed the connection: {reason}"), tell_peer=True)
        if proto.transport is not None and proto.transport.get_write_buffer_size():
            proto.abort()  # a dead reader would keep a graceful close waiting forever


def _logged(method: str, handler: Handler) -> Handler:
    """``handler``, logging every refusal it raises (a limit refusal as a WARNING)."""

    async def run(session: Session, params: dict[str, Any], payload: memoryview) -> Any:
        try:
            return await handler(session, params, payload)
        except RendezvousTimeout:
            raise  # not a refusal; the handler logs what it needs
        except (RendezvousError, TypeError, ValueError) as exc:
            limit = getattr(exc, "limit", None)
            log.log(
                logging.WARNING if limit else logging.INFO,
                "%s from %s:%s refused%s: %s",
                method,
                *session.peer[:2],
                f" (limit {limit})" if limit else "",
                escape(str(exc), 500),
            )
            raise

    return run


__all__ = ["Coordinator", "LIVENESS_FACTOR"]
