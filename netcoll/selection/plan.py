"""The one entry point of a call's plan: :func:`select`, the algorithm and segment size
a collective runs, and what it leaves for the engine's stats and the tuner.

The plan helpers take the communicator's engine as a :class:`Planning`: the
selection state it holds (overrides, the agreed links, the :class:`~.tuner.Tuner`)
and the call's sequence number, so this package sits below the engine.
"""

from __future__ import annotations

from typing import Protocol

from ..algorithms import ALGORITHMS
from .auto import SIZE_UNKNOWN, broadcast_shape, decide
from .cost import Params
from .tuner import ROOT_SIZED, Choice, Pending, Tuner, Version


class Planning(Protocol):
    """What :func:`select` reads and writes on the engine (:class:`netcoll.engine.Engine`)."""

    overrides: dict[str, str]
    segment_bytes: int
    fixed_segment: bool
    world_size: int
    seq: int
    medium: str | None
    ranks_per_core: float | None
    tuner: Tuner
    choice: Choice | None
    plan_version: Version | None


def select(e: Planning, name: str, algorithm: str, nbytes: int) -> tuple[str, int]:
    """The algorithm and segment size to run. ``"auto"``: ``NETCOLL_ALGO``'s
    choice for the collective if it names one, else the cost model with the
    group's agreed parameters for this call's sequence number (the table, by
    the group's agreed links and hosts, before they are known). Raises
    :class:`~.tuner.Pending` when those parameters are
    still being agreed (the Communicator defers the call). Leaves the choice
    in ``e.choice`` for the engine's stats, and what ``"auto"`` was asked to
    choose for in ``e.tuner.asked`` (known before the parameters, so the same
    on every rank: :meth:`Tuner.trial_due`)."""
    table = ALGORITHMS[name]
    if algorithm == "auto":
        algorithm = e.overrides.get(name, "auto")
    elif algorithm not in table:
        raise ValueError(f"{name} has no algorithm {algorithm!r}; choose one of {', '.join(['auto', *sorted(table)])}")
    seg, predicted = e.segment_bytes, None
    if algorithm == "auto":
        if name not in SIZE_UNKNOWN:  # the model chooses (once agreed)
            e.tuner.asked = (name, nbytes)
        elif name == "broadcast" and e.world_size >= 3:  # its root does (sized), by size unknown here
            e.tuner.asked = (name, ROOT_SIZED)
        try:  # (a group of one chooses nothing: it never waits for parameters)
            params = None if e.world_size < 2 else agreed(e)
        except Pending as pending:
            pending.name = name
            raise
        fixed = e.segment_bytes if e.fixed_segment else None
        algorithm, chosen, predicted = decide(name, nbytes, e.world_size, params, fixed, e.medium, e.ranks_per_core)
        seg = chosen or seg
    e.choice = (name, algorithm, nbytes, seg, predicted)
    return algorithm, seg


def weights(e: Planning, name: str) -> tuple[float, ...] | None:
    """The group's agreed per-rank rates for a weighted call being planned (None: not
    measured, or the model is off: equal shares). The same on every rank: the
    parameters of the call's sequence number. Raises :class:`Pending` (for ``name``)."""
    if e.world_size < 2:
        return None
    try:
        params = agreed(e)
    except Pending as pending:
        pending.name = name
        raise
    return params.rates if params is not None and len(params.rates) == e.world_size else None


def agreed(e: Planning) -> Params | None:
    """The agreed parameters of the call being planned: those for the next sequence number,
    or, for a deferred call, those it waited for. Raises :class:`Pending`."""
    if e.plan_version is not None:
        return e.tuner.params_of(e.plan_version)
    return e.tuner.params_at(e.seq)


def root_shape(e: Planning, nbytes: int) -> tuple[str, float | None]:
    """A ``sized`` broadcast's root: ``("ring", predicted)`` for the chain or ``("tree", ...)``
    for ``nbytes`` (the cost model with the group's agreed parameters for this call, and the
    broadcasts it measured; else the table)."""
    params = agreed(e)
    return broadcast_shape(nbytes, e.world_size, params, e.segment_bytes, e.medium)


__all__ = ["Planning", "agreed", "root_shape", "select", "weights"]
