"""The rendezvous coordinator: named groups, rank assignment, peer table,
a key-value store and barriers per group instance, liveness, generations.

One :class:`~netcoll.rpc.RpcServer` serves every group. A group is created by
its first joiner, which fixes its ``world_size``; ``join`` long-polls until
``world_size`` members are in, then every joiner gets the same peer table and
its rank (see :mod:`.groups` for the rules). The group is then *running*:
membership is frozen, members stay connected, and a member whose connection
drops (or who stops sending heartbeats) is reported to the others with a
``member_lost`` EVENT.

Liveness tells two things apart. A client's heartbeat thread holds a *lease*
on its main connection (the ``lease`` RPC, over a second connection of its
own) and PINGs every ``liveness_timeout_s / 4``: when those heartbeats stop for
``liveness_timeout_s`` the member **is gone** (its process died, was stopped or
was cut off) and is dropped like a closed connection. The client's event loop
PINGs on the main connection: when that is silent for ``progress_timeout_s``
while the heartbeats still arrive, the member **is unresponsive** (a long
training step, a checkpoint write): that is logged and shown by ``status``
(``liveness``), and the member stays in its group. A session that declares a
``heartbeat`` but holds no lease (an older client) is dropped after
``3 x heartbeat`` of silence, as before.

When no member of a running group is left connected,
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
                                                                        generation, session, members: [...]}],
                                                                        board: [...] (netcoll.rendezvous.board)}
lease      lease (the id the main connection declared in its HELLO)    {interval, timeout}: PING every interval
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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import AuthenticationError, RendezvousError, RendezvousTimeout
from ..escape import escape
from ..limits import DEFAULT, Limits
from ..mesh import auth
from ..mesh.certs import TlsConfig
from ..mesh.certs import coerce as coerce_tls
from ..rpc import Handler, Reply, RpcServer, Session
from ..wire import Kind
from . import board as arrivals
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
#: a lease holder PINGs this many times per ``liveness_timeout_s``
LEASE_BEATS = 4
#: a heartbeat whose rank has waited this long without data is answered with the stuck waits
#: of the ranks it waits for; the index of reports that answer reads is rebuilt this often
CHAIN_AFTER = 1.0
CHAIN_INDEX_AGE = 0.5
MIN_LIVENESS = 0.05  # seconds: the shortest liveness timeout honoured
_LEASE_KEY = "lease.holder"  # main Session.data[...] -> the heartbeat thread's Session
_LEASE_OF = "lease.of"  # heartbeat Session.data[...] -> the main Session
_UNRESPONSIVE = "liveness.unresponsive"  # Session.data[...] -> loop time its event loop went quiet
_REPORT = "board.report"  # main Session.data[...] -> its latest in-flight report (arrivals.Report)
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

    Roles: ``token`` is the member token (rank daemons, embedded ranks; it may
    call everything); a session proven with ``client_token`` is a *client* and may
    call only the methods registered with ``clients=True`` (``status`` here; the
    job service's submit/watch/get/cancel) -- anything else is refused with
    ``AuthenticationError``. Without tokens every session is a member.

    ``tls`` (a :class:`~netcoll.TlsConfig`, or a mapping of ``cert``/``key``/``ca``
    paths): mutual TLS on every connection. Secure by default: :meth:`start`
    raises :class:`~netcoll.InsecureListenerError` for a non-loopback ``host``
    with neither a token nor TLS, unless ``insecure=True``.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        *,
        client_token: str | None = None,
        limits: Limits | None = None,
        tls: TlsConfig | Mapping[str, Any] | None = None,
        insecure: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.token = token
        self.client_token = client_token
        self.tls = coerce_tls(tls)
        self.insecure = insecure
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
            "lease": self._lease,
        }
        self.methods: dict[str, Handler] = {
            name: _guarded(name, _logged(name, h), clients=name == "status") for name, h in own.items()
        }
        self.groups: dict[str, _Group] = {}
        self._generations: dict[str, int] = {}
        self._leases: dict[str, Session] = {}  # lease id -> the main session that declared it
        #: (when built, the reports by (group family, world rank)) for heartbeats' answers
        self._chain_index: tuple[float, dict[tuple[str, int], arrivals.Report]] | None = None
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

    def register(self, method: str, handler: Handler, *, clients: bool = False) -> None:
        """Serve another RPC method (``async handler(session, params, payload)``);
        members only unless ``clients`` (a client-token session may call it too)."""
        self.methods[method] = _guarded(method, handler, clients=clients)

    @property
    def sessions(self) -> set[Session]:
        return self._rpc.sessions if self._rpc is not None else set()

    async def start(self) -> Coordinator:
        if self._rpc is not None:
            return self
        auth.require_credentials("the coordinator", self.host, token=self.token, tls=self.tls, insecure=self.insecure)
        self._stopped = asyncio.Event()
        self._wake_reaper = asyncio.Event()
        self._rpc = RpcServer(
            self.methods,
            token=self.token,
            client_token=self.client_token,
            role="coordinator",
            on_open=self._on_open,
            on_close=self._on_close,
            tls=self.tls,
        )
        self._rpc.on_ping = self._on_ping
        await self._rpc.start(self.host, self.port)
        self._reaper = asyncio.create_task(self._reap(), name="netcoll-rendezvous-liveness")
        log.info(
            "rendezvous coordinator listening on %s%s%s",
            self.address,
            " (token auth)" if self.token is not None else "",
            " (mutual TLS)" if self.tls is not None else "",
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

    def _member_gone(self, group: _Group, member: Member, topic: str, reason: str, verdict: str = "was lost") -> None:
        """A member of a running group disconnected (``verdict``: "was lost", "is gone") or left."""
        if not member.connected:
            return
        member.connected = False
        self._forget(member, group)
        member.session = None
        what = "left" if topic == "member_left" else verdict
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
        lease = session.hello.get("lease")
        if lease is not None:
            if not isinstance(lease, str) or not 0 < len(lease) <= 64:
                raise ValueError(f"lease must be a string of at most 64 characters, got {show(lease)}")
            if lease in self._leases:
                raise ValueError("this lease id is already in use by another connection")
            self._leases[lease] = session
        if "heartbeat" in session.hello and self._wake_reaper is not None:
            self._wake_reaper.set()  # it may need to check more often now

    def _release_lease(self, session: Session) -> None:
        """Unlink a closing session from its lease: a main session's heartbeat
        connection is closed with it; when a heartbeat connection closes first
        (its thread failed, or one connection was cut), its main session is judged
        by its event loop's PINGs again, as a client without a lease is."""
        lease = session.hello.get("lease")
        if isinstance(lease, str) and self._leases.get(lease) is session:
            del self._leases[lease]
        holder: Session | None = session.data.pop(_LEASE_KEY, None)
        if holder is not None:
            holder.data.pop(_LEASE_OF, None)
            holder.proto.close()
        main: Session | None = session.data.pop(_LEASE_OF, None)
        if main is not None and main.data.get(_LEASE_KEY) is session:
            del main.data[_LEASE_KEY]
            main.data.pop(_UNRESPONSIVE, None)
            log.info(
                "the heartbeat connection of %s:%s closed; its event loop's PINGs are all we have now", *main.peer[:2]
            )

    async def _on_close(self, session: Session) -> None:
        self._release_lease(session)
        for hook in self.close_hooks:
            await hook(session)
        if self._closing:
            return  # close() deletes every group itself
        reason = session.data.get("drop_reason", "connection closed")
        verdict = session.data.get("drop_verdict", "was lost")
        for group, member in list(session.data.get(_SESSION_KEY, {}).values()):
            if group.state == PENDING:
                self._drop_pending(group, member, None)
            else:
                self._member_gone(group, member, "member_lost", reason, verdict)

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
                            **self._liveness_row(m),
                        }
                        for m in members
                    ],
                }
            )
        return {"groups": out, "board": self.board()}

    def _on_ping(self, session: Session, body: dict[str, Any]) -> dict[str, Any] | None:
        """A heartbeat thread's PING: keep the in-flight report it carries for its main
        connection; when the rank has waited a while, answer with the stuck waits of the
        ranks it waits for (what its slow-operation warnings and timeouts can name)."""
        main = session.data.get(_LEASE_OF)
        if main is None or "ops" not in body:
            return None
        now = asyncio.get_running_loop().time()
        report = arrivals.parse(body["ops"], now)
        if report is None:
            return None
        main.data[_REPORT] = arrivals.follow(main.data.get(_REPORT), report)
        if not any(row.waiting_world and (row.idle or 0.0) >= CHAIN_AFTER for row in report.ops):
            return None
        if self._chain_index is None or now - self._chain_index[0] > CHAIN_INDEX_AGE:
            self._chain_index = (now, arrivals.index(self._reports()))
        stale = 2 * self._liveness_timeout() / LEASE_BEATS
        return arrivals.chain_answer(self._chain_index[1], report, self.limits.stuck_after_s, now, stale)

    def _reports(self) -> list[arrivals.Report]:
        """Every connected rank's latest in-flight report (its ``seen`` brought up to date)."""
        reports = []
        for session in self.sessions:
            report: arrivals.Report | None = session.data.get(_REPORT)
            if report is None:
                continue
            holder: Session | None = session.data.get(_LEASE_KEY)
            report.seen = report.at if holder is None else holder.last_seen
            reports.append(report)
        return reports

    def board(self) -> list[dict[str, Any]]:
        """The arrival board of every operation some connected rank is in (hang explainer)."""
        reports = self._reports()
        stale = 2 * self._liveness_timeout() / LEASE_BEATS
        return arrivals.build(reports, asyncio.get_running_loop().time(), stale, self.limits.stuck_after_s)

    def _liveness_row(self, member: Member) -> dict[str, Any]:
        """``liveness`` ("ok", "unresponsive", "disconnected") and for how long its loop is quiet."""
        session = member.session
        if not member.connected or session is None:
            return {"liveness": "disconnected"}
        since = session.data.get(_UNRESPONSIVE)
        if since is None:
            return {"liveness": "ok"}
        quiet = asyncio.get_running_loop().time() - since
        return {"liveness": "unresponsive", "unresponsive_s": round(quiet, 1)}

    def unresponsive(self, session: Session) -> str | None:
        """Why ``session`` counts as alive but not progressing, or None (the job service
        names such ranks)."""
        since = session.data.get(_UNRESPONSIVE)
        if since is None:
            return None
        quiet = asyncio.get_running_loop().time() - since
        return f"is unresponsive: its process heartbeats but its event loop has not answered for {quiet:.0f}s"

    def _names(self, session: Session) -> list[str]:
        """How log lines name ``session``: each group membership, else its address."""
        rows = [
            f"group {g.name!r}: rank {m.rank} (member {escape(m.member_id)!r} at {escape(m.host)}:{m.port})"
            for g, m in session.data.get(_SESSION_KEY, {}).values()
        ]
        return rows or [f"the client at {escape(str(session.peer[0]))}:{session.peer[1]}"]

    async def _lease(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        """A heartbeat connection claims the lease its main connection declared."""
        lease = params.get("lease")
        if not isinstance(lease, str) or not 0 < len(lease) <= 64:
            raise TypeError(f"lease must be a string of at most 64 characters, got {show(lease)}")
        main = self._leases.get(lease)
        if main is None or main is session or main.proto.lost is not None or "drop_reason" in main.data:
            raise RendezvousError("no open connection declared this lease (it closed, or never declared one)")
        held: Session | None = main.data.get(_LEASE_KEY)
        if held is not None and held is not session and held.proto.lost is None:
            raise RendezvousError("this lease is already held by another connection")
        if _LEASE_OF in session.data or _LEASE_KEY in session.data or _SESSION_KEY in session.data:
            raise RendezvousError("a connection holding a lease (or a group membership) cannot hold another lease")
        main.data[_LEASE_KEY], session.data[_LEASE_OF] = session, main
        if self._wake_reaper is not None:
            self._wake_reaper.set()
        ttl = self._liveness_timeout()
        return {"interval": ttl / LEASE_BEATS, "timeout": ttl}

    def _liveness_timeout(self) -> float:
        return max(float(self.limits.liveness_timeout_s), MIN_LIVENESS)

    async def _reap(self) -> None:
        """Judge the heartbeating sessions whenever the next one may be due."""
        loop = asyncio.get_running_loop()
        while True:
            pause = self._check_liveness(loop.time())  # (no session stays referenced while we wait)
            assert self._wake_reaper is not None
            due = loop.time() + pause
            try:
                async with asyncio.timeout(pause):
                    await self._wake_reaper.wait()
            except TimeoutError:
                pass
            self._wake_reaper.clear()
            if loop.time() - due > 0.1:
                # Our own loop stalled: let the frames that arrived meanwhile be read before
                # judging anyone by them (a stall here is not their silence).
                for _ in range(4):
                    await asyncio.sleep(0)

    def _check_liveness(self, now: float) -> float:
        """Drop the gone sessions, report the unresponsive ones; return how long to wait
        before checking again."""
        pause = 1.0
        ttl = self._liveness_timeout()
        for session in list(self.sessions):
            if "drop_reason" in session.data or _LEASE_OF in session.data:
                continue  # being dropped; or a heartbeat connection (judged with its main session)
            beat = _declared_beat(session.hello.get("heartbeat"))
            holder: Session | None = session.data.get(_LEASE_KEY)
            if holder is not None:
                silent = now - holder.last_seen
                if silent > ttl:
                    self._drop(
                        session,
                        f"no heartbeat for {silent:.1f}s (its process died, was stopped or is cut off; "
                        f"liveness_timeout_s={ttl:g})",
                        verdict="is gone",
                    )
                    continue
                pause = min(pause, ttl - silent + 0.01)
                pause = min(pause, self._check_progress(session, now, beat))
            elif beat is not None:  # no lease (yet): its event loop's PINGs are all we have
                silent = now - session.last_seen
                if silent > LIVENESS_FACTOR * beat:
                    self._drop(session, f"no heartbeat for {silent:.2f}s (limit {LIVENESS_FACTOR:g} x {beat:g}s)")
                    continue
                pause = min(pause, beat / 2)
        return max(pause, 0.01)

    def _check_progress(self, session: Session, now: float, beat: float | None) -> float:
        """Report (once per episode) a session whose process heartbeats while its event
        loop has been silent for ``progress_timeout_s``; return when to look again."""
        limit = float(self.limits.progress_timeout_s)
        if not limit or beat is None:
            return 1.0  # disabled, or a loop that never PINGs: nothing to judge by
        limit = max(limit, LIVENESS_FACTOR * beat)
        quiet = now - session.last_seen
        since = session.data.get(_UNRESPONSIVE)
        if quiet > limit:
            if since is None:
                session.data[_UNRESPONSIVE] = session.last_seen
                for name in self._names(session):
                    log.warning(
                        "%s is unresponsive: its process heartbeats but its event loop has not answered for %.0fs "
                        "(progress_timeout_s=%g); it stays a member",
                        name,
                        quiet,
                        limit,
                    )
            return 1.0
        if since is not None:
            del session.data[_UNRESPONSIVE]
            for name in self._names(session):
                log.info("%s is responsive again: its event loop was silent for %.1fs", name, session.last_seen - since)
        return limit - quiet + 0.01

    def _drop(self, session: Session, reason: str, *, verdict: str = "was lost") -> None:
        log.warning("dropping %s:%s, which %s: %s", *session.peer[:2], verdict, reason)
        session.data["drop_reason"] = reason
        session.data["drop_verdict"] = verdict
        proto = session.proto
        why = reason if verdict == "was lost" else f"this client {verdict}: {reason}"
        proto.fail(RendezvousError(f"coordinator closed the connection: {why}"), tell_peer=True)
        if proto.transport is not None and proto.transport.get_write_buffer_size():
            proto.abort()  # a dead reader would keep a graceful close waiting forever


def _declared_beat(beat: Any) -> float | None:
    """A session's declared heartbeat interval in seconds, or None (it does not heartbeat)."""
    if not isinstance(beat, (int, float)) or isinstance(beat, bool) or not beat > 0:
        return None  # plain RPC clients that do not heartbeat are never reaped
    if isinstance(beat, int) and beat.bit_length() > 64:
        return 1e18  # (float() of a huge int overflows) effectively never
    return max(float(beat), 0.02)


def credential(session: Session) -> str:
    """The role a session proved (``auth.MEMBER`` / ``auth.CLIENT``); an in-process
    call with no connection behind it is the operator's: a member."""
    proto = session.proto
    if proto is None:
        return auth.MEMBER
    return proto.credential or auth.CLIENT  # not checked by a handshake: the least trust


def _guarded(method: str, handler: Handler, *, clients: bool) -> Handler:
    """``handler``, refusing a client-token session unless ``clients``."""
    if clients:
        return handler

    async def members_only(session: Session, params: dict[str, Any], payload: memoryview) -> Any:
        if credential(session) != auth.MEMBER:
            log.warning("%s from %s:%s refused: a client session may not call it", method, *session.peer[:2])
            raise AuthenticationError(
                f"{method} is for members only: this connection proved the client token (NETCOLL_CLIENT_TOKEN), "
                "which may submit, watch, get and cancel jobs and read status; rank daemons and "
                "netcoll.connect need the member token NETCOLL_TOKEN"
            )
        return await handler(session, params, payload)

    return members_only


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


__all__ = ["Coordinator", "LIVENESS_FACTOR", "credential"]
