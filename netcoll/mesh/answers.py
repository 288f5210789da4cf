"""Answers to a peer's timeout, so that wait chains can cross operations.

A rank that times out in an operation sends every other member an ABORT saying
what it waited for (``w``, docs/protocol.md §2). A member waiting in that same
operation answers through the engine (its own ABORT, with its own wait). A
member that is *not* waiting in it (the operation is not open here yet, has
finished here, or waits for no one) cannot; this module answers for it: a
TIMEOUT ABORT back to the asker, for the asker's operation, whose ``w`` names
the operation this rank does wait in (the oldest one) and for whom::

    rank 0 times out in all_reduce #1 waiting for rank 2
    rank 2 is in all_reduce #0 waiting for rank 0: it answers so, and rank 0 names the deadlock

An answer names another operation than the one it is about, and is never
answered itself (two ranks never echo each other). Every wait heard is also
kept (:attr:`Answers.heard`), so an operation here that times out later can
name a cycle through a rank that gave up first.

The coordinator's arrival board adds what it knows: a heartbeat of a rank that
has waited a while is answered with the stuck waits of the ranks it waits for
(:meth:`Answers.seen`, from the heartbeat thread), so a slow-operation warning
can say what they are in before anyone times out.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ..escape import escape
from ..operation import Operation, Reason
from ..wire import Kind

if TYPE_CHECKING:
    from .channel import Mesh

HEARD_KEPT = 1024  # waits heard kept at most (one per rank)
SEEN_KEPT = 64  # waits of the board's answer read at most
MAX_TEXT = 200  # characters kept of an operation's or group's name
MAX_NOTE = 300  # characters kept of what the board says a rank does


class Answers:
    """The mesh's :attr:`Mailbox.asked <netcoll.mesh.mailbox.Mailbox.asked>` hook."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        #: world rank -> the wait its last timeout report named (an ABORT's ``w``) and when
        #: (monotonic seconds) it was heard
        self.heard: dict[int, tuple[dict[str, Any], float]] = {}
        #: the same, from the coordinator's last answer to a heartbeat (replaced whole)
        self.board: dict[int, tuple[dict[str, Any], float]] = {}
        #: world rank -> what that answer says it does, for ranks stuck in nothing (and when)
        self.notes: dict[int, tuple[str, float]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, src: int, header: dict[str, Any], op: Operation | None) -> None:
        wait = header.get("w")
        if wait is not None:
            if len(self.heard) >= HEARD_KEPT and header["origin"] not in self.heard:
                self.heard.clear()
            self.heard[header["origin"]] = (wait, time.monotonic())
            if (wait["g"], wait["q"]) != (header["g"], header["q"]):
                return  # an answer: never answered
        if op is not None and (op.posted or op.blocked is not None):
            return  # this rank waits in it: the engine tells what for
        where = self.waiting_in(op)
        if where is None or self.mesh.closed:
            return
        field = where.wait_field()
        if field is None:
            return
        me = where.me(self.mesh.rank)
        reply = {
            "g": header["g"],
            "q": header["q"],
            "reason": f"rank {me} is in {where.where()}, waiting for {_ranks(where.waiting_for())}",
            "origin": self.mesh.rank,
            "cause": Reason.TIMEOUT.value,
            "ranks": [],
            "w": field,
        }
        task = asyncio.get_running_loop().create_task(self._send(src, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def waiting_in(self, other: Operation | None) -> Operation | None:
        """The oldest operation open here, other than ``other``, that waits for a peer."""
        ops = [op for op in self.mesh.mailbox.ops.copy().values() if op is not other and op.posted]
        return min(ops, key=lambda op: op.opened) if ops else None

    def recent(self, since: float) -> dict[int, dict[str, Any]]:
        """The waits heard (from the ranks, else from the board) at or after monotonic
        time ``since``, by world rank."""
        out = {r: w for r, (w, at) in self.board.items() if at >= since}
        out.update({r: w for r, (w, at) in self.heard.copy().items() if at >= since})
        return out

    def notes_since(self, since: float) -> dict[int, str]:
        """What the board said at or after ``since`` of ranks stuck in nothing, by world rank."""
        return {r: why for r, (why, at) in self.notes.items() if at >= since}

    def seen(self, answer: Any) -> None:
        """The coordinator's answer to a heartbeat (``board.chain_answer``): the stuck
        waits on this rank's chains (``waits``: ``[world rank, name, seq, group, [world
        ranks], seconds without data, seconds running]``) and what the other ranks
        reached do (``ends``: ``[world rank, text]``), checked (entries of another shape
        are skipped). Called from the heartbeat thread: the dicts are replaced whole."""
        now = time.monotonic()
        board: dict[int, tuple[dict[str, Any], float]] = {}
        notes: dict[int, tuple[str, float]] = {}
        rows = answer.get("waits") if isinstance(answer, dict) else None
        for row in rows[:SEEN_KEPT] if isinstance(rows, list) else ():
            wait = _board_wait(row)
            if wait is not None:
                board.setdefault(row[0], (wait, now))
        ends = answer.get("ends") if isinstance(answer, dict) else None
        for end in ends[:SEEN_KEPT] if isinstance(ends, list) else ():
            if isinstance(end, list) and len(end) == 2 and _count(end[0]) and isinstance(end[1], str):
                notes.setdefault(end[0], (escape(end[1], MAX_NOTE), now))
        self.board, self.notes = board, notes

    async def _send(self, peer: int, header: dict[str, Any]) -> None:
        try:
            await self.mesh.send(peer, Kind.ABORT, header)
        except Exception:  # noqa: BLE001 - best effort: the asker may be gone
            pass


def _board_wait(row: Any) -> dict[str, Any] | None:
    """A board row as an ABORT's ``w`` (None when it is not one)."""
    if not isinstance(row, list) or len(row) != 7:
        return None
    rank, name, seq, group, ranks, idle, age = row
    if not all(_count(v) for v in (rank, seq)) or not isinstance(name, str) or not isinstance(group, str):
        return None
    if not isinstance(ranks, list) or not all(_count(r) for r in ranks) or not (_secs(idle) and _secs(age)):
        return None
    return {"n": name[:MAX_TEXT], "q": seq, "g": group[:MAX_TEXT], "r": ranks[:64], "s": idle, "a": age}


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62


def _secs(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e12


def _ranks(ranks: Any) -> str:
    return ", ".join(f"rank {r}" for r in ranks)


__all__ = ["Answers"]
