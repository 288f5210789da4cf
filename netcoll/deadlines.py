"""Operation deadlines: one loop timer per engine, not one per operation.

Each running operation has a :class:`Deadline`: at the slow-operation threshold
(when that comes before its end) it logs a WARNING naming the ranks still
waited for; at its end it cancels the task running the operation. An
operation that ends first just leaves the set of running ones.

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
from typing import Any

from .logs import op_extra
from .operation import Operation

log = logging.getLogger("netcoll.engine")


def ranks_text(ranks: Any) -> str:
    """``"rank 1, rank 2"`` (empty when there are none)."""
    return ", ".join(f"rank {r}" for r in ranks)


class Deadline:
    """One running operation's deadline (made by :meth:`Deadlines.start`).

    ``cancelling`` is the task's count of cancel requests before, so that a
    cancellation from elsewhere at the same time is told apart; ``expired``
    says the deadline cancelled the task."""

    __slots__ = ("owner", "task", "cancelling", "expired", "op", "end", "rank", "slow", "due")

    def __init__(
        self, owner: Deadlines, task: asyncio.Task[Any], op: Operation, now: float, limit: float, slow: float, rank: int
    ) -> None:
        self.owner = owner
        self.task, self.cancelling, self.expired = task, task.cancelling(), False
        self.op: Operation | None = op
        self.rank = rank
        self.end = now + limit
        self.slow = slow if slow < limit else 0.0  # 0: no slow warning before the end
        self.due = now + slow if self.slow else self.end  # the next event: the warning, then the end

    def fire(self) -> None:
        """The next event is due: warn (and wait for the end), or expire."""
        if self.due < self.end:
            self.due = self.end
            self.warn()
            return
        self.owner.active.discard(self)
        self.expired = True
        self.task.cancel()

    def warn(self) -> None:
        op = self.op
        if op is None:
            return
        log.warning(
            "slow operation: %s still running on rank %d after %gs; waiting for %s",
            op.where(),
            op.me(self.rank),
            self.slow,
            ranks_text(op.waiting_for()) or "peers to read (send blocked)",
            extra=op_extra(op.name, op.seq, self.rank),
        )

    def cancel(self) -> None:
        """The operation ended before its deadline."""
        self.owner.active.discard(self)
        self.op = None


class Deadlines:
    """The running operations' deadlines under one timer (see the module docstring)."""

    __slots__ = ("active", "timer", "at", "loop")

    def __init__(self) -> None:
        self.active: set[Deadline] = set()
        self.timer: asyncio.TimerHandle | None = None
        self.at = math.inf  # when the timer fires (inf: not armed)
        self.loop: asyncio.AbstractEventLoop | None = None

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


__all__ = ["Deadline", "Deadlines", "ranks_text"]
