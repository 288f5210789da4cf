"""Regroup rounds: the rules, no sockets and no futures.

A running group changes its membership only in a *regroup round* (torchft's quorum,
torch elastic's dynamic rendezvous, folded into one call). Every live member of the
group's current epoch calls ``regroup``; elastic newcomers wait in a queue, in
arrival order. The round closes when every member still connected has called
(members whose connection dropped or whose lease expired are not waited for); then:

* nothing changed (every member of the epoch is still connected, no newcomer
  waits, and no caller asked to *renew* the epoch because its links broke): each
  caller is told so and keeps its communicator; the epoch stays;
* else the new member list is the connected members in their old rank order, then
  the queued newcomers in arrival order, ranked ``0..n-1`` from that order, and the
  group's epoch goes up by one: every frame of the new epoch names it
  (:func:`epoch_group`), so nothing of the old epoch mixes into the new one.

A caller that gives up waiting (its timeout, its connection) withdraws; a round
cannot close while a connected member has not called, and that member is named in
the callers' timeout error (:func:`missing_message`). :class:`Round` holds one
group name's round and queue; :mod:`.elastic` wires it to the RPC methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..escape import escape
from ..groupids import epoch_group
from .groups import Member


def epoch_session(session: str, epoch: int) -> str:
    """The peer-link session id of an epoch (the listener routes links by it)."""
    return session if epoch == 0 else f"{session}.{epoch}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a round closed: ``changed`` (a new epoch) with the new ``order``
    (old members first, then newcomers), the old members it answers
    (``callers``) and the newcomers it admits (``admitted``)."""

    changed: bool
    order: tuple[Member, ...]
    callers: tuple[Member, ...]
    admitted: tuple[Member, ...]


@dataclass(eq=False)
class Round:
    """The open regroup round of one group name and its queue of newcomers."""

    called: list[Member] = field(default_factory=list)  # members of the epoch waiting, in call order
    newcomers: list[Member] = field(default_factory=list)  # in arrival order
    renew: set[Member] = field(default_factory=set)  # callers that need a new epoch whatever happens
    gave_up: list[Member] = field(default_factory=list)  # callers of this round whose wait timed out

    def call(self, members: list[Member], member: Member, renew: bool = False) -> Outcome | None:
        """``member`` (of ``members``, the epoch's members by rank) calls: the outcome
        if the round closes now, else None (ValueError: not a member, or called twice).
        ``renew``: the caller cannot go on in this epoch (a link of it broke, or it
        failed to form), so the round starts a new one even if nobody changed."""
        if member not in members:
            raise ValueError(f"{escape(member.member_id)} is not a member of this epoch")
        if member in self.called:
            raise ValueError(f"rank {member.rank} already waits in this regroup round")
        self.called.append(member)
        if renew:
            self.renew.add(member)
        return self.check(members)

    def withdraw(self, member: Member, *, timed_out: bool = False) -> None:
        """A caller stopped waiting (``timed_out``, or its connection went away)."""
        if member in self.called:
            self.called.remove(member)
            if timed_out and member not in self.gave_up:
                self.gave_up.append(member)
        self.renew.discard(member)

    def arrive(self, newcomer: Member) -> None:
        """An elastic newcomer queues for the next round that closes."""
        if newcomer not in self.newcomers:
            self.newcomers.append(newcomer)

    def depart(self, newcomer: Member) -> None:
        """A queued newcomer stopped waiting."""
        if newcomer in self.newcomers:
            self.newcomers.remove(newcomer)

    def missing(self, members: list[Member]) -> list[Member]:
        """The connected members that have not called (what the round waits for)."""
        return [m for m in members if m.connected and m not in self.called]

    def check(self, members: list[Member]) -> Outcome | None:
        """Close the round if every connected member has called (and someone has): the
        outcome, the round then empty again; else None. Call it whenever a member is gone."""
        live = [m for m in members if m.connected]
        if not self.called or self.missing(members):
            return None
        callers = tuple(m for m in live if m in self.called)
        admitted = tuple(n for n in self.newcomers if n.connected)
        changed = len(live) < len(members) or bool(admitted) or bool(self.renew)
        self.called, self.renew, self.gave_up = [], set(), []
        if changed:
            self.newcomers = [n for n in self.newcomers if n not in admitted]
        return Outcome(changed, tuple(live) + admitted if changed else tuple(members), callers, admitted)


def missing_message(name: str, epoch: int, members: list[Member], rnd: Round, waited: float | None) -> str:
    """Why a regroup of ``name`` timed out: the members that never called it, by rank."""
    missing = [m for m in rnd.missing(members) if m not in rnd.gave_up]
    within = f" within {waited:g}s" if waited is not None else ""
    named = "; ".join(f"rank {m.rank} (member {escape(m.member_id)!r} at {escape(m.host)}:{m.port})" for m in missing)
    called = ", ".join(str(m.rank) for m in rnd.called) or "none"
    gave_up = [m.rank for m in rnd.gave_up if m.connected and m not in rnd.called]
    stopped = f"; ranks {', '.join(map(str, gave_up))} called but their wait ended first" if gave_up else ""
    return (
        f"regroup of group {name!r} (epoch {epoch}) did not close{within}: "
        f"{named or 'no member'} never called regroup (ranks waiting: {called}{stopped}); "
        "every live member must call regroup"
    )


def admission_message(name: str, waited: float | None, running: bool) -> str:
    """Why an elastic newcomer's wait timed out."""
    within = f" within {waited:g}s" if waited is not None else ""
    state = (
        "its members have not called regroup since this process arrived"
        if running
        else f"no group {name!r} is running at the coordinator"
    )
    return f"no regroup of group {name!r} admitted this newcomer{within}: {state}"


__all__ = [
    "Outcome",
    "Round",
    "admission_message",
    "epoch_group",
    "epoch_session",
    "missing_message",
]
