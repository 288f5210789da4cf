"""Elastic groups at the coordinator: the ``regroup`` RPC and elastic joins; no sockets.

The rules of a round are :mod:`.regroup`'s; this module keeps one
:class:`~.regroup.Round` per group name, a future per waiting caller, and applies
a round's outcome to the :class:`~.membership.Group`: a new epoch (ranks
renumbered, ``world_size`` and the store's barriers sized anew), the admitted
newcomers made members of it. Every caller and newcomer of a round gets::

    {changed, epoch, group_id, rank, world_size, generation, session, peers, joined}

(``session``: the epoch's peer-link session id, :func:`~.regroup.epoch_session`;
``group_id``: the group id its frames carry, :func:`~.regroup.epoch_group`; an
unchanged round answers ``{changed: False, epoch}`` only).

RPC params: ``regroup``: ``group, epoch, timeout, renew`` (true: start a new epoch
even if the membership is unchanged, :meth:`.regroup.Round.call`); an elastic ``join``: those of
``join`` with ``elastic: true`` (``world_size`` ignored, ``rank`` must be None: a
regroup ranks newcomers by arrival).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..errors import RegroupTimeout, RendezvousError
from ..escape import escape
from ..limits import DEFAULT, Limits
from ..rpc import Session
from .groups import Member, parse_join, resolve_host, show, timeout_param
from .membership import RUNNING, SESSION_KEY, Group, Membership
from .regroup import Outcome, Round, admission_message, epoch_group, epoch_session, missing_message
from .store import fail

log = logging.getLogger("netcoll.rendezvous")

NEWCOMER_KEY = "rendezvous.newcomer"  # Session.data[...] -> (group name, Member) while queued


class Elastic:
    """Regroup rounds and newcomer queues of every group of ``membership``."""

    def __init__(self, membership: Membership, limits: Limits = DEFAULT) -> None:
        self.membership = membership
        self.limits = limits
        self.rounds: dict[str, Round] = {}
        self.waiters: dict[Member, asyncio.Future[dict[str, Any]]] = {}

    def _round(self, name: str) -> Round:
        return self.rounds.setdefault(name, Round())

    # -- the RPC methods -------------------------------------------------------------
    async def regroup(self, session: Session, params: dict[str, Any]) -> dict[str, Any]:
        """A member of a running group calls in; the round's outcome once it closes."""
        group, member = self.membership.running(session, params)
        epoch = params.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise TypeError(f"epoch must be an int, got {show(epoch)}")
        if epoch != group.epoch:
            raise RendezvousError(
                f"regroup of group {group.name!r}: this member is at epoch {show(epoch)}, the group at {group.epoch}"
            )
        timeout = timeout_param(params, limits=self.limits)
        rnd = self._round(group.name)
        fut = self._future(member)
        try:
            outcome = rnd.call(group.members, member, renew=params.get("renew") is True)
        except ValueError as exc:
            self.waiters.pop(member, None)
            raise RendezvousError(f"regroup of group {group.name!r}: {exc}") from None
        if outcome is not None:
            self._apply(group, outcome)
            self._tidy(group.name)
        message = ""
        try:
            await asyncio.wait([fut], timeout=timeout)
        finally:
            if not fut.done():
                message = missing_message(group.name, group.epoch, group.members, rnd, timeout)
                rnd.withdraw(member, timed_out=True)
                self.waiters.pop(member, None)
                self._tidy(group.name)
        if not fut.done():
            log.warning("group %r: %s", group.name, escape(message, 1000))
            raise RegroupTimeout(message)
        return fut.result()

    async def join(self, session: Session, params: dict[str, Any]) -> dict[str, Any]:
        """An elastic newcomer queues until a regroup of its group admits it."""
        if params.get("rank") is not None:
            raise RendezvousError("an elastic join takes no rank: a regroup ranks newcomers after the members")
        req = parse_join({**params, "world_size": 1, "rank": None}, self.limits)
        if req.group in session.data.get(SESSION_KEY, {}) or NEWCOMER_KEY in session.data:
            raise RendezvousError(f"this connection already joined (or waits to join) group {req.group!r}")
        group = self.membership.groups.get(req.group)
        if group is not None and any(m.member_id == req.member_id for m in group.members if m.connected):
            raise RendezvousError(f"member id {req.member_id!r} is already a member of group {req.group!r}")
        host = resolve_host(req.member_id, req.advertise_host, session.peer[0])
        newcomer = Member(req.member_id, None, host, req.listen_port, session.peer, session=session)
        rnd = self._round(req.group)
        fut = self._future(newcomer)
        session.data[NEWCOMER_KEY] = (req.group, newcomer)
        rnd.arrive(newcomer)
        log.info("group %r: newcomer %s waits for a regroup", req.group, escape(req.member_id))
        try:
            await asyncio.wait([fut], timeout=req.timeout)
        finally:
            if not fut.done():
                self._forget_newcomer(session)
        if not fut.done():
            now = self.membership.groups.get(req.group)
            raise RegroupTimeout(admission_message(req.group, req.timeout, now is not None and now.state == RUNNING))
        return fut.result()

    # -- events ------------------------------------------------------------------------
    def gone(self, group: Group) -> None:
        """A member of ``group`` is gone: the round may close without it."""
        rnd = self.rounds.get(group.name)
        if rnd is None:
            return
        if self.membership.groups.get(group.name) is not group:  # deleted: nobody of it is left
            for m in rnd.called:
                fut = self.waiters.pop(m, None)
                if fut is not None:
                    fail(fut, RendezvousError(f"group {group.name!r} is gone"))
            rnd.called, rnd.renew, rnd.gave_up = [], set(), []
            self._tidy(group.name)
            return
        outcome = rnd.check(group.members)
        if outcome is not None:
            self._apply(group, outcome)
        self._tidy(group.name)

    def closed(self, session: Session) -> None:
        """``session``'s connection closed: a newcomer it queued stops waiting."""
        self._forget_newcomer(session)

    # -- internals -------------------------------------------------------------------------
    def _future(self, member: Member) -> asyncio.Future[dict[str, Any]]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiters[member] = fut
        return fut

    def _forget_newcomer(self, session: Session) -> None:
        entry = session.data.pop(NEWCOMER_KEY, None)
        if entry is None:
            return
        name, newcomer = entry
        newcomer.connected = False
        self.waiters.pop(newcomer, None)
        rnd = self.rounds.get(name)
        if rnd is not None:
            rnd.depart(newcomer)
            self._tidy(name)

    def _tidy(self, name: str) -> None:
        """Forget a group name's round once nobody waits in it (names come and go)."""
        rnd = self.rounds.get(name)
        if rnd is not None and not rnd.called and not rnd.newcomers:
            del self.rounds[name]

    def _apply(self, group: Group, outcome: Outcome) -> None:
        """Tell every caller (and admitted newcomer) how the round closed."""
        if not outcome.changed:
            for m in outcome.callers:
                self._answer(m, {"changed": False, "epoch": group.epoch})
            return
        group.epoch += 1
        for rank, m in enumerate(outcome.order):
            m.rank = rank
        group.members = list(outcome.order)
        group.world_size = len(group.members)
        group.store.world_size = group.world_size
        group.store.break_barriers(f"group {group.name!r} regrouped to epoch {group.epoch}")
        group.store.broken = None  # barriers of the new epoch can complete again
        for n in outcome.admitted:
            if n.session is not None:
                n.session.data.pop(NEWCOMER_KEY, None)
                n.session.data.setdefault(SESSION_KEY, {})[group.name] = (group, n)
        peers = [m.peer() for m in group.members]
        common = {
            "changed": True,
            "epoch": group.epoch,
            "group_id": epoch_group(group.name, group.epoch),
            "world_size": group.world_size,
            "generation": group.generation,
            "session": epoch_session(group.session_id, group.epoch),
            "peers": peers,
        }
        log.info(
            "group %r regrouped to epoch %d: %s",
            group.name,
            group.epoch,
            ", ".join(f"{p['rank']}={escape(p['member_id'])}" for p in peers),
        )
        admitted = set(outcome.admitted)
        for m in outcome.callers + outcome.admitted:
            self._answer(m, {**common, "rank": m.rank, "joined": m in admitted})

    def _answer(self, member: Member, result: dict[str, Any]) -> None:
        fut = self.waiters.pop(member, None)
        if fut is not None and not fut.done():
            fut.set_result(result)


__all__ = ["Elastic", "NEWCOMER_KEY"]
