"""Wait chains: who waits for whom, in which operation, and what that says.

A timeout names the ranks it waited for; the ranks it waited for say (in their
timeout reports, or on the arrival board) whom *they* wait for. Followed from
rank to rank, the waits either come back to a rank already on the way (a
*cycle*: a deadlock, no rank in it can move) or end at ranks with no wait of
their own (they never delivered: not called yet, stuck, or too slow)::

    deadlock: rank 0 in all_reduce #1 waits for rank 2, rank 2 in all_reduce #0 waits for rank 0
    rank 1 in all_reduce #0 waits for rank 3; rank 3 never delivered: not called yet, stuck, or too slow

A cycle whose ranks were still receiving data (:attr:`Wait.stuck` false) is not
a deadlock but an operation too slow for its deadline (a ring's ranks always
wait for their neighbour), and is said so.

Pure functions over plain values, no imports of netcoll: the engine's timeouts,
the arrival board and a job's merged error all use them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

NEVER: Final = "never delivered: not called yet, stuck, or too slow"
STILL_MOVING: Final = "waits in a cycle, but data was still arriving (too slow, not a deadlock)"
MAX_WAITS: Final = 4096  # waits kept when reading them from a peer or a report
MAX_RANKS: Final = 512  # ranks kept per wait when reading one
MAX_OP: Final = 200  # characters kept of an operation's name
#: a wait whose operation received nothing for this long (or for half the time it has run, if
#: less) is stuck; a wait still receiving more recently than that is slow
STALL_S: Final = 1.0

Label = Callable[[int], str]


def seconds(x: float) -> str:
    """A duration as messages show it: ``"300"``, ``"11.9"``, ``"0.3"`` (a tenth from 10 s
    up, else at most 3 decimals)."""
    return f"{round(x, 1 if x >= 10 else 3):g}"


def ranks_text(ranks: Iterable[int], label: Label | None = None) -> str:
    """``"rank 1, rank 2"`` (empty when there are none)."""
    name = label or _rank
    return ", ".join(name(r) for r in ranks)


def _rank(r: int) -> str:
    return f"rank {r}"


@dataclass(frozen=True, slots=True)
class Wait:
    """Rank ``rank``, in operation ``op`` (``"all_reduce #1"``), waits for ``ranks``.

    ``stalled``: seconds since that operation last received data on that rank when
    this was seen, and ``age``: how long it had run (None: not known)."""

    rank: int
    op: str
    ranks: tuple[int, ...]
    stalled: float | None = None
    age: float | None = None

    @property
    def stuck(self) -> bool:
        """No data for :data:`STALL_S` (or for half its age, if less); unknown counts as stuck."""
        if self.stalled is None:
            return True
        return self.stalled >= (STALL_S if self.age is None else min(STALL_S, self.age / 2))

    def text(self, label: Label | None = None) -> str:
        name = label or _rank
        return f"{name(self.rank)} in {self.op} waits for {ranks_text(self.ranks, label)}"

    def edge(self, peer: int, label: Label | None = None) -> str:
        name = label or _rank
        return f"{name(self.rank)} in {self.op} waits for {name(peer)}"

    def row(self) -> list[Any]:
        """As a plain list (a job report's field): ``[rank, op, ranks, stalled, age]``."""
        return [self.rank, self.op, list(self.ranks), self.stalled, self.age]


def from_rows(rows: Any) -> list[Wait]:
    """Waits from :meth:`Wait.row` lists sent by another process: malformed rows are
    dropped, sizes bounded (untrusted input)."""
    out: list[Wait] = []
    if not isinstance(rows, list):
        return out
    for row in rows[:MAX_WAITS]:
        try:
            rank, op, ranks, stalled, age = row
        except (TypeError, ValueError):
            continue
        if not _is_rank(rank) or not isinstance(op, str) or not isinstance(ranks, list):
            continue
        if not all(_is_rank(r) for r in ranks[:MAX_RANKS]):
            continue
        out.append(Wait(rank, op[:MAX_OP], tuple(ranks[:MAX_RANKS]), _seconds(stalled), _seconds(age)))
    return out


def _seconds(v: Any) -> float | None:
    """A duration read from another process (None when it is not one)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e12:
        return None
    return float(v)


def _is_rank(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31


def family(group: str) -> str:
    """The group whose ranks ``group``'s messages name: its own, but a point-to-point
    sequence's (``<g>/p2p/<tag>/<src>><dst>``) and a group's own operations'
    (``<g>/links``, ``<g>/cost``) are ``<g>``'s."""
    if "/p2p/" in group:
        return group[: group.index("/p2p/")]
    for own in ("/links", "/cost"):
        if group.endswith(own):
            return group[: -len(own)]
    return group


def op_name(name: str, seq: int, group: str, home: str) -> str:
    """How a wait names operation ``name #seq`` of ``group`` to readers of ``home``'s
    errors: with its group when that names its ranks otherwise."""
    if family(group) == family(home):
        return f"{name} #{seq}"
    return f"{name} #{seq} of group {group!r}"


Graph = Mapping[int, Sequence[Wait]]


def graph(waits: Iterable[Wait]) -> dict[int, list[Wait]]:
    """The waits by waiting rank (a rank may wait in several operations at once)."""
    out: dict[int, list[Wait]] = {}
    for w in waits:
        if w.ranks and w not in out.get(w.rank, ()):
            out.setdefault(w.rank, []).append(w)
    return out


Edge = tuple[Wait, int]  # (the wait, the rank it waits for on the cycle)


def find_cycle(g: Graph, starts: Iterable[int], avoid: frozenset[int] = frozenset()) -> list[Edge]:
    """A cycle of waits reachable from ``starts`` (in their order), as edges from
    the first rank of the cycle reached, or [] when there is none. Ranks in
    ``avoid`` are not entered."""
    done: set[int] = set(avoid)
    for start in starts:
        if start in done:
            continue
        path: list[Edge] = []
        on_path: dict[int, int] = {}  # rank -> its index in path
        stack: list[tuple[int, list[Edge]]] = [(start, _out_edges(g, start))]
        on_path[start] = 0
        while stack:
            rank, edges = stack[-1]
            if not edges:
                stack.pop()
                on_path.pop(rank, None)
                done.add(rank)
                if path:
                    path.pop()
                continue
            wait, peer = edges.pop(0)
            if peer in on_path:
                return [*path[on_path[peer] :], (wait, peer)]
            if peer in done or peer not in g:
                continue
            path.append((wait, peer))
            on_path[peer] = len(path)
            stack.append((peer, _out_edges(g, peer)))
    return []


def _out_edges(g: Graph, rank: int) -> list[Edge]:
    return [(w, p) for w in g.get(rank, ()) for p in sorted(w.ranks)]


def _rotate(cycle: list[Edge], first: int) -> list[Edge]:
    """The same cycle, begun at rank ``first`` when it is on it."""
    for i, (w, _) in enumerate(cycle):
        if w.rank == first:
            return cycle[i:] + cycle[:i]
    return cycle


def _cycle_text(cycle: list[Edge], label: Label | None) -> str:
    edges = ", ".join(w.edge(p, label) for w, p in cycle)
    if all(w.stuck for w, _ in cycle):
        return f"deadlock: {edges}"
    return f"{STILL_MOVING}: {edges}"


@dataclass
class Explanation:
    """What the waits reachable from some ranks say (see :func:`explain`, :func:`summary`).

    Attributes:
        cycles: each a cycle of waits (edges in order).
        waits: the other waits met, in the order met.
        ends: ranks waited for that have no wait of their own (never delivered).
        deadlock: some cycle is a deadlock (its ranks were not receiving).
    """

    cycles: list[list[Edge]] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    @property
    def deadlock(self) -> bool:
        return any(all(w.stuck for w, _ in c) for c in self.cycles)

    def text(self, label: Label | None = None, notes: Mapping[int, str] | None = None) -> str:
        """``"deadlock: ...; rank 1 in ... waits for rank 3; rank 3 never delivered: ..."``;
        ``notes``: what is known of ranks at the end ("has not called it: idle after
        #0"), said instead of the guesses."""
        parts = [_cycle_text(c, label) for c in self.cycles]
        parts += [w.text(label) for w in self.waits]
        told = notes or {}
        quiet = [r for r in self.ends if r not in told]
        if quiet:
            parts.append(f"{ranks_text(quiet, label)} {NEVER}")
        parts += [f"{(label or _rank)(r)} never delivered ({told[r]})" for r in self.ends if r in told]
        return "; ".join(parts)


def explain(start: int, waits: Iterable[Wait]) -> Explanation:
    """The wait chain from rank ``start`` (whose own wait is among ``waits``): a
    cycle reached from it (begun at ``start`` when it is on it), the other waits
    met on the way (``start``'s own is left out: the caller names it), and the
    ranks where the chain ends."""
    g = graph(waits)
    cycle = _rotate(find_cycle(g, [start]), start)
    out = Explanation()
    if cycle:
        out.cycles.append(cycle)
    on_cycle = {w.rank for w, _ in cycle}
    seen, todo = {start}, [p for w in g.get(start, ()) for p in sorted(w.ranks)]
    while todo:
        r = todo.pop(0)
        if r in seen:
            continue
        seen.add(r)
        if r not in g:
            out.ends.append(r)
            continue
        if r not in on_cycle:
            out.waits.extend(g[r])
        todo.extend(p for w in g[r] for p in sorted(w.ranks))
    out.ends.sort()
    return out


def summary(waits: Iterable[Wait], known: Iterable[int] = ()) -> Explanation:
    """Every rank's wait at once (a job's ranks, the board): the cycles first, then
    the waits of ranks on no cycle, then the ranks waited for with no wait of
    their own and not in ``known`` (ranks known to be done or elsewhere)."""
    g = graph(waits)
    out = Explanation()
    on_cycles: set[int] = set()
    while True:
        cycle = find_cycle(g, sorted(g), frozenset(on_cycles))
        if not cycle:
            break
        first = min(w.rank for w, _ in cycle)
        out.cycles.append(_rotate(cycle, first))
        on_cycles.update(w.rank for w, _ in cycle)
    for r in sorted(g):
        if r not in on_cycles:
            out.waits.extend(g[r])
    skip = set(known)
    out.ends = sorted({p for ws in g.values() for w in ws for p in w.ranks if p not in g and p not in skip})
    return out


__all__ = [
    "MAX_OP",
    "MAX_RANKS",
    "NEVER",
    "STALL_S",
    "STILL_MOVING",
    "Explanation",
    "Wait",
    "explain",
    "family",
    "from_rows",
    "graph",
    "op_name",
    "ranks_text",
    "seconds",
    "summary",
]
