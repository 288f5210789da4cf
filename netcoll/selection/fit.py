"""How cost-model parameters are fitted to measured times and combined over a group.

* :func:`fit` — robust least squares of :class:`~.cost.Params` from
  ``(terms, seconds)`` samples: relative errors (a 1 µs call counts as much as
  a 1 s one), a ridge pull toward a prior (so a parameter the samples say
  nothing about stays put), every result clamped to :data:`~.cost.BOUNDS`;
  never NaN, never negative.
* :func:`fit_factors` — each algorithm's efficiency factors from its calls' samples.
* :func:`combine` — the group's parameters from every rank's estimate: the
  maximum (calibration: the slowest link sets the pace) or the median
  (refinement: robust to one noisy rank), rounded to 3 significant digits.
  Every rank combines the same gathered table, so every rank gets the same.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np

from .cost import BANDS, BOUNDS, PAIR_INDEX, PAIRS, Params, Terms, split_cost

#: one finished call: (collective, algorithm, terms, seconds)
Sample = tuple[str, str, Terms, float]

#: the ridge weight of the prior, per parameter (relative units)
PRIOR_WEIGHT: Final = 0.05
#: the length of :meth:`Params.row`
ROW: Final = len(BOUNDS) + 2 * len(PAIRS) + len(PAIRS) * BANDS


def _ridge(rows: Iterable[tuple[Sequence[float], float]], prior: np.ndarray, weight: float) -> np.ndarray:
    """``x`` minimising ``sum(((t - c.x) / t)^2) + weight * sum(((x - prior) / prior)^2)``
    over ``(c, t)`` rows (relative errors; the prior where the rows say nothing)."""
    pairs = list(rows)
    if not pairs:
        return prior
    c = np.array([c_ for c_, _ in pairs], dtype=np.float64).reshape(len(pairs), prior.size)
    t = np.array([seconds for _, seconds in pairs], dtype=np.float64)
    return _ridge_arrays(c, t, prior, weight)


def _ridge_arrays(c: np.ndarray, t: np.ndarray, prior: np.ndarray, weight: float) -> np.ndarray:
    """:func:`_ridge` of rows ``c`` (one per sample) and seconds ``t``, in whole arrays
    (a refinement fits hundreds of samples while the group waits for it)."""
    keep = np.isfinite(t) & (t > 0) & np.all(np.isfinite(c), axis=1) & np.any(c != 0, axis=1)
    c, t = c[keep], t[keep]
    if not t.size:
        return prior
    a = np.vstack([c * prior / t[:, None], math.sqrt(weight) * np.eye(prior.size)])
    b = np.concatenate([(t - c @ prior) / t, np.zeros(prior.size)])
    try:
        u = np.linalg.lstsq(a, b, rcond=None)[0]
    except np.linalg.LinAlgError:
        return prior
    x = prior * (1.0 + u)
    return x if np.all(np.isfinite(x)) else prior


def fit(samples: Iterable[tuple[Sequence[float], float]], prior: Params, weight: float = PRIOR_WEIGHT) -> Params:
    """Least-squares alpha, overhead, beta, gamma from ``(terms, seconds)`` samples
    (see the module docstring); ``prior``'s factors are kept."""
    x = _ridge(samples, np.array(prior.vector(), dtype=np.float64), weight)
    return Params.of((float(v) for v in x), prior.factors)


def fit_factors(samples: Iterable[Sample], params: Params, weight: float = PRIOR_WEIGHT) -> Params:
    """``params`` with each algorithm's two factors fitted from its samples
    ``(collective, algorithm, terms, seconds)``: ``seconds ~ f_lat * latency +
    f_bw * bandwidth`` (:func:`~.cost.split_cost`), pulled toward the current
    factors; algorithms without samples keep theirs."""
    by_pair: dict[tuple[str, str], tuple[list[Terms], list[float]]] = {}
    for coll, algo, t, seconds in samples:
        got = by_pair.setdefault((coll, algo), ([], []))
        got[0].append(t)
        got[1].append(seconds)
    factors = params.row()[len(BOUNDS) : len(BOUNDS) + 2 * len(PAIRS)]
    for pair, (ts, secs) in by_pair.items():
        columns = list(np.array(ts, dtype=np.float64).T)  # one per term: every sample's parts at once
        parts = np.stack(split_cost(columns, params), axis=1)
        i = 2 * PAIR_INDEX[pair]
        prior = np.array(factors[i : i + 2], dtype=np.float64)
        factors[i : i + 2] = (float(v) for v in _ridge_arrays(parts, np.array(secs), prior, weight))
    return dataclasses.replace(Params.of(params.vector(), factors), measured=params.measured, rates=params.rates)


def _round3(v: float) -> float:
    return float(f"{v:.3g}")


def combine(table: Sequence[Sequence[float]], how: str) -> Params:
    """The group's :class:`Params` from one :meth:`Params.row` per rank: alpha,
    overhead, beta, gamma by ``how`` (``"max"`` or ``"median"``) per column, the
    factors by the median, a measured time by the median of the ranks that
    have one (none unless at least half do); each clamped and rounded to 3
    significant digits (a pure function of the table, so the same on every rank).
    A row may end with one more number, the rank's own bandwidth (:func:`with_rate`):
    kept per rank as :attr:`Params.rates` (rounded; none unless every rank has one)."""
    cols = np.array(table, dtype=np.float64)
    cols = np.where(np.isfinite(cols), cols, 0.0)  # clamped to the lower bound below
    rates: tuple[float, ...] = ()
    if cols.ndim == 2 and cols.shape[1] == ROW + 1:
        column, cols = cols[:, -1], cols[:, :-1]
        rates = tuple(_round3(float(v)) for v in column) if bool(np.all(column > 0)) else ()
    return dataclasses.replace(_combined(cols, how), rates=rates)


def with_rate(params: Params, rate: float) -> list[float]:
    """``params``' row with this rank's bandwidth after it (0: not measured)."""
    return [*params.row(), float(rate) if math.isfinite(rate) and rate > 0 else 0.0]


def _combined(cols: np.ndarray, how: str) -> Params:
    k, f = len(BOUNDS), 2 * len(PAIRS)
    if how == "max":
        head = cols[:, :k].max(axis=0)
    elif how == "median":
        head = np.median(cols[:, :k], axis=0)
    else:
        raise ValueError(f"combine: how must be 'max' or 'median', got {how!r}")
    tail = np.median(cols[:, k : k + f], axis=0) if cols.shape[1] > k else np.zeros(0)
    physical = (_round3(_c(n, float(v))) for n, v in zip(BOUNDS, head, strict=True))
    factors = (_round3(float(v)) if v > 0 else 1.0 for v in tail)
    return Params.of(physical, factors, _measured(cols[:, k + f :]))


def _measured(cols: np.ndarray) -> list[float]:
    """Per column, the median of the positive entries when at least half the rows have one, else 0."""
    out = [0.0] * cols.shape[1]
    if cols.size == 0:
        return out
    have = cols > 0
    for j in np.flatnonzero(have.sum(axis=0) * 2 >= cols.shape[0]):
        out[j] = _round3(float(np.median(cols[have[:, j], j])))
    return out


def _c(name: str, v: float) -> float:
    lo, hi = BOUNDS[name]
    return lo if not math.isfinite(v) else min(hi, max(lo, v))


__all__ = ["PRIOR_WEIGHT", "ROW", "Sample", "combine", "fit", "fit_factors", "with_rate"]
