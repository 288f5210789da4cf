"""When ``algorithm="auto"`` runs the weighted all_reduce (:mod:`netcoll.algorithms.weighted`):
the group measured its ranks' bandwidths (:attr:`~.cost.Params.rates`, agreed at
calibration), they are unequal enough that the weighted shares are predicted
:data:`GAIN` faster than the model's choice, and the buffer is at least
:data:`MIN_BYTES`. Otherwise the choice stays as it was.

The weighted algorithm is not one of the model's :data:`~.cost.FORMULAS`: with equal
rates it moves the ring's bytes in more messages, so the model never has a reason to
explore it; it is weighed here, after the model chose, from its own cost.
"""

from __future__ import annotations

from typing import Final

from ..algorithms.shares import Grid, ideal
from . import cost

#: how much faster (predicted) the weighted shares must be than the model's choice
GAIN: Final = 0.10
#: smaller buffers keep the model's choice: there its 2 steps alone may be predicted
#: faster than the model's choice with equal rates (a loopback-like machine, 4 ranks:
#: 20% at 256 KiB, 8% at 1 MiB), so a little noise in the rates would pick it (4 MiB: -3%)
MIN_BYTES: Final = 4 << 20


def predict(nbytes: int, world_size: int, params: cost.Params, segment: int) -> float:
    """Predicted seconds of the weighted all_reduce with ``params``' rates: 2 steps,
    ``2(P-1)`` times the messages of a fastest link about the largest share
    (:meth:`~netcoll.algorithms.shares.Grid.full_messages`),
    and the latest rank's transfers and reduction, ``max_i (N + (P-2) s_i) beta min(w)/w_i + (P-1) s_i gamma``
    (``beta`` is the slowest rank's rate: calibration agrees on the maximum; the
    shares are :func:`~netcoll.algorithms.shares.ideal`'s)."""
    p, n = world_size, float(nbytes)
    alpha, overhead, beta, gamma, _ = params.vector()
    shares = ideal(n, params.rates, p)
    w = params.rates if len(params.rates) == p and min(params.rates) > 0 else (1.0,) * p
    slow = min(w)
    segs = max(1, Grid.of(nbytes, 1, p, segment, params.rates).full_messages())
    busiest = max((n + (p - 2) * s) * beta * slow / wi + (p - 1) * s * gamma for s, wi in zip(shares, w, strict=True))
    return 2.0 * alpha + 2.0 * (p - 1) * segs * overhead + busiest


def consider(
    collective: str, nbytes: int, world_size: int, params: cost.Params, chosen: tuple[str, int, float]
) -> tuple[str, int, float]:
    """``chosen`` (the model's ``(algorithm, segment, predicted)``), or the weighted
    all_reduce at ``chosen``'s segment when it passes (see the module docstring)."""
    _, seg, predicted = chosen
    if collective != "all_reduce" or nbytes < MIN_BYTES or world_size < 3:
        return chosen
    if len(params.rates) != world_size or min(params.rates) == max(params.rates):
        return chosen
    mine = predict(nbytes, world_size, params, seg)
    return ("weighted", seg, mine) if mine < (1.0 - GAIN) * predicted else chosen


__all__ = ["GAIN", "MIN_BYTES", "consider", "predict"]
