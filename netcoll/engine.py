"""The engine under every collective: one operation per call, one deadline,
typed errors, and aborts sent to the other ranks (no I/O of its own; it drives
a :class:`~netcoll.transport.base.Transport`). :class:`CommBase` is the
:class:`~netcoll.comm.Communicator` minus the collectives.

Failure handling, in order of preference:

* a failure seen here (a lost link, a mismatched fingerprint, an algorithm
  error) fails the operation and sends ABORT to every other member, so no rank
  waits for its own deadline;
* on the deadline the error names the ranks this rank was waiting for; after a
  short grace the timeout reports of the others name the rank at the end of
  the wait chain ("rank 1 was waiting for rank 0; rank 0 was waiting for rank 2");
* cancelling a running call aborts it everywhere and re-raises.
"""

from __future__ import annotations

import asyncio
import functools
import numbers
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from . import algorithms
from .errors import (
    CollectiveError,
    CollectiveTimeout,
    CommunicatorClosed,
    MismatchError,
    PeerLost,
)
from .transport.base import Channel, Transport
from .transport.mailbox import Operation

T = TypeVar("T")
DEFAULT_TIMEOUT = 300.0
TIMEOUT_GRACE = 0.2  # after a deadline, how long to listen for peers' own timeout reports


def _ranks(ranks: list[int]) -> str:
    return ", ".join(f"rank {r}" for r in ranks)


class CommBase:
    """Group membership, sequencing and the per-call engine.

    Attributes:
        rank: this process's rank in the group (0..world_size-1).
        world_size: the number of ranks in the group.
        group: the group's name (sub-groups from ``split`` get derived names).
    """

    def __init__(self, transport: Transport, *, group: str = "default", members: tuple[int, ...] | None = None,
                 timeout: float = DEFAULT_TIMEOUT, segment_bytes: int | None = None) -> None:
        self.transport = transport
        self.group = group
        self.members = tuple(members) if members is not None else tuple(range(transport.size))
        self.rank = self.members.index(transport.rank)
        self.world_size = len(self.members)
        self.timeout = _check_timeout(timeout)
        self.segment_bytes = segment_bytes or algorithms.DEFAULT_SEGMENT_BYTES
        self.closed = False
        self._seq = 0
        self._p2p_seq: dict[str, int] = {}
        self._splits = 0
        self._on_close: list[Callable[[], Awaitable[None]]] = []
        self._fps: dict[tuple[Any, ...], str] = {}  # hot calls' fingerprints, by their arguments

    def __repr__(self) -> str:
        return f"<{type(self).__name__} group={self.group!r} rank={self.rank} world_size={self.world_size}>"

    # -- engine -------------------------------------------------------------------
    def _pick(self, name: str, algorithm: str, nbytes: int) -> str:
        table = algorithms.ALGORITHMS[name]
        if algorithm == "auto":
            return algorithms.choose(name, nbytes, self.world_size)
        if algorithm not in table:
            raise ValueError(f"{name} has no algorithm {algorithm!r}; choose one of "
                             f"{', '.join(['auto', *sorted(table)])}")
        return algorithm

    def _pick_v(self, name: str, algorithm: str, only: str) -> str:
        """The algorithm of an uneven ("v") collective: there is one, ``only``."""
        if algorithm not in ("auto", only):
            raise ValueError(f"{name} of uneven sizes (a list / uneven=True) has no algorithm {algorithm!r}; "
                             f"choose 'auto' or {only!r}")
        return only

    def _check_root(self, root: Any) -> int:
        if isinstance(root, bool) or not isinstance(root, numbers.Integral) or not 0 <= root < self.world_size:
            raise ValueError(f"root must be a rank in 0..{self.world_size - 1}, got {root!r}")
        return int(root)

    async def _run(self, name: str, fp: str, body: Callable[[Channel], Awaitable[T]], timeout: float | None, *,
                   group: str | None = None, seq: int | None = None,
                   members: tuple[int, ...] | None = None) -> T:
        """Run ``body`` as operation (group, seq) under one deadline, turning
        every failure into a typed error here and an ABORT on the other ranks."""
        if self.closed:
            raise CommunicatorClosed(f"{self!r} is closed")
        limit = self.timeout if timeout is None else _check_timeout(timeout)
        if seq is None:
            seq = self._seq
            self._seq += 1
        mailbox = self.transport.mailbox
        loop = asyncio.get_running_loop()
        op = mailbox.open(group or self.group, seq, fp, members or self.members, name, loop)
        try:
            if op.error is None:
                # The body runs inline (no task per call): a failure of the op fails
                # every posted receive, so the body raises it; the deadline cancels
                # it (asyncio.timeout's logic, minus its per-call overhead).
                task = asyncio.current_task(loop)
                if task is None:
                    raise RuntimeError("netcoll collectives must be awaited inside an asyncio task")
                deadline = _Deadline(task)
                timer = loop.call_at(loop.time() + limit, deadline.expire)
                try:
                    try:
                        return await body(Channel(self.transport, op))
                    finally:
                        timer.cancel()
                except asyncio.CancelledError:
                    if not deadline.expired or task.uncancel() > deadline.cancelling:
                        op.fail(CollectiveError(f"{op.where()} was cancelled on rank {self._op_rank(op)}",
                                                op=name, seq=seq))
                        await self._abort(op, "cancelled")
                        raise
                    if op.error is None:  # our deadline cancelled the body
                        await self._time_out(op, limit)
                except (CollectiveError, ValueError, TypeError) as exc:
                    op.fail(exc)  # type: ignore[arg-type]  # no-op when the op failed first
                except Exception as exc:  # noqa: BLE001 - a bug in an algorithm still fails cleanly
                    op.fail(CollectiveError(f"{op.where()} failed on rank {self._op_rank(op)}: "
                                            f"{type(exc).__name__}: {exc}", op=name, seq=seq))
            # failed: at open (dead peer, early abort, mismatch), in the body, or on the deadline
            await self._abort(op, _cause(op.error))
            raise op.error  # type: ignore[misc]
        finally:
            mailbox.close(op)

    async def _time_out(self, op: Operation, limit: float) -> None:
        """Fail ``op`` on its deadline, tell the peers (with what we waited for),
        and listen briefly for theirs, so the error names the rank at the end
        of the wait chain rather than just our neighbour."""
        me, waiting = self._op_rank(op), op.waiting_for()
        op.fail(CollectiveTimeout(f"{op.where()} timed out after {limit:g}s on rank {me}: waiting for "
                                  f"{_ranks(waiting) or 'peers to read (send blocked)'}",
                                  op=op.name, seq=op.seq, ranks=waiting))
        await self._abort(op, "timeout")
        op.error.peers_told = True  # type: ignore[union-attr]
        await asyncio.sleep(min(TIMEOUT_GRACE, limit / 10))  # peers' own timeouts arrive as reports
        chain, root, todo, seen = [], [], list(waiting), {me}
        while todo:
            w = todo.pop(0)
            if w in seen:
                continue
            seen.add(w)
            if w in op.reports:
                chain.append(f"rank {w} was waiting for {_ranks(op.reports[w])}")
                todo.extend(op.reports[w])
            else:
                root.append(w)
        if chain:
            explained = CollectiveTimeout(
                f"{op.error}; {'; '.join(chain)}; so {_ranks(sorted(root)) or 'no rank'} never delivered "
                "(not called yet, stuck, or too slow)", op=op.name, seq=op.seq, ranks=sorted(root) or waiting)
            explained.peers_told = True  # type: ignore[attr-defined]  # peers were told already
            op.error = explained

    def _op_rank(self, op: Operation) -> int:
        return op.rank_of[self.transport.rank]

    async def _abort(self, op: Operation, cause: str) -> None:
        err = op.error
        waiting = getattr(err, "waiting", None)
        if waiting and op.error is not None:  # a peer timed out; tell everyone whom *we* were waiting for
            me = self._op_rank(op)
            await self.transport.abort(op, "timeout", f"rank {me} was waiting for {_ranks(waiting)}",
                                       tuple(waiting))
        if getattr(err, "peers_told", False):
            return
        ranks = tuple(getattr(err, "ranks", ()) or ())
        await self.transport.abort(op, cause, str(err), ranks)

    def _remember_fp(self, key: tuple[Any, ...], fp: str) -> str:
        if len(self._fps) >= 256:
            self._fps.clear()
        self._fps[key] = fp
        return fp

    def _fp(self, name: str, *, segmented: bool = True, **parts: Any) -> str:
        """The call's fingerprint, sent with every frame. ``segmented``: the
        message pattern depends on ``segment_bytes``, so it is part of it (ranks
        with different segment sizes would otherwise exchange mis-cut messages)."""
        if segmented:
            parts["segment_bytes"] = self.segment_bytes
        return _format_fp(name, tuple(parts.items()))



class _Deadline:
    """Cancels ``task`` when it expires (the timer is armed by the caller)."""

    __slots__ = ("task", "cancelling", "expired")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task, self.cancelling, self.expired = task, task.cancelling(), False

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()


@functools.lru_cache(maxsize=1024)
def _format_fp(name: str, parts: tuple[tuple[str, Any], ...]) -> str:
    return f"{name}({', '.join(f'{k}={v}' for k, v in parts)})"


def _cause(err: BaseException | None) -> str:
    if isinstance(err, CollectiveTimeout):
        return "timeout"
    if isinstance(err, PeerLost):
        return "lost"
    if isinstance(err, MismatchError):
        return "mismatch"
    return "error"


def _check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)



__all__ = ["DEFAULT_TIMEOUT", "TIMEOUT_GRACE", "CommBase"]
