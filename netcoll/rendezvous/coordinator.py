"""The rendezvous coordinator: named groups, rank assignment, peer table,
a key-value store and barriers per group instance, liveness, generations.

One :class:`~netcoll.rpc.RpcServer` serves every group. A group is created by
its first joiner, which fixes its ``world_size``; ``join`` long-polls until
``world_size`` members are in, then every joiner gets the same peer table and
its rank (see :mod:`.groups` for the rules). The group is then *running*:
members stay connected, a member whose connection drops (or who stops sending
heartbeats) is reported to the others with a ``member_lost`` EVENT, and the
membership changes only in a ``regroup`` round that every live member calls
(the lost are dropped, elastic newcomers admitted: a new *epoch*).

The rules live beside it, one module per set: :mod:`.membership` (joining,
completion, members leaving or lost), :mod:`.store` (the key-value store and
barriers of one group instance), :mod:`.liveness` (leases, heartbeats, who is gone
or unresponsive), :mod:`.roles` (who may call what); :mod:`.groups` checks one
request; :mod:`.elastic` (rules: :mod:`.regroup`) runs regroup rounds and elastic
joins (``join`` with ``elastic: true``), :mod:`.storerpc` the store's methods. This
class only routes RPC methods to them and does the socket work (events to members,
dropping a connection).

When no member of a running group is left connected, the group is deleted and
its name can be used again; each instance of a name gets the next
``generation`` and a fresh random ``session`` id, and the key-value store and
barriers belong to that instance alone.

RPC methods (params -> result; errors are ``RendezvousError`` /
``RendezvousTimeout`` / ``TypeError`` / ``ValueError``):

========== ============================================================ =====================================
method     params                                                       result
========== ============================================================ =====================================
join       group, world_size, rank|None, member_id, listen_port,        rank, world_size, generation, session,
           advertise_host|None, timeout (elastic: true: a newcomer,     peers=[{rank, host, port, member_id}]
           answered once a regroup admits it; :mod:`.elastic`)
kv_set     group, key, value (or the msgpack bytes of it as payload)    {}
kv_get     group, key, timeout                                          {key}; payload = msgpack of the value
kv_add     group, key, amount                                           the new int
kv_delete  group, key                                                   {deleted: bool}
kv_decide  group, key, seq; payload = msgpack of a value (set once)      {key}; payload = the first value given
barrier    group, name, timeout                                         {}
leave      group                                                        {}
regroup    group, epoch, timeout, renew                                 {changed, epoch, ...}: :mod:`.elastic`
status     (none)                                                       {groups: [{name, world_size, state, epoch,
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
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..errors import RendezvousError
from ..escape import escape
from ..limits import DEFAULT, Limits
from ..mesh import auth
from ..mesh.certs import TlsConfig
from ..mesh.certs import coerce as coerce_tls
from ..rpc import Handler, RpcServer, Session
from ..wire import Kind
from .elastic import Elastic
from .groups import Member
from .liveness import LEASE_BEATS, LIVENESS_FACTOR, Liveness
from .membership import Group, Membership
from .roles import credential, guarded, logged
from .storerpc import store_methods

log = logging.getLogger("netcoll.rendezvous")


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
        self.membership = Membership(self.limits, self._notify)
        self.elastic = Elastic(self.membership, self.limits)
        self.membership.on_gone = self.elastic.gone
        own: dict[str, Handler] = {
            "join": self._join,
            "leave": self._leave,
            "status": self._status,
            "lease": self._lease,
            "regroup": self._regroup,
            **store_methods(self.membership, self.limits),
        }
        self.methods: dict[str, Handler] = {
            name: guarded(name, logged(name, h), clients=name == "status") for name, h in own.items()
        }
        self.liveness = Liveness(lambda: self.sessions, self._drop, self.limits)
        self._rpc: RpcServer | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._stopped: asyncio.Event | None = None
        self._closing = False
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
        self.methods[method] = guarded(method, handler, clients=clients)

    @property
    def groups(self) -> dict[str, Group]:
        """Every group by name (:class:`~.membership.Group`)."""
        return self.membership.groups

    @property
    def sessions(self) -> set[Session]:
        return self._rpc.sessions if self._rpc is not None else set()

    async def start(self) -> Coordinator:
        if self._rpc is not None:
            return self
        auth.require_credentials("the coordinator", self.host, token=self.token, tls=self.tls, insecure=self.insecure)
        self._stopped = asyncio.Event()
        self._rpc = RpcServer(
            self.methods,
            token=self.token,
            client_token=self.client_token,
            role="coordinator",
            on_open=self._on_open,
            on_close=self._on_close,
            tls=self.tls,
        )
        self._rpc.on_ping = self.liveness.on_ping
        await self._rpc.start(self.host, self.port)
        self._reaper = asyncio.create_task(self.liveness.reap(), name="netcoll-rendezvous-liveness")
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
            self.membership.delete(group, "the coordinator is shutting down")
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

    # -- connections -------------------------------------------------------------
    async def _on_open(self, session: Session) -> None:
        self.liveness.opened(session)

    async def _on_close(self, session: Session) -> None:
        self.liveness.release(session)
        for hook in self.close_hooks:
            await hook(session)
        if self._closing:
            return  # close() deletes every group itself
        self.elastic.closed(session)
        reason = session.data.get("drop_reason", "connection closed")
        self.membership.closed(session, reason, session.data.get("drop_verdict", "was lost"))

    def _notify(self, member: Member, event: dict[str, Any]) -> None:
        """Send ``event`` to a connected member (tiny; never blocks on a slow reader)."""
        try:
            member.session.proto.write(Kind.EVENT, event)
        except (ConnectionError, RendezvousError, OSError, RuntimeError):
            pass
        except Exception:  # one broken link must not stop the others' events
            log.debug("could not notify %s", escape(member.member_id), exc_info=True)

    def _drop(self, session: Session, reason: str, verdict: str = "was lost") -> None:
        log.warning("dropping %s:%s, which %s: %s", *session.peer[:2], verdict, reason)
        session.data["drop_reason"] = reason
        session.data["drop_verdict"] = verdict
        proto = session.proto
        why = reason if verdict == "was lost" else f"this client {verdict}: {reason}"
        proto.fail(RendezvousError(f"coordinator closed the connection: {why}"), tell_peer=True)
        if proto.transport is not None and proto.transport.get_write_buffer_size():
            proto.abort()  # a dead reader would keep a graceful close waiting forever

    # -- the RPC methods: routed to the rules ------------------------------------------
    async def _join(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        if params.get("elastic"):
            return await self.elastic.join(session, params)
        return await self.membership.join(session, params)

    async def _regroup(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        return await self.elastic.regroup(session, params)

    async def _leave(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        self.membership.leave(session, params)
        return {}

    async def _lease(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        return self.liveness.claim(session, params)

    async def _status(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        return self.status()

    # -- status ----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """``{groups: [...], board: [...]}`` as the ``status`` RPC returns it."""
        return {"groups": self.membership.rows(self.liveness.row), "board": self.board()}

    def board(self) -> list[dict[str, Any]]:
        """The arrival board of every operation some connected rank is in (hang explainer)."""
        return self.liveness.board()

    def unresponsive(self, session: Session) -> str | None:
        """Why ``session`` counts as alive but not progressing, or None (the job service
        names such ranks)."""
        return self.liveness.unresponsive(session)


__all__ = ["Coordinator", "LEASE_BEATS", "LIVENESS_FACTOR", "credential"]
