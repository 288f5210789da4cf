"""Group membership: joining, completing a group, members leaving or lost; no sockets.

A group is created by its first joiner, which fixes its ``world_size``; ``join``
waits until ``world_size`` members are in, then every joiner gets the same peer
table and its rank (:mod:`.groups` has the rules of one join and of rank
assignment). The group is then *running*: membership is frozen, and a member that
leaves or is lost breaks its barriers and is announced to the others (a
``member_left`` / ``member_lost`` event, sent by the ``notify`` callback the
coordinator gives). When no member is left connected the group is deleted; each
instance of a name gets the next ``generation``, a fresh random ``session`` id and a
fresh :class:`~.store.Store`.

A connection's memberships are kept in its ``Session.data[SESSION_KEY]``
(``{group name: (Group, Member)}``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import RendezvousError, RendezvousTimeout
from ..escape import escape
from ..limits import DEFAULT, Limits
from ..rpc import Session
from .groups import (
    Member,
    assign_ranks,
    check_join,
    group_name,
    loopback_conflict,
    parse_join,
    resolve_host,
    timeout_message,
)
from .store import Store, fail

log = logging.getLogger("netcoll.rendezvous")

PENDING, RUNNING = "pending", "running"
SESSION_KEY = "rendezvous"  # Session.data[...] -> {group name: (Group, Member)}


@dataclass(eq=False)
class Group:
    """One instance of a named group."""

    name: str
    world_size: int
    generation: int
    session_id: str
    store: Store
    state: str = PENDING
    pending: list[Member] = field(default_factory=list)
    waiters: dict[Member, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    members: list[Member] = field(default_factory=list)  # by rank, once running
    epoch: int = 0  # how many regroups changed its membership (:mod:`.elastic`)


def names(session: Session) -> list[str]:
    """How log lines name ``session``: each group membership, else its address."""
    rows = [
        f"group {g.name!r}: rank {m.rank} (member {escape(m.member_id)!r} at {escape(m.host)}:{m.port})"
        for g, m in session.data.get(SESSION_KEY, {}).values()
    ]
    return rows or [f"the client at {escape(str(session.peer[0]))}:{session.peer[1]}"]


class Membership:
    """Every group by name. ``notify(member, event)`` tells a connected member of an event."""

    def __init__(self, limits: Limits = DEFAULT, notify: Callable[[Member, dict[str, Any]], None] | None = None):
        self.limits = limits
        self.notify = notify
        self.groups: dict[str, Group] = {}
        self._generations: dict[str, int] = {}
        #: called with a running group after one of its members is gone (a regroup may close)
        self.on_gone: Callable[[Group], None] | None = None

    # -- joining ------------------------------------------------------------------------
    async def join(self, session: Session, params: dict[str, Any]) -> dict[str, Any]:
        """Join ``session`` to a group; the rank and peer table once the group is full."""
        req = parse_join(params, self.limits)  # every size checked before anything is sized by it
        host = resolve_host(req.member_id, req.advertise_host, session.peer[0])
        group = self.groups.get(req.group)
        if group is not None and group.state == RUNNING:
            raise RendezvousError(
                f"group {req.group!r} is already running with {group.world_size} ranks (generation "
                f"{group.generation}); use another group name or wait until it closes"
            )
        mine: dict[str, tuple[Group, Member]] = session.data.setdefault(SESSION_KEY, {})
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
            conflict = loopback_conflict(other.member_id, other.host, req.member_id, host)
            self.drop_pending(group, other, RendezvousError(conflict))
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
                self.drop_pending(group, member, None)
        if not fut.done():
            log.info("group %r: %s timed out: %s", group.name, escape(member.member_id), escape(message, 1000))
            raise RendezvousTimeout(message)
        return fut.result()

    def _create(self, name: str, world_size: int) -> Group:
        generation = self._generations.get(name, 0) + 1
        self._generations[name] = generation
        group = Group(name, world_size, generation, secrets.token_hex(8), Store(name, world_size, self.limits))
        self.groups[name] = group
        return group

    def _complete(self, group: Group) -> None:
        group.members = assign_ranks(group.pending, group.world_size)
        group.pending, group.state = [], RUNNING
        peers = [m.peer() for m in group.members]
        result = {"world_size": group.world_size, "generation": group.generation, "session": group.session_id}
        for m in group.members:
            fut = group.waiters.pop(m)
            if not fut.done():
                fut.set_result({"rank": m.rank, **result, "peers": peers})
        log.info(
            "group %r generation %d complete: %s",
            group.name,
            group.generation,
            ", ".join(f"{p['rank']}={escape(p['member_id'])}@{escape(p['host'])}:{p['port']}" for p in peers),
        )

    # -- leaving ------------------------------------------------------------------------
    def drop_pending(self, group: Group, member: Member, exc: BaseException | None) -> None:
        """Remove a joiner from a pending group (failing its join with ``exc``)."""
        if member not in group.pending:
            return
        group.pending.remove(member)
        fut = group.waiters.pop(member, None)
        if fut is not None and exc is not None:
            fail(fut, exc)
        _forget(member, group)
        if not group.pending:
            self.delete(group, f"group {group.name!r} was abandoned before it completed")

    def delete(self, group: Group, reason: str) -> None:
        """Delete ``group``, failing everything that waits on it with ``reason``."""
        if self.groups.get(group.name) is group:
            del self.groups[group.name]
        err = RendezvousError(reason)
        for m in list(group.pending) + group.members:
            _forget(m, group)
        for fut in group.waiters.values():
            fail(fut, err)
        group.waiters.clear()
        group.store.close(err)
        log.info("group %r generation %d deleted: %s", group.name, group.generation, reason)

    def member_gone(self, group: Group, member: Member, topic: str, reason: str, verdict: str = "was lost") -> None:
        """A member of a running group disconnected (``verdict``: "was lost", "is gone") or left."""
        if not member.connected:
            return
        member.connected = False
        _forget(member, group)
        member.session = None
        what = "left" if topic == "member_left" else verdict
        group.store.break_barriers(f"rank {member.rank} (member {member.member_id!r}) {what}: {reason}")
        level = logging.INFO if topic == "member_left" else logging.WARNING
        log.log(level, "group %r: %s", group.name, escape(group.store.broken or "", 1000))
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
            if self.notify is not None:
                self.notify(m, event)
        if not alive:
            self.delete(group, f"every member of group {group.name!r} has gone")
        if self.on_gone is not None:
            self.on_gone(group)

    def leave(self, session: Session, params: dict[str, Any]) -> None:
        """``session`` leaves the group ``params`` name."""
        name = group_name(params)
        entry = session.data.get(SESSION_KEY, {}).get(name)
        if entry is None:
            raise RendezvousError(f"this connection is not a member of group {name!r}")
        group, member = entry
        if group.state == PENDING:
            self.drop_pending(group, member, RendezvousError(f"left group {name!r} before it completed"))
        else:
            self.member_gone(group, member, "member_left", "left the group")

    def closed(self, session: Session, reason: str, verdict: str) -> None:
        """``session``'s connection closed: it leaves every group it is in."""
        for group, member in list(session.data.get(SESSION_KEY, {}).values()):
            if group.state == PENDING:
                self.drop_pending(group, member, None)
            else:
                self.member_gone(group, member, "member_lost", reason, verdict)

    def running(self, session: Session, params: dict[str, Any]) -> tuple[Group, Member]:
        """The running group ``params`` names that ``session`` is a member of."""
        name = group_name(params)
        entry: tuple[Group, Member] | None = session.data.get(SESSION_KEY, {}).get(name)
        if entry is None:
            raise RendezvousError(f"this connection is not a member of group {name!r} (join it first)")
        if entry[0].state != RUNNING:
            raise RendezvousError(f"group {name!r} is still pending (it has not filled yet)")
        return entry

    def rows(self, liveness: Callable[[Member], dict[str, Any]]) -> list[dict[str, Any]]:
        """The groups as ``status`` shows them (``liveness(member)``: its liveness fields)."""
        out = []
        for group in sorted(self.groups.values(), key=lambda g: g.name):
            members = group.members if group.state == RUNNING else group.pending
            rows = [
                {
                    "rank": m.rank if m.rank is not None else m.requested_rank,
                    "member_id": m.member_id,
                    "host": m.host,
                    "port": m.port,
                    "connected": m.connected,
                    **liveness(m),
                }
                for m in members
            ]
            info = {"name": group.name, "world_size": group.world_size, "state": group.state, "epoch": group.epoch}
            out.append({**info, "generation": group.generation, "session": group.session_id, "members": rows})
        return out


def _forget(member: Member, group: Group) -> None:
    if member.session is not None:
        mine = member.session.data.get(SESSION_KEY, {})
        if mine.get(group.name, (None,))[0] is group:
            del mine[group.name]
