"""Rendezvous rules, free of I/O: parameter checks, rank assignment, the
loopback rules, and the messages users see when a join is refused.

Everything here is a pure function or plain data so it can be tested with
fake addresses; :mod:`.coordinator` wires it to the RPC server.

Rank assignment follows torch's dynamic rendezvous
(``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``), which ranks
members by their position in ``sorted(participants)``: explicit ranks (a pod
index, ``RANK=``) are honoured, and members without one fill the remaining
ranks in order of their sorted ``member_id``. The result is stable for a given
membership and contiguous ``0..n-1``, without relying on an orchestrator
ordinal (docker compose has none).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import RendezvousError
from ..escape import escape
from ..limits import DEFAULT, ENV_PREFIX, Limits
from ..mesh.auth import is_loopback

MAX_NAME_CHARS = 256  # a group name or member id
MAX_HOST_CHARS = 255  # an advertised host (DNS names are at most 253)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


# -- showing what a peer sent, and refusing it ----------------------------------


def show(value: Any, limit: int = 80) -> str:
    """A peer's value for an error message or a log line: escaped, bounded, and
    never raising (``str()`` of an int over 4300 digits raises ValueError)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<{'negative ' if value < 0 else ''}int of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - whatever it is, the message must still be written
        text = f"<{type(value).__name__}>"
    return escape(text, limit)


def limit_error(what: str, declared: str, name: str, limits: Limits = DEFAULT) -> RendezvousError:
    """The refusal of something a peer declared over limit ``name``; the error
    carries ``.limit`` so the coordinator logs it as a limit refusal."""
    exc = RendezvousError(
        f"{what} {declared} exceeds the coordinator's limit {name}={getattr(limits, name)} "
        f"(set {ENV_PREFIX}{name.upper()} on the coordinator to change it)"
    )
    exc.limit = name  # type: ignore[attr-defined]
    return exc


# -- parameters ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """The validated parameters of one ``join`` call."""

    group: str
    world_size: int
    rank: int | None
    member_id: str
    listen_port: int
    advertise_host: str | None
    timeout: float | None


def _int(params: dict[str, Any], key: str, *, lo: int, hi: int | None = None, optional: bool = False) -> int | None:
    value = params.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{key} must be an int{' or None' if optional else ''}, got {show(value)}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{key} must be in {lo}..{'' if hi is None else hi}, got {show(value)}")
    return value


def _name(params: dict[str, Any], key: str, default: Any = None) -> str:
    value = params.get(key, default)
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise TypeError(f"{key} must be a non-empty string (at most {MAX_NAME_CHARS} characters), got {show(value)}")
    return value


def group_name(params: dict[str, Any]) -> str:
    return _name(params, "group", "default")


def timeout_param(params: dict[str, Any], key: str = "timeout", limits: Limits = DEFAULT) -> float | None:
    """A timeout in seconds (> 0, at most ``limits.max_deadline_s``), or None for no limit."""
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{key} must be a number of seconds or None, got {show(value)}")
    if isinstance(value, int) and value.bit_length() > 64:  # float(value) would overflow
        raise limit_error(key, show(value), "max_deadline_s", limits)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{key} must be a positive number of seconds, got {show(value)}")
    if value > limits.max_deadline_s:
        raise limit_error(key, f"{float(value):g}s", "max_deadline_s", limits)
    return float(value)


def key_param(params: dict[str, Any], key: str = "key", limits: Limits = DEFAULT) -> str:
    """A key-value store key or barrier name: a non-empty string of at most
    ``limits.max_kv_key_bytes`` UTF-8 bytes."""
    value = params.get(key)
    if not isinstance(value, str) or not value:
        raise TypeError(f"{key} must be a non-empty string, got {show(value)}")
    cap = limits.max_kv_key_bytes
    # a character is at least one byte: a long string is refused without encoding it
    nbytes = len(value) if len(value) > cap else len(value.encode("utf-8", "surrogatepass"))
    if nbytes > cap:
        raise limit_error(key, f"{show(value, 40)} ({nbytes} bytes or more)", "max_kv_key_bytes", limits)
    return value


def parse_join(params: dict[str, Any], limits: Limits = DEFAULT) -> JoinRequest:
    """Check the ``join`` parameters; TypeError / ValueError name the bad one,
    RendezvousError a value over a limit (before anything is sized by it)."""
    world_size = _int(params, "world_size", lo=1)
    assert world_size is not None
    if world_size > limits.max_world_size:
        raise limit_error("world_size", show(world_size), "max_world_size", limits)
    rank = _int(params, "rank", lo=INT64_MIN, optional=True)
    if rank is not None and not 0 <= rank < world_size:
        raise RendezvousError(
            f"rank {show(rank)} is out of range for world_size {world_size} (valid ranks are 0..{world_size - 1})"
        )
    member_id = _name(params, "member_id")
    listen_port = _int(params, "listen_port", lo=0, hi=65535)
    assert listen_port is not None
    advertise = params.get("advertise_host")
    if advertise is not None and (
        not isinstance(advertise, str) or not advertise.strip() or len(advertise) > MAX_HOST_CHARS
    ):
        raise TypeError(
            f"advertise_host must be a host name or address (at most {MAX_HOST_CHARS} characters), "
            f"or None; got {show(advertise)}"
        )
    return JoinRequest(
        group_name(params),
        world_size,
        rank,
        member_id,
        listen_port,
        advertise.strip() if advertise else None,
        timeout_param(params, limits=limits),
    )


# -- hosts and the loopback rules -------------------------------------------------


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0]).is_unspecified
    except ValueError:
        return False


def _bare(host: str) -> str:
    """``::ffff:10.0.0.1`` -> ``10.0.0.1`` (what dual-stack sockets report for IPv4 peers)."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return host


def resolve_host(member_id: str, advertise_host: str | None, seen_host: str) -> str:
    """The host a member is published under: its ``advertise_host`` when given,
    else the address the coordinator saw it connect from (routable by
    construction). A loopback advertisement from a member seen on another host
    is refused: nobody but that member could dial it."""
    seen = _bare(seen_host)
    if advertise_host is None:
        return seen
    if _unspecified(advertise_host):
        raise RendezvousError(
            f"member {member_id!r} advertises {escape(advertise_host)}, which is a listen-on-all address, not one "
            f"peers can dial; advertise a routable address or leave advertise_host unset to use the "
            f"address the coordinator saw ({seen})"
        )
    if is_loopback(advertise_host) and not is_loopback(seen):
        raise RendezvousError(
            f"member {member_id!r} advertises {escape(advertise_host)}, but it connected to the coordinator "
            f"from {seen}: peers on other hosts cannot reach {escape(advertise_host)}; advertise a routable "
            f"address (NETCOLL_ADVERTISE_HOST / advertise_host) or leave it unset to use {seen}"
        )
    return _bare(advertise_host)


def loopback_conflict(member_id: str, host: str, other_id: str, other_host: str) -> str:
    """The refusal for ``member_id`` (published as loopback ``host``) in a group
    where ``other_id`` is on the non-loopback ``other_host``."""
    return (
        f"member {member_id!r} would be published as {escape(host)}, a loopback address, but member "
        f"{other_id!r} of the same group is on {escape(other_host)} and cannot reach it there. This "
        f"happens when a rank reaches the coordinator through 127.0.0.1 (for example a rank on "
        f"the coordinator's own host, or a container with host port mapping) or advertises "
        f"loopback: inside a container, 127.0.0.1 is the container itself. Connect to the "
        f"coordinator through an address the other hosts also use, or set advertise_host "
        f"(NETCOLL_ADVERTISE_HOST) to a routable address of this member"
    )


# -- membership ----------------------------------------------------------------------


@dataclass(eq=False)
class Member:
    """One joiner of a group (``rank`` is None until assigned at completion)."""

    member_id: str
    requested_rank: int | None
    host: str
    port: int
    seen: tuple[str, int]
    rank: int | None = None
    connected: bool = True
    session: Any = field(default=None, repr=False)

    def describe(self) -> str:
        who = (
            f"rank {self.rank}"
            if self.rank is not None
            else (f"rank {self.requested_rank}" if self.requested_rank is not None else "unranked")
        )
        return f"{who}: {escape(self.member_id)} at {escape(self.host)}:{self.port}"

    def peer(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "port": self.port, "member_id": self.member_id}


def assign_ranks(members: Iterable[Member], world_size: int) -> list[Member]:
    """Set ``rank`` on every member and return them sorted by rank.

    Explicit ranks are kept; the others take the free ranks in ascending order,
    matched with their member ids in sorted order (torch dynamic rendezvous)."""
    members = list(members)
    if len(members) != world_size:
        raise RendezvousError(f"cannot assign ranks: {len(members)} members for world_size {world_size}")
    taken = {m.requested_rank for m in members if m.requested_rank is not None}
    if len(taken) != sum(m.requested_rank is not None for m in members):
        raise RendezvousError("cannot assign ranks: duplicate explicit ranks")
    free = [r for r in range(world_size) if r not in taken]
    unranked = sorted((m for m in members if m.requested_rank is None), key=lambda m: m.member_id)
    for m in members:
        if m.requested_rank is not None:
            m.rank = m.requested_rank
    for m, r in zip(unranked, free, strict=True):
        m.rank = r
    return sorted(members, key=lambda m: m.rank if m.rank is not None else -1)


def check_join(name: str, world_size: int, pending: list[Member], req: JoinRequest, host: str) -> list[Member]:
    """Refuse ``req`` joining the pending group ``name`` when it conflicts with
    the members already there. Returns the pending members that the newcomer
    evicts under the mixed-loopback rule (loopback members, when the newcomer
    is on a routable address)."""
    if req.world_size != world_size:
        raise RendezvousError(
            f"world_size disagreement in group {name!r}: it has world_size {world_size} (set by its "
            f"first joiner; {len(pending)} waiting), but member {req.member_id!r} asked for "
            f"world_size {req.world_size}"
        )
    if is_loopback(host):
        for m in pending:
            if not is_loopback(m.host):
                raise RendezvousError(loopback_conflict(req.member_id, host, m.member_id, m.host))
        evicted = []
    else:
        evicted = [m for m in pending if is_loopback(m.host)]
    for m in pending:
        if m in evicted:
            continue
        if m.member_id == req.member_id:
            raise RendezvousError(
                f"member id {req.member_id!r} has already joined group {name!r} (from {m.seen[0]}:"
                f"{m.seen[1]}); every member needs a unique member_id"
            )
        if req.rank is not None and m.requested_rank == req.rank:
            raise RendezvousError(
                f"rank {req.rank} in group {name!r} is already held by member {m.member_id!r} "
                f"({m.seen[0]}:{m.seen[1]}); each explicit rank may be claimed once"
            )
    if len(pending) - len(evicted) >= world_size:
        raise RendezvousError(
            f"group {name!r} already has {len(pending)} joiners for world_size "
            f"{world_size}; member {req.member_id!r} is one too many"
        )
    return evicted


def timeout_message(name: str, world_size: int, members: list[Member], waited: float | None) -> str:
    """Who joined and what is missing, for a group that did not fill in time."""
    joined = (
        "; ".join(
            m.describe()
            for m in sorted(members, key=lambda m: (m.requested_rank is None, m.requested_rank or 0, m.member_id))
        )
        or "nobody"
    )
    missing = world_size - len(members)
    unclaimed = [r for r in range(world_size) if r not in {m.requested_rank for m in members}]
    n_unranked = sum(m.requested_rank is None for m in members)
    ranks = ", ".join(map(str, unclaimed[:32])) + (", ..." if len(unclaimed) > 32 else "")
    where = (
        f"missing ranks: {ranks}"
        if n_unranked == 0
        else f"unclaimed ranks: {ranks} ({n_unranked} unranked joiner(s) will take some of them)"
    )
    within = f" within {waited:g}s" if waited is not None else ""
    return (
        f"group {name!r} did not fill{within}: {len(members)} of {world_size} members joined "
        f"[{joined}]; {missing} missing ({where})"
    )


def barrier_timeout_message(
    name: str, barrier: str, world_size: int, arrived: Iterable[int], waited: float | None
) -> str:
    came = sorted(set(arrived))
    absent = [r for r in range(world_size) if r not in came]
    within = f" within {waited:g}s" if waited is not None else ""
    return (
        f"barrier {barrier!r} of group {name!r} did not complete{within}: arrived ranks "
        f"{came or 'none'}, missing ranks {absent}"
    )


__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_HOST_CHARS",
    "MAX_NAME_CHARS",
    "show",
    "limit_error",
    "JoinRequest",
    "Member",
    "parse_join",
    "group_name",
    "timeout_param",
    "key_param",
    "is_loopback",
    "resolve_host",
    "loopback_conflict",
    "assign_ranks",
    "check_join",
    "timeout_message",
    "barrier_timeout_message",
]
