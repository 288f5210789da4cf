"""The arrival board: which operations are stuck, who has arrived at each and who
not, and which waits form a deadlock (the hang explainer of ``netcoll status``).

Every rank's heartbeat thread carries a report of the operations it is in
(:meth:`netcoll.mesh.mailbox.Mailbox.snapshot`): ``{rank, ops: [[group,
seq, name, fingerprint, seconds running, members, waiting for, seconds since
it last received, world ranks waited for]], next: {group: next seq}}``
(ranks before this version send the first seven). The coordinator keeps the
last :data:`KEEP` reports of each connection (:func:`follow`) and builds the
board from them.

Reports are taken at different moments: a rank seen in ``all_reduce #675`` and
another still in ``#633`` a heartbeat earlier say nothing about a hang. So a
rank is *stuck* in an operation only when its last :data:`KEEP` reports agree:
the same operation, waiting for the same ranks, and in each it had received
nothing for ``stuck_after`` seconds. The board shows an operation only when a
rank is stuck in it (or when ranks made different calls in it: a *mismatch*,
whenever seen). In a shown operation, a rank has *arrived* if it is in it (or
past it: its next sequence number is higher); one that has not is named
*missing* only on a report taken once the stuck rank was already stuck. The
stuck waits, followed from rank to rank (:mod:`netcoll.waits`), name a cycle
as a deadlock: ``deadlock: rank 0 in all_reduce #1 waits for rank 2, rank 2 in
all_reduce #0 waits for rank 0``. Reports are untrusted input: checked,
bounded, and escaped when shown.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..escape import escape
from ..waits import Wait, family, op_name, summary

MAX_OPS = 16  # operations kept per report
MAX_GROUPS = 64  # next-sequence entries kept per report
MAX_TEXT = 200  # characters kept of a group name, operation name or fingerprint
MAX_MEMBERS = 4096
BOARD_ROWS = 32  # operations shown at most
KEEP = 3  # reports kept per rank: a wait is flagged once this many in a row agree
STUCK_AFTER = 5.0  # seconds without data, in each of those reports, for a rank to count as stuck


class Row(NamedTuple):
    """One operation a rank reported being in."""

    group: str
    seq: int
    name: str
    fp: str
    age: float  # seconds running when reported
    members: tuple[int, ...]  # world ranks
    waiting: list[int]  # ranks waited for, as the operation names them
    idle: float | None  # seconds since it last received (None: an older rank does not say)
    waiting_world: list[int] | None  # world ranks waited for (None: not said)


@dataclass
class Report:
    """One rank's latest report and when its heartbeat was last seen (loop time)."""

    rank: int
    ops: list[Row]
    next: dict[str, int]
    at: float  # loop time the report arrived
    seen: float  # loop time the heartbeat connection was last heard from (updated by the caller)
    #: the operations of the reports before it, oldest first, with the time each arrived
    earlier: list[tuple[float, list[Row]]] = field(default_factory=list)


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError("expected a string")
    return v[:MAX_TEXT]


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62:
        raise TypeError("expected a non-negative integer")
    return v


def _seconds(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TypeError("expected a number of seconds")
    return float(v)


def _row(raw: Any) -> Row:
    raw = list(raw)
    group, seq, name, fp, age, members, waiting = raw[:7]
    idle, world = (raw[7], raw[8]) if len(raw) >= 9 else (None, None)
    return Row(
        _text(group),
        _int(seq),
        _text(name),
        _text(fp),
        _seconds(age),
        tuple(_int(m) for m in list(members)[:MAX_MEMBERS]),
        [_int(w) for w in list(waiting)[:MAX_MEMBERS]],
        None if idle is None else _seconds(idle),
        None if world is None else [_int(w) for w in list(world)[:MAX_MEMBERS]],
    )


def parse(body: Any, at: float) -> Report | None:
    """A heartbeat's ``ops`` report, checked and bounded (None if malformed)."""
    try:
        if not isinstance(body, dict):
            return None
        rank = _int(body.get("rank"))
        ops = [_row(raw) for raw in list(body.get("ops") or [])[:MAX_OPS]]
        nxt = {_text(g): _int(q) for g, q in list(dict(body.get("next") or {}).items())[:MAX_GROUPS]}
    except (TypeError, ValueError, AttributeError):
        return None
    return Report(rank, ops, nxt, at, at)


def follow(previous: Report | None, report: Report) -> Report:
    """``report``, keeping the operations of the one before it (and of those before
    that, :data:`KEEP` in all): a rank's history, for :func:`build`."""
    if previous is not None and previous.rank == report.rank:
        report.earlier = [*previous.earlier, (previous.at, previous.ops)][-(KEEP - 1) :]
    return report


def _ago(now: float, then: float) -> str:
    return f"{max(0.0, now - then):.1f}s ago"


def stuck_since(rep: Report, group: str, seq: int, after: float) -> float | None:
    """When the first of the last :data:`KEEP` reports of ``rep``'s rank arrived, if
    they all show it in ``(group, seq)``, waiting for the same ranks, with no data
    for ``after`` seconds; else None (not stuck there, or not for long enough)."""
    snaps = [*rep.earlier, (rep.at, rep.ops)][-KEEP:]
    if len(snaps) < KEEP:
        return None
    same: list[int] | None = None
    for _, ops in snaps:
        row = next((r for r in ops if r.group == group and r.seq == seq), None)
        if row is None or not row.waiting or (same is not None and row.waiting != same):
            return None
        if (row.age if row.idle is None else row.idle) < after:
            return None
        same = row.waiting
    return snaps[0][0]


def build(
    reports: list[Report], now: float, stale_after: float, stuck_after: float = STUCK_AFTER
) -> list[dict[str, Any]]:
    """The board: one row per operation some rank is stuck in (or made a mismatched
    call in), oldest first."""
    by_rank: dict[tuple[str, int], Report] = {}  # (group, world rank) -> its report
    for rep in reports:
        by_rank.setdefault(("", rep.rank), rep)  # a rank that never ran anything in the group
        for g in {row.group for row in rep.ops} | set(rep.next):
            by_rank[(g, rep.rank)] = rep
    ops: dict[tuple[str, int], dict[int, tuple[Row, Report]]] = {}
    for rep in reports:
        for row in rep.ops:
            ops.setdefault((row.group, row.seq), {})[rep.rank] = (row, rep)
    labels = _labels(reports)
    rows, stuck = [], []
    for (group, seq), inside in ops.items():
        made = _board_row(group, seq, inside, by_rank, now, stale_after, stuck_after, labels)
        if made is not None:
            rows.append(made[0])
            stuck.extend(made[1])
    _name_deadlocks(rows, stuck, labels)
    rows.sort(key=lambda r: -r["running_s"])
    return rows[:BOARD_ROWS]


Stuck = tuple[Wait, str]  # a stuck rank's wait (world ranks) and the group of its operation


def _labels(reports: list[Report]) -> dict[str, dict[int, int]]:
    """family -> {world rank: the rank its users know}: from operations of the group
    itself (their members in order), else from point-to-point messages, whose group
    names the pair (``<g>/p2p/<tag>/<src>><dst>``, members ``(src, dst)`` in world ranks)."""
    out: dict[str, dict[int, int]] = {}
    for rep in reports:
        for row in rep.ops:
            home = family(row.group)
            if home == row.group:
                out[home] = {w: i for i, w in enumerate(row.members)}
    for rep in reports:
        for row in rep.ops:
            pair = _pair(row)
            if pair is not None:
                label = out.setdefault(family(row.group), {})
                for world, rank in zip(row.members, pair, strict=True):
                    label.setdefault(world, rank)
    return out


def _pair(row: Row) -> tuple[int, int] | None:
    """A point-to-point message's ``(src, dst)`` as its group names them, or None."""
    if "/p2p/" not in row.group or len(row.members) != 2:
        return None
    src, sep, dst = row.group.rpartition("/")[2].partition(">")
    if not sep or not src.isdigit() or not dst.isdigit() or len(src) > 9 or len(dst) > 9:
        return None
    return int(src), int(dst)


def _board_row(
    group: str,
    seq: int,
    inside: dict[int, tuple[Row, Report]],
    by_rank: dict[tuple[str, int], Report],
    now: float,
    stale_after: float,
    stuck_after: float,
    labels: dict[str, dict[int, int]],
) -> tuple[dict[str, Any], list[Stuck]] | None:
    """The board's row of operation ``(group, seq)`` and the waits stuck in it; None when
    no rank is stuck in it and its calls agree."""
    first = next(iter(inside.values()))[0]
    name, members = first.name, first.members
    label = labels.get(family(group), {})
    calls: dict[str, list[int]] = {}
    for world, (row, _) in inside.items():
        calls.setdefault(row.fp, []).append(label.get(world, members.index(world) if world in members else world))
    stuck, waits, since = [], [], math.inf
    for world, (row, rep) in sorted(inside.items()):
        at = stuck_since(rep, group, seq, stuck_after)
        if at is not None:
            since = min(since, at)
            idle = row.age if row.idle is None else row.idle
            stuck.append({"rank": label.get(world, world), "waiting": row.waiting, "idle_s": round(idle, 1)})
            if row.waiting_world:
                waits.append((Wait(world, f"{row.name} #{row.seq}", tuple(row.waiting_world)), group))
    if not stuck and len(calls) < 2:
        return None  # healthy progress, or not stuck for long enough yet
    arrived, missing = [], []
    for grank, world in enumerate(members):
        seen_as = label.get(world, grank)  # (a point-to-point message's pair: their ranks in its group's family)
        theirs = by_rank.get((group, world)) or by_rank.get(("", world))
        if world in inside or (theirs is not None and theirs.next.get(group, 0) > seq):
            arrived.append(seen_as)
        elif theirs is None or now - theirs.seen > stale_after or theirs.at >= since:
            missing.append(_missing(seen_as, group, theirs, now, stale_after))
    shown = {
        "group": group,
        "seq": seq,
        "op": name,
        "running_s": round(max(row.age + (now - rep.at) for row, rep in inside.values()), 1),
        "arrived": sorted(arrived),
        "missing": missing,
        "stuck": stuck,
        "calls": [{"call": fp, "ranks": sorted(r)} for fp, r in sorted(calls.items(), key=lambda kv: min(kv[1]))],
        "mismatch": len(calls) > 1,
        "deadlock": None,
    }
    return shown, waits


def _missing(grank: int, group: str, rep: Report | None, now: float, stale_after: float) -> dict[str, Any]:
    entry: dict[str, Any] = {"rank": grank}
    if rep is None:
        entry["why"] = "no report from it (no heartbeat thread, or not connected)"
        return entry
    entry["last_heartbeat_s"] = round(now - rep.seen, 1)
    where = [f"{r.name} #{r.seq}" for r in rep.ops if family(r.group) == family(group)]
    last = rep.next.get(group, 0) - 1
    idle = f"idle after #{last}" if last >= 0 else "no operation in this group yet"
    at = f"in {', '.join(where)}" if where else f"has not called it: {idle}"
    quiet = now - rep.seen
    heard = f"no heartbeat for {quiet:.0f}s" if quiet > stale_after else f"last heartbeat {_ago(now, rep.seen)}"
    entry["why"] = f"{at}; {heard}"
    return entry


def _name_deadlocks(rows: list[dict[str, Any]], stuck: list[Stuck], labels: dict[str, dict[int, int]]) -> None:
    """Set ``deadlock`` on every shown row whose stuck waits are on a cycle of stuck waits
    (ranks named as their group's users know them when the cycle is within one group and
    its point-to-point messages, else by world rank)."""
    group_of = {(w.rank, w.op): g for w, g in stuck}
    for cycle in summary(w for w, _ in stuck).cycles:
        groups = [group_of[(w.rank, w.op)] for w, _ in cycle]
        home = family(groups[0])
        one = all(family(g) == home for g in groups)
        name = _namer(labels.get(home, {})) if one else _world_rank
        edges = []
        for (w, p), g in zip(cycle, groups, strict=True):
            op, _, seq = w.op.rpartition(" #")
            edges.append(Wait(w.rank, op_name(op, int(seq), g, home), w.ranks).edge(p, name))
        text = "deadlock: " + ", ".join(edges)
        keys = {(g, int(w.op.rpartition(" #")[2])) for (w, _), g in zip(cycle, groups, strict=True)}
        for row in rows:
            if (row["group"], row["seq"]) in keys and row["deadlock"] is None:
                row["deadlock"] = text


CHAIN_ROWS = 32  # stuck waits a heartbeat's answer names at most


def index(reports: list[Report]) -> dict[tuple[str, int], Report]:
    """The reports by (group family, world rank): where :func:`chain_rows` looks up a rank."""
    out: dict[tuple[str, int], Report] = {}
    for rep in reports:
        for g in {row.group for row in rep.ops} | set(rep.next):
            out[(family(g), rep.rank)] = rep
    return out


def chain_answer(
    by: dict[tuple[str, int], Report], rep: Report, stuck_after: float, now: float, stale_after: float
) -> dict[str, list[list[Any]]]:
    """What a rank is told of the ranks it waits for (a heartbeat's answer), following
    the chains from its own waits: ``waits``, their stuck waits, each ``[world rank,
    name, seq, group, [world ranks waited for], seconds without data, seconds
    running]`` (only stuck ones, :func:`stuck_since`: a wait seen once may be healthy
    progress); and ``ends``, ``[world rank, what it is doing]`` for the ranks reached
    that are stuck in nothing ("has not called it: idle after #0; last heartbeat 0.4s
    ago"). At most :data:`CHAIN_ROWS` of each."""
    waits: list[list[Any]] = []
    ends: list[list[Any]] = []
    todo = [(family(row.group), w, row.group) for row in rep.ops for w in row.waiting_world or () if w != rep.rank]
    seen = {(f, rep.rank) for f, _, _ in todo}
    while todo and len(waits) < CHAIN_ROWS:
        home, world, group = todo.pop(0)
        if (home, world) in seen:
            continue
        seen.add((home, world))
        theirs = by.get((home, world))
        if theirs is None:
            continue
        stuck = False
        for row in theirs.ops:
            if family(row.group) != home or not row.waiting_world:
                continue
            if stuck_since(theirs, row.group, row.seq, stuck_after) is None:
                continue
            stuck = True
            idle = row.age if row.idle is None else row.idle
            waits.append([theirs.rank, row.name, row.seq, row.group, row.waiting_world, idle, row.age])
            todo.extend((home, w, row.group) for w in row.waiting_world)
        if not stuck and len(ends) < CHAIN_ROWS:
            ends.append([theirs.rank, _missing(0, group, theirs, now, stale_after)["why"]])
    return {"waits": waits[:CHAIN_ROWS], "ends": ends}


def _namer(label: dict[int, int]) -> Callable[[int], str]:
    return lambda r: f"rank {label.get(r, r)}"


def _world_rank(r: int) -> str:
    return f"world rank {r}"


def lines(board: list[dict[str, Any]]) -> list[str]:
    """The board as text: each deadlock once, then one line per operation and its
    mismatched calls (strings escaped)."""
    out = []
    for text in dict.fromkeys(row["deadlock"] for row in board if row.get("deadlock")):
        out.append(escape(text, 2000))
    for row in board:
        head = (
            f"{escape(row['op'], 60)} #{row['seq']} (group {escape(row['group'], 60)}, running {row['running_s']:g}s): "
        )
        missing = row.get("missing") or []
        if missing:
            waits = ", ".join(f"rank {m['rank']} ({escape(m.get('why', ''), 200)})" for m in missing)
            out.append(f"{head}waiting for {waits}; arrived: {_list(row['arrived'])}")
        elif row.get("mismatch"):
            out.append(f"{head}every rank arrived ({_list(row['arrived'])}), but not with the same call")
        else:
            out.append(f"{head}every rank arrived ({_list(row['arrived'])}); {_stuck_text(row.get('stuck') or [])}")
        if row.get("mismatch"):
            out.append("    MISMATCH: the ranks made different calls:")
            out.extend(f"      {_list(c['ranks'])}: {escape(c['call'], 200)}" for c in row["calls"])
    return out


def _stuck_text(stuck: list[dict[str, Any]]) -> str:
    """``"no data for 12s: rank 0 waits for rank 3, rank 1 waits for rank 0"``."""
    if not stuck:
        return "still exchanging data"
    idle = min(s["idle_s"] for s in stuck)
    waits = ", ".join(f"rank {s['rank']} waits for {', '.join(f'rank {r}' for r in s['waiting'])}" for s in stuck)
    return f"no data for {idle:g}s: {waits}"


def _list(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


__all__ = [
    "CHAIN_ROWS",
    "KEEP",
    "STUCK_AFTER",
    "Report",
    "Row",
    "build",
    "chain_answer",
    "follow",
    "index",
    "lines",
    "parse",
    "stuck_since",
]
