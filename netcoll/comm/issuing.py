"""How a :class:`~netcoll.comm.Communicator` method turns a plan into an
issued :class:`~netcoll.operation.Work`: the base class of the method groups
(:mod:`.reducing`, :mod:`.gathering`, :mod:`.moving`, :mod:`.p2p`).

A plan (:mod:`netcoll.calls`) checks the arguments and says what to run;
:meth:`Issuing._plan` issues it on the engine (its sequence number taken at
the call), or, when the cost model's parameters for this call are still being
agreed, issues it now and plans it once they are. Torch tensors in give torch
tensors out (:func:`torch_out`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..algorithms.tuning import TRIAL_LAG, Pending
from ..calls import tune
from ..calls._common import Done, Plan
from ..engine import Call, Engine
from ..operation import Work
from ..tensors import TorchIO

log = logging.getLogger("netcoll.comm")


class Issuing:
    """The engine of one group and the path every collective takes to it."""

    _engine: Engine

    def _issue(self, plan: Plan, timeout: float | None, io: TorchIO | None = None) -> Work:
        torch_out(plan, io)
        if isinstance(plan, Done):
            return Work.completed(getattr(plan, "name", "local"), plan.value)
        return self._engine.issue(plan, timeout)

    def _plan(self, make: Callable[[Engine], Plan], timeout: float | None, io: TorchIO | None = None) -> Work:
        """Plan and issue a collective; a call whose cost-model parameters are still
        being agreed is issued now (its sequence number) and planned once they are."""
        e = self._engine
        e.choice, e.tuner.asked = None, None
        try:
            plan = make(e)
        except Pending as pending:
            plan = Call(pending.name, "", _never, waits=pending.future, rebuild=self._rebuilder(make, io))
            io = None
        if isinstance(plan, Done):
            return self._issue(plan, timeout, io)
        if plan.rebuild is None:
            plan.choice = e.choice
        work = self._issue(plan, timeout, io)
        tuner = e.tuner
        tuner.collectives += 1
        if tuner.due():
            self._model_op(tune.refine(e), e.seq + tuner.lag)
        elif trial := tuner.trial_due():  # the times of this size band's trial so far, agreed soon
            self._model_op(tune.refine(e, trial, after=[work]), e.seq + TRIAL_LAG)
        return work

    def _rebuilder(self, make: Callable[[Engine], Plan], io: TorchIO | None) -> Callable[[Call], None]:
        e = self._engine

        def rebuild(call: Call) -> None:
            e.plan_seq, e.choice = call.seq, None
            try:
                plan = make(e)
            finally:
                e.plan_seq = None
            assert isinstance(plan, Call)  # deferred: a group of 2+ ranks
            torch_out(plan, io)
            call.fp, call.body, call.post, call.choice, call.ran = plan.fp, plan.body, plan.post, e.choice, plan.ran

        return rebuild

    def _model_op(self, call: Call, start: int) -> Work:
        """Issue a model operation whose parameters apply from sequence number ``start``."""
        work = self._engine.issue(call, None)
        work.add_done_callback(log_model)
        self._engine.tuner.add(start, work)
        return work


def torch_out(plan: Plan, io: TorchIO | None) -> None:
    """torch tensors in: torch tensors out."""
    if io is None:
        return
    if isinstance(plan, Done):
        plan.value = io.result(plan.value)
    else:
        post = plan.post
        plan.post = io.result if post is None else lambda value: io.result(post(value))


async def _never(ch: Any) -> None:
    raise AssertionError("a deferred call ran before it was planned")


def log_model(work: Work) -> None:
    """A model operation ended: its new parameters, or why the old ones stay."""
    if work.cancelled():
        return
    exc = work.exception()
    if exc is not None:
        log.warning("%s #%s failed; the previous cost-model parameters stay: %s", work.name, work.seq, exc)
    elif work.result() is not None:
        log.info("%s #%s: cost-model parameters %s", work.name, work.seq, work.result())


__all__ = ["Issuing", "log_model", "torch_out"]
