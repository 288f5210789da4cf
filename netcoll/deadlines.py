"""Operation deadlines: one loop timer per engine, not one per operation.

Each running operation has a :class:`Deadline`: at the slow-operation threshold
(when that comes before its end) it logs a WARNING naming the ranks still
waited for and what is known of what *they* wait for (the wait chain, from the
ranks' timeouts and the coordinator's board: :mod:`netcoll.waits`), then again
at :data:`GROWTH` times the time before (5 s, 15 s, 45 s, ...) while that
comes before the end, each line saying when the next comes; at its end it
cancels the task running the operation. An operation that ends first just
leaves the set of running ones. The warnings carry the log context (the job)
of the operation, not that of whichever task armed the shared timer.

:class:`Deadlines` keeps a single ``loop.call_at`` timer armed for the
earliest event it may have to act on, and re-arms it when it fires. A new
operation whose events all come after the armed time (the usual case: calls
in sequence, one timeout) costs a set insert and a compare, no timer of its
own, so the call path does not pay for a ``TimerHandle``, a heap push and a
cancellation per operation (6 % of a 4-byte all_reduce's instructions;
docs/performance.md). The timer may fire with nothing due; it then re-arms
for the next running operation, or stays off while none runs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from . import logs
from .operation import Operation
from .waits import Wait, explain, seconds

log = logging.getLogger("netcoll.engine")

GROWTH = 3.0  # each slow warning comes this many times later than the one before
#: what the other ranks are known to wait for (``(op, this rank's label) -> their waits``)
Told = Callable[[Operation, int], list[Wait]]
#: what is known of ranks stuck in nothing (``op -> {rank: "has not called it: ..."}``)
Notes = Callable[[Operation], dict[int, str]]


def ranks_text(ranks: Any) -> str:
    """``"rank 1, rank 2"`` (empty when there are none)."""
    return ", ".join(f"rank {r}" for r in ranks)


class Deadline:
    """One running operation's deadline (made by :meth:`Deadlines.start`).

    ``cancelling`` is the task's count of cancel requests before, so that a
    cancellation from elsewhere at the same time is told apart; ``expired``
    says the deadline cancelled the task."""

    __slots__ = ("owner", "task", "cancelling", "expired", "op", "start", "end", "rank", "slow", "due", "fields")

    def __init__(
        self, owner: Deadlines, task: asyncio.Task[Any], op: Operation, now: float, limit: float, slow: float, rank: int
    ) -> None:
        self.owner = owner
        self.task, self.cancelling, self.expired = task, task.cancelling(), False
        self.op: Operation | None = op
        self.rank = rank
        self.start, self.end = now, now + limit
        self.slow = slow if slow < limit else 0.0  # the next warning, in seconds from the start (0: none)
        self.due = now + slow if self.slow else self.end  # the next event: a warning, then the end
        self.fields = logs.FIELDS.get()  # the operation's log context (its job), for the warnings

    def fire(self) -> None:
        """The next event is due: warn (and arm the next warning, or the end), or expire."""
        if self.due < self.end:
            after = self.slow
            self.slow = after * GROWTH
            self.due = min(self.start + self.slow, self.end)
            self.warn(after)
            return
        self.owner.active.discard(self)
        self.expired = True
        self.task.cancel()

    def warn(self, after: float) -> None:
        """The slow warning ``after`` seconds from the start (see :func:`slow_text`)."""
        op = self.op
        if op is None:
            return
        limit = self.end - self.start
        again = self.slow if self.start + self.slow < self.end else None
        log.warning(
            "%s",
            slow_text(op, self.rank, after, again, limit, self.owner.told, self.owner.notes),
            extra=logs.op_extra(op.name, op.seq, self.rank, self.fields or {}),
        )

    def cancel(self) -> None:
        """The operation ended before its deadline."""
        self.owner.active.discard(self)
        self.op = None


def slow_text(
    op: Operation,
    rank: int,
    after: float,
    again: float | None,
    limit: float,
    told: Told | None,
    notes: Notes | None = None,
) -> str:
    """``"slow operation: all_reduce #7 of group 'g' still running on rank 2 after 5s;
    waiting for rank 3; rank 3 in all_reduce #7 waits for rank 0; rank 0 never
    delivered: ...; next warning at 15s, timeout at 300s"`` (the chain when more than
    our own wait is known; ``again``: when the next warning comes, None: no more)."""
    me, waiting = op.me(rank), tuple(op.waiting_for())
    text = (
        f"slow operation: {op.where()} still running on rank {me} after {seconds(after)}s; "
        f"waiting for {ranks_text(waiting) or 'peers to read (send blocked)'}"
    )
    if waiting and told is not None:
        now = time.monotonic()
        own = Wait(me, op.short(), waiting, now - op.moved, now - op.opened)
        found = explain(me, [own, *told(op, me)])
        known = notes(op) if notes is not None else {}
        if found.cycles or found.waits or any(r in known for r in found.ends):
            text += f"; {found.text(notes=known)}"
    if again is not None:
        return f"{text}; next warning at {seconds(again)}s, timeout at {seconds(limit)}s"
    return f"{text}; timeout at {seconds(limit)}s"


class Deadlines:
    """The running operations' deadlines under one timer (see the module docstring).

    ``told``: what the other ranks are known to wait for, and ``notes``: what is known
    of ranks stuck in nothing (both set by the engine), for the slow warnings' wait chains."""

    __slots__ = ("active", "timer", "at", "loop", "told", "notes")

    def __init__(self) -> None:
        self.active: set[Deadline] = set()
        self.timer: asyncio.TimerHandle | None = None
        self.at = math.inf  # when the timer fires (inf: not armed)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.told: Told | None = None
        self.notes: Notes | None = None

    def start(self, task: asyncio.Task[Any], op: Operation, limit: float, slow: float, rank: int) -> Deadline:
        """The deadline of ``op``, run by ``task``: ``limit`` seconds from now,
        with a warning after ``slow`` seconds when that comes first."""
        loop = task.get_loop()
        deadline = Deadline(self, task, op, loop.time(), limit, slow, rank)
        self.active.add(deadline)
        if deadline.due < self.at or loop is not self.loop:
            self._arm(loop, deadline.due)
        return deadline

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.loop, self.at = loop, when
        self.timer = loop.call_at(when, self._fire)

    def _fire(self) -> None:
        loop = self.loop
        assert loop is not None
        self.timer, self.at = None, math.inf
        now = loop.time()
        for deadline in [d for d in self.active if d.due <= now]:
            deadline.fire()
        if self.active:
            self._arm(loop, min(d.due for d in self.active))

    def close(self) -> None:
        """Stop the timer (the operations still running keep no deadline)."""
        if self.timer is not None:
            self.timer.cancel()
        self.timer, self.at, self.active = None, math.inf, set()


__all__ = ["GROWTH", "Deadline", "Deadlines", "ranks_text", "slow_text"]
