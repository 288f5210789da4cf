"""One rank running an explorer program: issue every step in program order,
await in this rank's own order (:func:`~netcoll.testing.program.schedule`),
cancel where the program says, and check every outcome.

The rules checked (:meth:`Runner.verdict`):

* every step ends with exactly the result :mod:`.reference` computes, its
  input untouched;
* the cancelled step may instead end with ``CancelledError`` on the cancelling
  rank, and with a :class:`~netcoll.errors.CollectiveCancelled` naming the
  cancelling rank (by its rank in the step's group) on the others; never with a
  wrong value, and no other step may fail because of it.

Results that must be the same on every rank (an ``all_reduce``, bit for bit; the
parameters a ``calibrate`` agreed) leave a digest in the :class:`RankReport`, for
the world to compare across ranks.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..comm import Communicator
from ..errors import CollectiveCancelled, NetcollError
from ..operation import Work
from . import reference
from .program import Program, Step, schedule


@dataclass
class RankReport:
    """How one rank's run of a program went (JSON-able as :meth:`as_dict`)."""

    seed: int
    rank: int
    failures: list[str] = field(default_factory=list)
    digests: dict[int, str] = field(default_factory=dict)  # step -> digest of a result every rank shares
    outcomes: dict[int, str] = field(default_factory=dict)  # step -> "ok", "cancelled" or an error's class
    seconds: float = 0.0
    model_ops: int = 0  # the cost model's operations (calibrations, agreements) the world group issued meanwhile

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "rank": self.rank,
            "failures": self.failures,
            "digests": {str(k): v for k, v in self.digests.items()},
            "outcomes": {str(k): v for k, v in self.outcomes.items()},
            "seconds": round(self.seconds, 4),
            "model_ops": self.model_ops,
        }

    @classmethod
    def of(cls, d: dict[str, Any]) -> RankReport:
        return cls(
            d["seed"],
            d["rank"],
            list(d["failures"]),
            {int(k): v for k, v in d["digests"].items()},
            {int(k): v for k, v in d["outcomes"].items()},
            d["seconds"],
            d.get("model_ops", 0),
        )


class Runner:
    """One world rank's run of ``program`` on ``comm`` (the world group). ``where``
    says what it is doing now (for a hang's report)."""

    def __init__(self, comm: Communicator, program: Program) -> None:
        self.comm, self.program, self.rank = comm, program, comm.rank
        self.report = RankReport(program.seed, comm.rank)
        self.subs: dict[tuple[int, int], Communicator | None] = {}
        self.works: dict[int, Work] = {}
        self.given: dict[int, np.ndarray[Any, Any]] = {}  # inputs, to check they stay untouched
        self.outs: dict[int, np.ndarray[Any, Any] | None] = {}  # ``out=`` buffers, which must be the results
        self.awaited: set[int] = set()
        self.cancels: list[asyncio.Task[None]] = []
        self.where = "not started"

    async def run(self) -> RankReport:
        start, model_ops = time.perf_counter(), self.comm._engine.tuner.cost_seq
        self._tune(self.comm)
        try:
            for action in schedule(self.program, self.rank):
                steps = [self.program.steps[i] for i in action.together or (action.step,)]
                steps = [s for s in steps if self.program.takes_part(s, self.rank)]
                if not steps:
                    continue
                self.where = f"waiting before {action.describe()}"
                for _ in range(action.yields):
                    await asyncio.sleep(0)
                if action.sleep:
                    await asyncio.sleep(action.sleep)
                if action.verb == "issue":
                    await self._issue(steps[0])
                else:  # await; gather: each in a task of its own, at once
                    await asyncio.gather(*(self._await(s) for s in steps if s.index not in self.awaited))
            self.where = "waiting for its cancel to fire"
            await asyncio.gather(*self.cancels)
        finally:
            for task in self.cancels:
                task.cancel()
            for sub in self.subs.values():
                if sub is not None:
                    await sub.close()
        self.report.seconds = time.perf_counter() - start
        self.report.model_ops = self.comm._engine.tuner.cost_seq - model_ops
        self.where = "done"
        return self.report

    def _tune(self, comm: Communicator) -> None:
        if self.program.tuning:  # refine often: agreements, deferred calls and trials mid-program
            tuner = comm._engine.tuner
            tuner.every, tuner.lag = self.program.every, self.program.lag

    async def _group(self, step: Step) -> Communicator | None:
        """The step's communicator (a sub-group's once its split has ended here)."""
        if step.on is None:
            return self.comm
        split = self.program.steps[step.on[0]]
        if split.index not in self.awaited:
            await self._await(split)
        return self.subs.get(step.on)

    async def _issue(self, step: Step) -> None:
        self.where = f"issuing #{step.index} {step.kind}"
        comm = await self._group(step)
        if comm is None:
            self._fail(step, "not issued: its sub-group was not made")
            self.awaited.add(step.index)
            return
        try:
            self.works[step.index] = self._call(comm, step)
        except Exception as exc:  # noqa: BLE001 - reported as the failure it is
            self._fail(step, f"issuing raised {type(exc).__name__}: {exc}")
            self.awaited.add(step.index)
            return
        cancel = self.program.cancel
        if cancel is not None and cancel.step == step.index and cancel.rank == self.rank:
            work = self.works[step.index]
            if cancel.how == "task":
                self.cancels.append(asyncio.ensure_future(_cancel_awaiting(work, cancel.after)))
            elif cancel.after < 0:
                work.cancel()
            else:
                self.cancels.append(asyncio.ensure_future(_cancel_later(work, cancel.after)))

    def _call(self, comm: Communicator, step: Step) -> Work:
        work: Work = self._dispatch(comm, step)
        return work

    def _dispatch(self, comm: Communicator, step: Step) -> Any:
        g, kind, algo = comm.rank, step.kind, step.algorithm
        c: Any = comm  # the program's op, dtype and algorithm are data here, not literals
        if kind == "split":
            return comm.split(step.colors[self.rank], step.keys[self.rank])
        if kind == "calibrate":
            return comm.calibrate()
        if kind == "barrier":
            return c.barrier(algorithm=algo)
        x = None
        if reference.passes_input(step, g) and (kind != "p2p" or g == step.src):
            x = self.given[step.index] = reference.data(self.program.seed, step, self.rank)
        out = self.outs[step.index] = reference.out_buffer(step, g, len(self.program.members(step)))
        if kind == "p2p":
            return c.send(x, step.dst, step.tag) if g == step.src else c.recv(step.src, step.tag)
        z = step.compression
        if kind == "all_reduce":
            return c.all_reduce(x, step.op, out=out, algorithm=algo, compression=z)
        if kind == "reduce":
            return c.reduce(x, step.op, step.root, out=out, algorithm=algo, compression=z)
        if kind == "reduce_scatter":
            return c.reduce_scatter(x, step.op, out=out, algorithm=algo, compression=z)
        if kind == "broadcast":
            return c.broadcast(x if out is None else out, step.root, algorithm=algo, compression=z)
        if kind == "all_gather":
            return c.all_gather(x, out=out, algorithm=algo, compression=z)
        if kind in ("scatter", "gather"):
            return getattr(c, kind)(x, step.root, out=out, algorithm=algo)
        return getattr(c, kind)(x, out=out, algorithm=algo)

    async def _await(self, step: Step) -> None:
        self.awaited.add(step.index)
        work = self.works.get(step.index)
        if work is None:
            return
        self.where = f"awaiting #{step.index} {step.kind} (seq {work.seq})"
        value: Any = None
        error: BaseException | None = None
        try:
            value = await work
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this rank's run was cancelled (the world's time is up), not the Work
            error = exc
        except NetcollError as exc:
            error = exc
        self.verdict(step, value, error)

    def verdict(self, step: Step, value: Any, error: BaseException | None) -> None:
        """Check one step's outcome here (see the module docstring)."""
        i, program = step.index, self.program
        self.report.outcomes[i] = "ok" if error is None else "cancelled" if _cancelled(error) else type(error).__name__
        given = self.given.pop(i, None)
        if given is not None and not reference.untouched(program.seed, step, self.rank, given):
            self._fail(step, "its input was modified")
        cancel = program.cancel
        if error is not None:
            members = program.members(step)
            if step.kind == "p2p":
                members = (members[step.src], members[step.dst])  # the pair's ranks, by the group's
            if cancel is None or cancel.step != i:
                self._fail(step, f"failed: {type(error).__name__}: {error}")
            elif cancel.rank == self.rank and not _cancelled(error):
                self._fail(step, f"cancelled here, but ended with {type(error).__name__}: {error}")
            elif cancel.rank != self.rank and not (
                isinstance(error, CollectiveCancelled)
                and error.ranks == (program.members(step).index(cancel.rank),)
                and cancel.rank in members
            ):
                self._fail(step, f"cancelled on rank {cancel.rank}, but ended with {type(error).__name__}: {error}")
            return
        if step.kind == "split":
            self._split(step, value)
            return
        if step.kind == "calibrate":
            self.report.digests[i] = digest(repr(value).encode())
            return
        want = reference.expected(program, step, self.rank)
        wrong = reference.differs(step, value, want)
        out = self.outs.pop(i, None)
        if out is not None and want is not None and value is not out:
            self._fail(step, f"the result is not the out= buffer passed: got {type(value).__name__}")
        if wrong is not None:
            self._fail(step, f"WRONG VALUE: {wrong}")
        elif step.kind == "all_reduce":
            self.report.digests[i] = digest(value.tobytes())

    def _split(self, step: Step, sub: Any) -> None:
        color = step.colors[self.rank]
        want = reference.expected(self.program, step, self.rank)
        got = None if sub is None else (sub.rank, sub.world_size)
        if got != want:
            self._fail(step, f"split: got (rank, size) {got}, expected {want}")
            sub = None
        if color is not None:
            self.subs[(step.index, color)] = sub
            if sub is not None:
                self._tune(sub)

    def _fail(self, step: Step, what: str) -> None:
        self.report.failures.append(f"rank {self.rank}: #{step.index} {step.kind}: {what}")


def _cancelled(error: BaseException) -> bool:
    return isinstance(error, asyncio.CancelledError)


def digest(data: bytes) -> str:
    """A short digest of a result, compared across ranks."""
    return hashlib.sha1(data).hexdigest()[:16]


async def _cancel_later(work: Work, after: float) -> None:
    await _pause(after)
    work.cancel()


async def _cancel_awaiting(work: Work, after: float) -> None:
    """Cancel a task that awaits ``work`` (which cancels the Work: it aborts everywhere)."""
    waiter = asyncio.ensure_future(_awaiting(work))
    await asyncio.sleep(0)  # the waiter awaits the Work now (and runs it, if no task has yet)
    await _pause(after)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)


async def _awaiting(work: Work) -> None:
    await work


async def _pause(after: float) -> None:
    if after == 0:
        for _ in range(3):
            await asyncio.sleep(0)
    elif after > 0:
        await asyncio.sleep(after)


__all__ = ["RankReport", "Runner", "digest"]
