"""Plans of the algorithm choice's own operations: the agreement on link kinds
and hosts and the calibration when a group forms, and refinement from traffic
(see :mod:`netcoll.selection.media` and :mod:`netcoll.selection.tuner`).

All run as ordinary operations (deadlines, aborts, typed errors) numbered
apart from the collectives (groups ``<group>/links`` and, for the cost
model's, ``<group>/cost``), so they do not shift any collective's sequence
number, and all end with every rank holding the same table, one row per rank.
The agreement's table becomes the mesh's
:class:`~netcoll.selection.media.Layout` before any collective is issued
(:func:`netcoll.comm.form_group`). The cost model's rows are estimates, which
every rank combines the same way. The result becomes a new
version of the group's parameters applying from a sequence number fixed when
the operation is issued; a collective that needs a version still being agreed
waits for it (:class:`~netcoll.selection.tuner.Pending`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from ..engine import Call, Engine
from ..mesh.channel import Channel
from ..selection import cost, decide, fit, media, probe

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
        lambda table: table if isinstance(table, cost.Params) else fit.combine(table, how),
        group=f"{e.group}/cost",
        seq=seq,
        members=e.members,
    )


def agree_links(e: Engine) -> Call:
    """Every rank's row — its link kinds (:func:`~netcoll.selection.media.row`)
    and host (:func:`~netcoll.selection.media.host_fields`) — exchanged so that
    every rank holds the same :class:`~netcoll.selection.media.Layout`; the
    result sets the mesh's ``layout`` and this group's medium, ranks per
    core and hosts, and is the medium. The world group only (the Communicator checks);
    numbered apart (group ``<group>/links``)."""
    kinds = media.row({peer: stats.kind for peer, stats in e.mesh.link_stats().items()}, e.mesh.size)
    mine = np.concatenate([kinds.astype(np.float64), media.host_fields()])

    async def body(ch: Channel) -> np.ndarray:
        return await probe.exchange(ch, mine)

    def post(table: np.ndarray) -> str | None:
        layout = media.Layout.of(table)
        e.mesh.layout = layout
        e.medium = media.medium(layout, e.members)
        e.ranks_per_core = media.ranks_per_core(layout, e.members)
        e.hosts = media.hosts(layout, e.members)
        return e.medium

    return Call("agree_links", "agree_links(links=1)", body, post, group=f"{e.group}/links", seq=0, members=e.members)


def calibrate(e: Engine) -> Call:
    """Measure the links (a ring shift of a small, a mid and a large payload and
    bursts of small messages: :func:`netcoll.selection.probe.probe`) and the
    local reduction bandwidth, fit each rank's estimate, and agree on the
    maximum of every parameter over the group (the slowest link sets the pace); and
    each rank's own bandwidth (:func:`netcoll.selection.probe.rate`), kept per rank
    (:attr:`~netcoll.selection.cost.Params.rates`: the weighted all_reduce's shares)."""
    e.tuner.active = True

    async def body(ch: Channel) -> np.ndarray:
        samples = await probe.probe(ch)
        own = await probe.rate(ch)
        samples += probe.reduce_samples()
        local = fit.fit(samples, cost.DEFAULT_PARAMS, CALIBRATE_WEIGHT)
        return await probe.exchange(ch, np.array(fit.with_rate(local, own), np.float64))

    return _model_call(e, "calibrate", body, "max")


def refine(e: Engine, trial: tuple[str, int, bool] | None = None, after: Sequence[asyncio.Future[Any]] = ()) -> Call:
    """Fit each rank's efficiency factors of the algorithms it ran since the last
    refinement (their ``terms`` and measured times; alpha, overhead, beta and
    gamma stay as calibrated), with the current factors as the prior, take its
    measured time per algorithm and size band, and agree on the median of
    every number over the group.

    ``trial``: ``(collective, nbytes, again)``, a size band's agreement of
    measured times only (:meth:`~netcoll.selection.tuner.Tuner.trial_due`),
    after the collectives ``after`` (awaited first, whatever their outcome).
    Unless ``again`` (a re-measure), it exchanges nothing, and keeps the
    parameters as they are, when no algorithm is on trial there
    (:func:`on_trial`): every rank decides that alike, from the parameters
    every earlier agreement left."""
    tuner = e.tuner
    earlier = [*tuner.pending(), *after]  # issued before this one: their factors are this one's prior
    fixed = e.segment_bytes if e.fixed_segment else None

    async def body(ch: Channel) -> np.ndarray | cost.Params:
        if earlier:
            await asyncio.wait(earlier)
        local = tuner.current() or cost.DEFAULT_PARAMS
        if trial is not None and not (trial[2] or on_trial(local, *trial[:2], ch.size, fixed)):
            return local
        if trial is None:
            local = fit.fit_factors(list(tuner.samples), local)
            tuner.samples.clear()  # the next refinement learns from the calls after this one
        local = dataclasses.replace(local, measured=tuner.measured())
        own = local.rates[ch.rank] if len(local.rates) == ch.size else 0.0  # kept as calibrated
        tuner.agreeing += 1
        try:
            return await probe.exchange(ch, np.array(fit.with_rate(local, own), np.float64))
        finally:
            tuner.agreeing -= 1
            tuner.agreed_at = time.perf_counter()

    return _model_call(e, "refine", body, "median")


def on_trial(params: cost.Params, name: str, nbytes: int, size: int, segment: int | None) -> bool:
    """Whether the algorithm ``"auto"`` now runs in this size band has no agreed time yet
    (one the model does not time, the weighted all_reduce, is never on trial)."""
    algo = decide(name, nbytes, size, params, segment)[0]
    return algo in cost.FORMULAS[name] and params.seen(name, algo, nbytes) is None


__all__ = ["CALIBRATE_WEIGHT", "agree_links", "calibrate", "on_trial", "refine"]
