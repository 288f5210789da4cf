"""Which algorithm a collective runs, and with what segment size.

One entry point for the calls' plans, :func:`select` (:mod:`.plan`); behind it:

* :mod:`.auto` — ``algorithm="auto"`` by the table or the cost model, a sized
  broadcast's root's shape, and the ``NETCOLL_ALGO`` overrides;
* :mod:`.table` — the measured size thresholds (docs/algorithms.md has the measurements);
* :mod:`.media` — the group's agreed link kinds and hosts (:class:`~.media.Layout`);
* :mod:`.cost` — the cost formulas and :class:`~.cost.Params`;
* :mod:`.fit` — fitting the parameters to measured times and combining them over a group;
* :mod:`.tuner` — per communicator, the agreed versions of the parameters and the trials;
* :mod:`.probe` — the link, per-rank rate and reduction measurements and the group exchange of rows;
* :mod:`.weighting` — when ``"auto"`` runs the weighted all_reduce (measured rates unequal).

The group agreements that feed them (links, calibration, refinement) are plans issued like
the collectives: :mod:`netcoll.calls.agreements`. The algorithms themselves and their
registry are :mod:`netcoll.algorithms`; nothing there imports this package.
"""

from __future__ import annotations

from . import auto, cost, fit, media, probe, table, tuner, weighting
from .auto import ALGO_ENV, SIZE_UNKNOWN, broadcast_shape, choose, decide, overrides_from_env, parse_overrides
from .plan import Planning, agreed, root_shape, select, weights
from .tuner import TRIAL_LAG, Choice, Pending, Tuner, Version, describe

__all__ = [
    "ALGO_ENV",
    "SIZE_UNKNOWN",
    "TRIAL_LAG",
    "Choice",
    "Pending",
    "Tuner",
    "Version",
    "describe",
    "Planning",
    "agreed",
    "auto",
    "broadcast_shape",
    "choose",
    "cost",
    "decide",
    "fit",
    "media",
    "overrides_from_env",
    "parse_overrides",
    "probe",
    "root_shape",
    "select",
    "table",
    "tuner",
    "weighting",
    "weights",
]
