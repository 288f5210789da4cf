"""The arrival board: which ranks have arrived at each stuck operation, and
which have not (the hang explainer of ``netcoll status``).

Every rank's heartbeat thread carries a report of the operations it is in
(:meth:`netcoll.transport.mailbox.Mailbox.snapshot`): ``{rank, ops: [[group,
seq, name, fingerprint, seconds running, members, waiting for]], next: {group:
next seq}}``. The coordinator keeps the latest report of each connection
(:class:`Report`) and builds the board from them: for each operation some
rank is in, a rank has *arrived* if it is in it (or already past it: its next
sequence number is higher) and *not arrived* otherwise; ranks in the same
operation with different calls (fingerprints) are a *mismatch*, shown side by
side. Reports are untrusted input: checked, bounded, and escaped when shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..escape import escape

MAX_OPS = 16  # operations kept per report
MAX_GROUPS = 64  # next-sequence entries kept per report
MAX_TEXT = 200  # characters kept of a group name, operation name or fingerprint
MAX_MEMBERS = 4096
BOARD_ROWS = 32  # operations shown at most


@dataclass
class Report:
    """One rank's latest report and when its heartbeat was last seen (loop time)."""

    rank: int
    ops: list[tuple[str, int, str, str, float, tuple[int, ...], list[int]]]
    next: dict[str, int]
    at: float  # loop time the report arrived
    seen: float  # loop time the heartbeat connection was last heard from (updated by the caller)


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError("expected a string")
    return v[:MAX_TEXT]


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62:
        raise TypeError("expected a non-negative integer")
    return v


def parse(body: Any, at: float) -> Report | None:
    """A heartbeat's ``ops`` report, checked and bounded (None if malformed)."""
    try:
        if not isinstance(body, dict):
            return None
        rank = _int(body.get("rank"))
        ops = []
        for row in list(body.get("ops") or [])[:MAX_OPS]:
            group, seq, name, fp, age, members, waiting = row
            if not isinstance(age, (int, float)) or not math.isfinite(age):
                raise TypeError("age")
            members_t = tuple(_int(m) for m in list(members)[:MAX_MEMBERS])
            waiting_l = [_int(w) for w in list(waiting)[:MAX_MEMBERS]]
            ops.append((_text(group), _int(seq), _text(name), _text(fp), float(age), members_t, waiting_l))
        nxt = {_text(g): _int(q) for g, q in list(dict(body.get("next") or {}).items())[:MAX_GROUPS]}
    except (TypeError, ValueError, AttributeError):
        return None
    return Report(rank, ops, nxt, at, at)


def _ago(now: float, then: float) -> str:
    return f"{max(0.0, now - then):.1f}s ago"


def build(reports: list[Report], now: float, stale_after: float) -> list[dict[str, Any]]:
    """The board: one row per operation some rank is in (oldest first)."""
    by_rank: dict[tuple[str, int], Report] = {}  # (group, world rank) -> its report
    for rep in reports:
        by_rank.setdefault(("", rep.rank), rep)  # a rank that never ran anything in the group
        for g in {row[0] for row in rep.ops} | set(rep.next):
            by_rank[(g, rep.rank)] = rep
    ops: dict[tuple[str, int], dict[int, tuple[str, str, float, tuple[int, ...], list[int]]]] = {}
    for rep in reports:
        for group, seq, name, fp, age, members, waiting in rep.ops:
            ops.setdefault((group, seq), {})[rep.rank] = (name, fp, age + (now - rep.at), members, waiting)
    rows = []
    for (group, seq), inside in ops.items():
        rows.append(_row(group, seq, inside, by_rank, now, stale_after))
    rows.sort(key=lambda r: -r["running_s"])
    return rows[:BOARD_ROWS]


def _row(
    group: str,
    seq: int,
    inside: dict[int, tuple[str, str, float, tuple[int, ...], list[int]]],
    by_rank: dict[tuple[str, int], Report],
    now: float,
    stale_after: float,
) -> dict[str, Any]:
    first = next(iter(inside.values()))
    name, members = first[0], first[3]
    arrived, missing = [], []
    for grank, world in enumerate(members):
        rep = by_rank.get((group, world)) or by_rank.get(("", world))
        if world in inside or (rep is not None and rep.next.get(group, 0) > seq):
            arrived.append(grank)
            continue
        entry: dict[str, Any] = {"rank": grank}
        if rep is None:
            entry["why"] = "no report from it (no heartbeat thread, or not connected)"
        else:
            entry["last_heartbeat_s"] = round(now - rep.seen, 1)
            where = [f"{r[2]} #{r[1]}" for r in rep.ops if r[0] == group]
            last = rep.next.get(group, 0) - 1
            idle = f"idle after #{last}" if last >= 0 else "no operation in this group yet"
            at = f"in {', '.join(where)}" if where else f"has not called it: {idle}"
            quiet = now - rep.seen
            heard = f"no heartbeat for {quiet:.0f}s" if quiet > stale_after else f"last heartbeat {_ago(now, rep.seen)}"
            entry["why"] = f"{at}; {heard}"
        missing.append(entry)
    calls: dict[str, list[int]] = {}
    for world, (_, fp, _, _, _) in inside.items():
        calls.setdefault(fp, []).append(members.index(world) if world in members else world)
    return {
        "group": group,
        "seq": seq,
        "op": name,
        "running_s": round(max(v[2] for v in inside.values()), 1),
        "arrived": sorted(arrived),
        "missing": missing,
        "calls": [{"call": fp, "ranks": sorted(r)} for fp, r in sorted(calls.items(), key=lambda kv: min(kv[1]))],
        "mismatch": len(calls) > 1,
    }


def lines(board: list[dict[str, Any]]) -> list[str]:
    """The board as text: one line per operation, then its mismatched calls (strings escaped)."""
    out = []
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
            out.append(f"{head}every rank arrived ({_list(row['arrived'])}); still exchanging data")
        if row.get("mismatch"):
            out.append("    MISMATCH: the ranks made different calls:")
            out.extend(f"      {_list(c['ranks'])}: {escape(c['call'], 200)}" for c in row["calls"])
    return out


def _list(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


__all__ = ["Report", "build", "lines", "parse"]
