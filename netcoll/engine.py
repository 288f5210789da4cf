"""The engine under every collective: issue an operation at the call, drive
it to its end under one deadline, and tell the other ranks when it fails
(no I/O of its own; it drives a :class:`~netcoll.mesh.channel.Mesh`).

:meth:`Engine.issue` fixes the operation's sequence number *at the call* and
returns a :class:`~netcoll.operation.Work`; a task of its own runs the body,
so several operations may be in flight and awaited in any order. How each
ending is reported:

* a failure seen here (a lost link, a mismatched fingerprint, an algorithm
  error) fails the operation and sends ABORT to every other member, so no rank
  waits for its own deadline;
* on the deadline the error names the ranks this rank was waiting for; after a
  short grace the timeout reports of the others (and the answers of ranks
  waiting in another operation, :mod:`netcoll.mesh.answers`) follow the
  wait chain (:mod:`netcoll.waits`): to a cycle, named a deadlock ("deadlock:
  rank 0 in all_reduce #1 waits for rank 2, rank 2 in all_reduce #0 waits for
  rank 0"), or to the ranks that never delivered;
* a cancelled Work (before or while it runs) aborts the operation everywhere
  with a ``cancelled`` cause naming this rank; the sequence stays aligned, so
  the next collective is correct.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import numbers
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from . import algorithms, observe, resultpool, selection, waits
from .deadlines import Deadlines
from .deadlines import ranks_text as _ranks
from .errors import CollectiveError, CommunicatorClosed
from .escape import escape
from .logs import OPERATIONS, op_extra
from .mesh.channel import Channel, Mesh
from .operation import ERROR_CLASSES, Failure, Operation, Reason, Work, detail
from .selection import Choice, Version, describe

log = logging.getLogger("netcoll.engine")

DEFAULT_TIMEOUT = 300.0
TIMEOUT_GRACE = 0.2  # after a deadline, how long to listen for peers' own timeout reports
GRACE_STEP = 0.01  # ... looking again this often whether every rank on the chain has told

Body = Callable[[Channel], Awaitable[Any]]


@dataclass(slots=True)
class Call:
    """One planned collective: what to run and how to finish its result.

    ``body(channel)`` runs the algorithm; ``post(value)`` (after the operation
    closed) turns the body's value into the call's result; ``group``/``seq``/
    ``members`` are set for point-to-point messages (their own sequences).
    """

    name: str
    fp: str
    body: Body
    post: Callable[[Any], Any] | None = None
    group: str | None = None
    seq: int | None = None
    members: tuple[int, ...] | None = None
    #: world rank -> the rank errors name (point-to-point: the communicator's ranks)
    labels: dict[int, int] | None = None
    choice: Choice | None = None  # what the plan chose (algorithm, segment, prediction)
    #: what the call ran, asked once it has run, when the plan could not know it (a
    #: broadcast's size and a ``sized`` broadcast's shape: only its root chooses); default ``choice``
    ran: Callable[[], Choice | None] | None = None
    #: a tolerant operation's hook for a missing member (a partial all_reduce:
    #: :attr:`netcoll.operation.Operation.tolerance`); its failures are this rank's alone
    tolerance: Callable[[int], None] | None = None
    waits: asyncio.Future[Any] | None = None  # deferred: ``rebuild(call)`` plans it once this is done
    rebuild: Callable[[Call], None] | None = None


def check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not float(timeout) > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


class Engine:
    """Sequencing and the per-operation driver of one group.

    Attributes:
        mesh: the process's mesh.
        group: the group's name; members: its world ranks; rank/world_size: ours / its size.
        timeout: the default deadline; segment_bytes: the message segment size.
    """

    def __init__(
        self,
        mesh: Mesh,
        *,
        group: str,
        members: tuple[int, ...] | None,
        timeout: float,
        segment_bytes: int | None,
    ) -> None:
        self.mesh = mesh
        self.group = group
        self.members = tuple(members) if members is not None else tuple(range(mesh.size))
        self.rank = self.members.index(mesh.rank)
        #: world rank -> its rank in this group (how a point-to-point message's errors name ranks)
        self.rank_labels = {w: r for r, w in enumerate(self.members)}
        self.world_size = len(self.members)
        self.timeout = check_timeout(timeout)
        self.segment_bytes = segment_bytes or algorithms.DEFAULT_SEGMENT_BYTES
        self.closed = False
        self.seq = 0
        self.p2p_seq: dict[str, int] = {}
        self.running: set[asyncio.Task[None]] = set()
        self.fps: dict[tuple[Any, ...], str] = {}  # hot calls' fingerprints, by their arguments
        self.slow_op_s = observe.slow_op_s()
        self._durations = observe.DURATIONS.observe
        # the cost model (selection.tuner): a user's segment size is kept; NETCOLL_ALGO checked now
        self.fixed_segment = segment_bytes is not None
        self.overrides = selection.overrides_from_env()
        resultpool.RESULTS.configure(resultpool.keep_from_env())
        self.tuner = selection.Tuner()
        # what links the members and how crowded their hosts are (agreed when the world formed:
        # Communicator.agree_links), for the table
        self.medium = selection.media.medium(mesh.layout, self.members)
        self.ranks_per_core = selection.media.ranks_per_core(mesh.layout, self.members)
        self.hosts = selection.media.hosts(mesh.layout, self.members)
        self.choice: Choice | None = None  # the last plan's choice (read by the Communicator)
        self.plan_version: Version | None = None  # a deferred call's parameters, while it is planned
        self.deadlines = Deadlines()  # one timer for the running operations' deadlines
        self.deadlines.told = self._told  # (what the slow warnings follow the wait chain with)
        self.deadlines.notes = self.notes
        #: after a timeout, how long to listen for the other ranks' reports at most (None:
        #: TIMEOUT_GRACE, at most a tenth of the timeout); it ends once the chain is whole
        self.timeout_grace: float | None = None

    def remember_fp(self, key: tuple[Any, ...], fp: str) -> str:
        if len(self.fps) >= 256:
            self.fps.clear()
        self.fps[key] = fp
        return fp

    # -- issuing ---------------------------------------------------------------------
    def issue(self, call: Call, timeout: float | None) -> Work:
        """Take the call's sequence number now and start running it: inline in
        the task that awaits the Work first, if that happens before the loop's
        next iteration (``await comm.all_reduce(x)``: no task of its own), else
        in a task of its own (Works kept and awaited later, or never). A call
        deferred for parameters still being agreed (``call.waits``) is planned
        and started once they are; the calls behind it need not wait for it
        (operations may open in any order: the mailbox records which finished)."""
        if self.closed:
            raise CommunicatorClosed(f"the communicator of group {self.group!r} is closed")
        limit = self.timeout if timeout is None else check_timeout(timeout)
        if call.seq is None:
            call.seq, self.seq = self.seq, self.seq + 1
        work = Work(call.name, call.seq, loop=asyncio.get_running_loop())
        waits = call.waits
        if waits is None or waits.done():
            self._arm(work, call, limit, at_once=False)
        else:
            waits.add_done_callback(lambda _: self._arm(work, call, limit, at_once=True))
        return work

    def _arm(self, work: Work, call: Call, limit: float, *, at_once: bool) -> None:
        """Plan a deferred call now (its parameters are agreed), then start it:
        ``at_once``, in a task made now; else on the loop's next iteration, unless a
        task awaits the Work first and runs it inline."""
        rebuild, call.rebuild = call.rebuild, None
        if rebuild is not None:
            try:
                rebuild(call)
            except Exception as exc:  # noqa: BLE001 - the operation fails with it, on every rank
                call.body = functools.partial(_raising, exc)
        work._drive = functools.partial(self._drive, work, call, limit)
        if at_once:
            self._start(work)
        else:
            work.get_loop().call_soon(self._start, work)

    def _start(self, work: Work) -> None:
        drive = work._drive
        if drive is None:  # claimed by an awaiting task already
            return
        work._drive = None
        task = work.get_loop().create_task(drive())
        work._driver = task
        self.running.add(task)

    # -- driving ---------------------------------------------------------------------
    async def _drive(self, work: Work, call: Call, limit: float) -> None:
        """Run ``call`` as operation (group, seq) under one deadline and hand
        its outcome to ``work``."""
        mailbox = self.mesh.mailbox
        assert call.seq is not None  # set by issue()
        op = mailbox.open(
            call.group or self.group,
            call.seq,
            call.fp,
            call.members or self.members,
            call.name,
            work.get_loop(),
            call.labels,
            call.tolerance,
        )
        work.op = op
        driver = asyncio.current_task() if log.isEnabledFor(logging.DEBUG) else None
        if driver is not None:  # per-operation detail: every line logged while it runs names it
            OPERATIONS[driver] = (call.name, call.seq, self.mesh.rank)
        start = op.opened  # observe.now() when the operation opened
        try:
            value = await self._run(op, work, call.body, limit)
            if call.post is not None:
                value = call.post(value)
        except asyncio.CancelledError:
            raise  # the awaiting task (or the loop) was cancelled: the peers were told
        except BaseException as exc:  # noqa: BLE001 - handed to the Work
            if not work.done():
                work.set_exception(exc)
        else:
            if not work.done():
                work.set_result(value)
        finally:
            mailbox.close(op)
            if work._driver is not None:
                self.running.discard(work._driver)
            seconds = observe.now() - start
            chosen = call.choice if call.ran is None else call.ran()
            if chosen is not None and op.failure is None:
                self.tuner.learn(chosen, seconds, self.world_size)
            if op.failure is None and driver is None and seconds <= self.slow_op_s and observe.TRACE.get() is None:
                self._durations(call.name, call.fp, seconds)  # the usual case; its count is the "ok" outcome
            else:
                self._observe(op, call, start, seconds, chosen)
            if driver is not None:
                OPERATIONS.pop(driver, None)

    def _observe(self, op: Operation, call: Call, start: float, seconds: float, chosen: Choice | None) -> None:
        """Record how the operation ended (metrics, a traced job's span); log a slow or failed one
        (``chosen``: what it ran, for its DEBUG line)."""
        trace = observe.TRACE.get()
        if trace is not None:
            outcome = "ok" if op.failure is None else op.failure.reason.value
            args = {"fp": call.fp, "outcome": outcome}
            trace.add(f"{call.name} #{call.seq}", "operations", start, start + seconds, args)
        if op.failure is None:
            self._durations(call.name, call.fp, seconds)  # its count is the "ok" outcome
            if seconds > self.slow_op_s:
                log.info("slow operation: %s finished after %.3fs", op.where(), seconds, extra=self._extra(call))
            elif log.isEnabledFor(logging.DEBUG):
                log.debug("%s done in %.6fs%s", op.where(), seconds, describe(chosen), extra=self._extra(call))
            return
        observe.count(call.name, op.failure.reason.value)
        # told by another rank (which logged it itself), or cancelled here: INFO; the rest, WARNING
        level = logging.INFO if op.failure.reason in (Reason.CANCELLED, Reason.ABORTED) else logging.WARNING
        if log.isEnabledFor(level):
            message = escape(detail(op.failure.message, op.where()), 500)
            log.log(level, "%s failed after %.3fs: %s", op.where(), seconds, message, extra=self._extra(call))

    def _extra(self, call: Call) -> dict[str, Any]:
        assert call.seq is not None
        return op_extra(call.name, call.seq, self.mesh.rank)

    async def _run(self, op: Operation, work: Work, body: Body, limit: float) -> Any:
        if work.cancelled():  # cancelled before it started (the first cause, if it was closed since)
            op.fail(self._cancelled(op))
        elif self.closed:
            op.fail_with(Reason.CLOSED, f"{op.where()} not started: the communicator is closed")
        if op.failure is None:
            loop = work.get_loop()
            task = asyncio.current_task(loop)
            assert task is not None
            work._driver = task
            deadline = self.deadlines.start(task, op, limit, self.slow_op_s, self.mesh.rank)
            try:
                try:
                    return await body(Channel(self.mesh, op))
                finally:
                    deadline.cancel()
            except asyncio.CancelledError:
                if not deadline.expired or task.uncancel() > deadline.cancelling:
                    # cancelled: the Work, the task awaiting it, or the loop shutting down
                    if work._cancelling:  # work.cancel(): the task that ran it was not cancelled itself
                        task.uncancel()
                    op.fail(self._cancelled(op))
                    await self._abort(op)
                    if not work.done():
                        asyncio.Future.cancel(work)
                    raise
                await self._time_out(op, limit)
            except Exception as exc:  # noqa: BLE001 - typed here; a bug in an algorithm still fails cleanly
                _fail_from(op, exc, op.me(self.mesh.rank))
        # failed: at open (dead peer, early abort, mismatch), in the body, or on the deadline
        self._explain_told(op)
        await self._abort(op)
        raise op.error  # type: ignore[misc]

    def _explain_told(self, op: Operation) -> None:
        """A peer's timeout failed ``op`` while this rank waited in it: follow the chain
        from this rank's own wait with what is known now (the peer's report, the waits
        heard, the board's notes), so this rank's error too names what is stuck (it may
        be the one that is seen first, the others still in their grace)."""
        failure = op.failure
        if failure is None or failure.reason is not Reason.ABORTED or not failure.waiting:
            return
        me = op.me(self.mesh.rank)
        text = waits.explain(me, [*failure.waits, *self._told(op, me)]).text(notes=self.notes(op))
        if text:
            op.failure = dataclasses.replace(failure, message=f"{failure.message}; {text}")
            op.error = op.failure.error(op)

    def _cancelled(self, op: Operation) -> Failure:
        me = op.me(self.mesh.rank)
        return Failure(Reason.CANCELLED, f"{op.where()} was cancelled on rank {me}", (me,))

    async def _time_out(self, op: Operation, limit: float) -> None:
        """Fail ``op`` on its deadline, tell the peers (with what we waited for),
        and listen briefly for theirs, so the error follows the wait chain to its
        end (a cycle: a deadlock; else the ranks that never delivered) rather than
        naming just our neighbour."""
        me, waiting = op.me(self.mesh.rank), tuple(op.waiting_for())
        op.fail_with(
            Reason.TIMEOUT,
            f"{op.where()} timed out after {waits.seconds(limit)}s on rank {me}: waiting for "
            f"{_ranks(waiting) or 'peers to read (send blocked)'}",
            waiting,
        )
        await self._abort(op)
        if not waiting:
            await asyncio.sleep(self._grace(limit))  # (the peers learn of it; nothing to follow)
            return
        blocked = op.blocked
        own = waits.Wait(me, op.short(), waiting, *((blocked[1], blocked[2]) if blocked else (None, None)))
        end = observe.now() + self._grace(limit)
        while True:  # peers' own timeouts (and answers) arrive as reports: until the chain is whole
            told = self._told(op, me)
            found = waits.explain(me, [own, *told])
            if not found.ends or observe.now() >= end:
                break
            await asyncio.sleep(min(GRACE_STEP, max(end - observe.now(), 0.0)))
        message = f"{op.error}; {found.text(notes=self.notes(op))}"
        op.failure = Failure(Reason.TIMEOUT, message, tuple(found.ends) or waiting, told=True, waits=(own, *told))
        op.error = op.failure.error(op)

    def _grace(self, limit: float) -> float:
        return self.timeout_grace if self.timeout_grace is not None else min(TIMEOUT_GRACE, limit / 10)

    def notes(self, op: Operation) -> dict[int, str]:
        """What the coordinator's board said, while ``op`` ran, of ranks stuck in nothing
        ("has not called it: idle after #0; ..."), by the ranks ``op`` names."""
        return {op.me(world): why for world, why in self.mesh.answers.notes_since(op.opened).items()}

    def _told(self, op: Operation, me: int) -> list[waits.Wait]:
        """What the other ranks said they wait for while ``op`` ran: their timeout reports
        for it, else the last wait heard from them (a timeout or an answer elsewhere)."""
        told = dict(op.reports or {})
        for world, wait in self.mesh.answers.recent(op.opened).items():
            r = op.me(world)
            if r != me and r not in told:
                told[r] = op.told_wait(r, {"w": wait})
        return list(told.values())

    async def _abort(self, op: Operation) -> None:
        """Tell the other members how ``op`` failed here (unless they told us)."""
        failure = op.failure
        assert failure is not None
        if op.tolerance is not None and failure.reason is not Reason.CANCELLED:
            return  # a tolerant operation's failure is this rank's alone: the others go on without it
        if failure.waiting:  # a peer timed out; tell everyone whom *we* were waiting for
            await self.mesh.abort(
                op,
                Reason.TIMEOUT.value,
                f"rank {op.me(self.mesh.rank)} was waiting for {_ranks(failure.waiting)}",
                failure.waiting,
                op.wait_field(),
            )
        if failure.told:
            return
        wait = op.wait_field() if failure.reason is Reason.TIMEOUT else None
        await self.mesh.abort(op, failure.reason.value, failure.message, failure.ranks, wait)
        op.failure = Failure(failure.reason, failure.message, failure.ranks, told=True)


async def _raising(exc: BaseException, ch: Any) -> Any:
    """An operation body that fails with ``exc`` (a deferred call that could not be planned)."""
    raise exc


def _fail_from(op: Operation, exc: Exception, me: int) -> None:
    """Fail ``op`` for an exception its body raised. A typed error (or a
    ValueError/TypeError about the arguments) reaches the user as raised;
    anything else is a bug in an algorithm, reported as a CollectiveError."""
    if isinstance(exc, CollectiveError):
        reason = exc.reason if isinstance(exc.reason, Reason) else _REASON_OF_CLASS.get(type(exc), Reason.ERROR)
        failure = Failure(reason, str(exc), exc.ranks)
    elif isinstance(exc, (ValueError, TypeError)):
        failure = Failure(Reason.ERROR, f"{op.where()} failed on rank {me}: {exc}")
    else:
        op.fail_with(Reason.ERROR, f"{op.where()} failed on rank {me}: {type(exc).__name__}: {exc}")
        return
    if op.fail(failure):
        if isinstance(exc, CollectiveError):
            exc.reason = failure.reason
        op.error = exc


_REASON_OF_CLASS: dict[type, Reason] = {cls: reason for reason, cls in ERROR_CLASSES.items()}

__all__ = ["DEFAULT_TIMEOUT", "TIMEOUT_GRACE", "Call", "Engine", "check_timeout"]
