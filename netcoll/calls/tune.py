"""Plans of the cost model's own operations: calibration when a group forms,
and refinement from traffic (see :mod:`netcoll.algorithms.tuning`).

Both run as ordinary operations (deadlines, aborts, typed errors) in the
group's *model sequence* (group ``<group>/cost``, numbered apart from the
collectives, so they do not shift any collective's sequence number), and
both end with every rank holding the same table of estimates, one row per
rank, which every rank combines the same way. The result becomes a new
version of the group's parameters applying from a sequence number fixed when
the operation is issued; a collective that needs a version still being agreed
waits for it (:class:`~netcoll.algorithms.tuning.Pending`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import numpy as np

from ..algorithms import cost, probe, tuning
from ..engine import Call, Engine
from ..transport.base import Channel

#: the prior's weight when calibrating: the probe's samples decide (the prior only
#: keeps a parameter they say nothing about finite)
CALIBRATE_WEIGHT: Final = 1e-3


def _model_call(e: Engine, name: str, body: Any, how: str) -> Call:
    seq = e.tuner.cost_seq
    e.tuner.cost_seq += 1
    return Call(
        name,
        f"{name}(model=1)",
        body,
        lambda table: tuning.combine(table, how),
        group=f"{e.group}/cost",
        seq=seq,
        members=e.members,
    )


def calibrate(e: Engine) -> Call:
    """Measure the links (a ring shift of a small, a mid and a large payload and
    bursts of small messages: :func:`netcoll.algorithms.probe.probe`) and the
    local reduction bandwidth, fit each rank's estimate, and agree on the
    maximum of every parameter over the group (the slowest link sets the pace)."""
    e.tuner.active = True

    async def body(ch: Channel) -> np.ndarray:
        samples = await probe.probe(ch)
        samples += probe.reduce_samples()
        local = tuning.fit(samples, cost.DEFAULT_PARAMS, CALIBRATE_WEIGHT)
        return await probe.exchange(ch, np.array(local.row(), np.float64))

    return _model_call(e, "calibrate", body, "max")


def refine(e: Engine) -> Call:
    """Fit each rank's efficiency factors of the algorithms it ran since the last
    refinement (their ``terms`` and measured times; alpha, overhead, beta and
    gamma stay as calibrated), with the current factors as the prior, and agree
    on the median of every number over the group."""
    tuner = e.tuner
    earlier = tuner.pending()  # issued before this one: their factors are this one's prior

    async def body(ch: Channel) -> np.ndarray:
        if earlier:
            await asyncio.wait(earlier)
        local = tuning.fit_factors(list(tuner.samples), tuner.current() or cost.DEFAULT_PARAMS)
        tuner.samples.clear()  # the next refinement learns from the calls after this one
        return await probe.exchange(ch, np.array(local.row(), np.float64))

    return _model_call(e, "refine", body, "median")


__all__ = ["CALIBRATE_WEIGHT", "calibrate", "refine"]
