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
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ..operation import Operation, Reason
from ..wire import Kind

if TYPE_CHECKING:
    from .base import Transport

HEARD_KEPT = 1024  # waits heard kept at most (one per rank)


class Answers:
    """The transport's :attr:`Mailbox.asked <netcoll.transport.mailbox.Mailbox.asked>` hook."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        #: world rank -> the wait its last timeout report named (an ABORT's ``w``) and when
        #: (monotonic seconds) it was heard
        self.heard: dict[int, tuple[dict[str, Any], float]] = {}
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
        if where is None or self.transport.closed:
            return
        field = where.wait_field()
        if field is None:
            return
        me = where.me(self.transport.rank)
        reply = {
            "g": header["g"],
            "q": header["q"],
            "reason": f"rank {me} is in {where.where()}, waiting for {_ranks(where.waiting_for())}",
            "origin": self.transport.rank,
            "cause": Reason.TIMEOUT.value,
            "ranks": [],
            "w": field,
        }
        task = asyncio.get_running_loop().create_task(self._send(src, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def waiting_in(self, other: Operation | None) -> Operation | None:
        """The oldest operation open here, other than ``other``, that waits for a peer."""
        ops = [op for op in self.transport.mailbox.ops.copy().values() if op is not other and op.posted]
        return min(ops, key=lambda op: op.opened) if ops else None

    def recent(self, since: float) -> dict[int, dict[str, Any]]:
        """The waits heard at or after monotonic time ``since``, by world rank."""
        return {r: w for r, (w, at) in self.heard.copy().items() if at >= since}

    async def _send(self, peer: int, header: dict[str, Any]) -> None:
        try:
            await self.transport.send(peer, Kind.ABORT, header)
        except Exception:  # noqa: BLE001 - best effort: the asker may be gone
            pass


def _ranks(ranks: Any) -> str:
    return ", ".join(f"rank {r}" for r in ranks)


__all__ = ["Answers"]
