"""How time grows with ranks and with size, against the alpha-beta cost formulas.

Each algorithm's time for ``P`` ranks and ``n`` bytes (the row's ``size``) is modelled as
``t = a(P)·alpha + b(P, n)·beta``: ``a`` counts the dependent message steps (alpha: the per-message
latency), ``b`` the bytes on the critical path (beta: seconds per byte; it absorbs the reduction's
cost too). The formulas are those of ``docs/algorithms.md``. netcoll's rows name the algorithm
they ran (``auto:ring``); for Gloo and MPI, which pick algorithms internally, the textbook
large-message algorithm of each collective is assumed (:data:`PEER_ALGORITHM`).

alpha and beta are fitted per implementation and collective over every world size and size by least
squares on the *relative* error (each point weighs the same, 4 B or 64 MiB). Two models:

* ``alpha-beta``: the formula as it stands (dedicated cores);
* ``alpha-beta shared``: the formula × ``max(1, P / cores)``: with more rank processes than cores
  every step waits for its share of a core.

The better one (lower RMS relative error) is the one reported.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.labels import present

Terms = Callable[[int, float], tuple[float, float]]


def _log2(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def _pow2(p: int) -> tuple[int, int]:
    """(log2 P', extra steps): P' the largest power of two <= P; 2 extra steps when P != P'."""
    k = math.floor(math.log2(p)) if p > 1 else 0
    return k, (0 if (1 << k) == p else 2)


def _ring_ar(p: int, n: float) -> tuple[float, float]:
    return 2 * (p - 1), 2 * (p - 1) / p * n


def _tree_ar(p: int, n: float) -> tuple[float, float]:
    return 2 * _log2(p), 2 * _log2(p) * n


def _doubling_ar(p: int, n: float) -> tuple[float, float]:
    k, e = _pow2(p)
    return k + e, (k + e) * n


def _halving_ar(p: int, n: float) -> tuple[float, float]:
    k, e = _pow2(p)
    q = 1 << k
    return 2 * k + e, (2 * (q - 1) / q + e) * n


def _linear(p: int, n: float) -> tuple[float, float]:
    return p - 1, (p - 1) / p * n


def _bruck(p: int, n: float) -> tuple[float, float]:
    return _log2(p), (p - 1) / p * n


def _tree(p: int, n: float) -> tuple[float, float]:
    return _log2(p), _log2(p) * n


#: the Greek letters, spelled so that ruff's confusable-character check lets them be
ALPHA, BETA = "\u03b1", "\u03b2"


def _greek(text: str) -> str:
    """A formula written with A and B for alpha and beta, as printed."""
    return text.replace("A", ALPHA).replace("B", BETA)


#: (collective, algorithm) -> (formula as printed, terms)
FORMULAS: dict[tuple[str, str], tuple[str, Terms]] = {
    ("all_reduce", "ring"): (_greek("2(P-1)A + 2(P-1)/P·nB"), _ring_ar),
    ("all_reduce", "tree"): (_greek("2⌈log₂P⌉(A + nB)"), _tree_ar),
    ("all_reduce", "doubling"): (_greek("(log₂P' + e)(A + nB)"), _doubling_ar),
    ("all_reduce", "halving"): (_greek("(2log₂P' + e)A + (2(P'-1)/P' + e)nB"), _halving_ar),
    ("all_reduce", "allpairs"): (_greek("A + (P-1)nB"), lambda p, n: (1, (p - 1) * n)),
    ("all_gather", "ring"): (_greek("(P-1)A + (P-1)/P·nB"), _linear),
    ("all_gather", "doubling"): (_greek("⌈log₂P⌉A + (P-1)/P·nB"), _bruck),
    ("reduce_scatter", "ring"): (_greek("(P-1)A + (P-1)/P·nB"), _linear),
    ("all_to_all", "pairwise"): (_greek("(P-1)A + (P-1)/P·nB"), _linear),
    ("all_to_all", "linear"): (_greek("A + (P-1)/P·nB"), lambda p, n: (1, (p - 1) / p * n)),
    ("broadcast", "tree"): (_greek("⌈log₂P⌉(A + nB)"), _tree),
    ("broadcast", "ring"): (_greek("(P-1)A + nB"), lambda p, n: (p - 1, n)),
    ("reduce", "tree"): (_greek("⌈log₂P⌉(A + nB)"), _tree),
    ("reduce", "ring"): (_greek("2(P-1)A + 2(P-1)/P·nB"), _ring_ar),
    ("gather", "direct"): (_greek("(P-1)A + (P-1)/P·nB"), _linear),
    ("scatter", "direct"): (_greek("(P-1)A + (P-1)/P·nB"), _linear),
}
#: the algorithm assumed for Gloo's and MPI's rows (they do not say which they ran)
PEER_ALGORITHM = {
    "all_reduce": "ring",
    "all_gather": "ring",
    "reduce_scatter": "ring",
    "all_to_all": "pairwise",
    "broadcast": "tree",
    "reduce": "tree",
    "gather": "direct",
    "scatter": "direct",
}
#: the two models, as the report names them
PLAIN, SHARED = f"{ALPHA}-{BETA}", f"{ALPHA}-{BETA} shared"
MODELS = (PLAIN, SHARED)


def algorithm_of(row: dict[str, Any]) -> str:
    """The algorithm a row ran: ``auto:ring`` -> ``ring``; peers' rows: :data:`PEER_ALGORITHM`."""
    name = str(row.get("algorithm") or "").split(":")[-1]
    if (row["op"], name) in FORMULAS:
        return name
    return PEER_ALGORITHM[row["op"]]


def terms(row: dict[str, Any], model: str, cores: int) -> tuple[float, float]:
    """(a, b) of ``t = a·alpha + b·beta`` for this row under ``model``."""
    p = int(row["world_size"])
    a, b = FORMULAS[(row["op"], algorithm_of(row))][1](p, float(row["size"]))
    if model == SHARED:
        share = max(1.0, p / max(cores, 1))
        return a * share, b * share
    return a, b


@dataclasses.dataclass(frozen=True)
class Fit:
    model: str
    alpha: float  #: seconds per message step
    beta: float  #: seconds per byte
    rel_rms: float  #: RMS of (model - measured) / measured
    max_rel: float
    points: int

    def predict(self, row: dict[str, Any], cores: int) -> float:
        a, b = terms(row, self.model, cores)
        return a * self.alpha + b * self.beta


def least_squares(ab: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """alpha, beta >= 0 minimizing sum((a alpha + b beta - t) / t)^2."""
    w = ab / t[:, None]
    sol, *_ = np.linalg.lstsq(w, np.ones(len(t)), rcond=None)
    alpha, beta = float(sol[0]), float(sol[1])
    if alpha >= 0 and beta >= 0:
        return alpha, beta

    def one(col: int) -> tuple[float, float]:  # the best fit with only this column
        x = w[:, col]
        v = float(x.sum() / max(float((x * x).sum()), 1e-300))
        return (v, 0.0) if col == 0 else (0.0, v)

    cands = [one(0), one(1)]
    return min(cands, key=lambda c: float(((w @ np.array(c)) - 1) ** 2 @ np.ones(len(t))))


def fit(rows: list[dict[str, Any]], model: str, cores: int) -> Fit | None:
    """Fit alpha, beta to these rows (one implementation, one collective); None with fewer than 3 points."""
    pts = [r for r in rows if r["size"] > 0 and r["time_us"] > 0]
    if len(pts) < 3:
        return None
    ab = np.array([terms(r, model, cores) for r in pts], dtype=np.float64)
    t = np.array([r["time_us"] * 1e-6 for r in pts], dtype=np.float64)
    alpha, beta = least_squares(ab, t)
    rel = (ab @ np.array([alpha, beta]) - t) / t
    return Fit(model, alpha, beta, float(np.sqrt(np.mean(rel**2))), float(np.max(np.abs(rel))), len(pts))


def fit_all(runs: list[dict[str, Any]], cores: int, ops: list[str]) -> dict[tuple[str, str], dict[str, Fit]]:
    """(impl, op) -> {model: Fit} over every world size, for both models."""
    impls = [i for run in runs for i in present(run)]
    out: dict[tuple[str, str], dict[str, Fit]] = {}
    for impl in dict.fromkeys(impls):
        for op in ops:
            rows = [r for run in runs for r in run["impls"].get(impl, []) if r["op"] == op]
            fits = {m: f for m in MODELS if (f := fit(rows, m, cores)) is not None}
            if fits:
                out[(impl, op)] = fits
    return out


def best(fits: dict[str, Fit]) -> Fit:
    return min(fits.values(), key=lambda f: f.rel_rms)
