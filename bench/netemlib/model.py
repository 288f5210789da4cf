"""The cost model and the predictions: ``(steps, link_bytes)`` per algorithm from the cost
headers of ``netcoll/algorithms/*.py``, what ``auto`` runs, ``netcoll/selection/cost.py``
where it exists, the :class:`Model` that turns them into seconds, the crossover finder (all
pure), and :func:`predict`, which applies them to a run's measurements:
``T = steps * alpha + link_bytes * beta`` per row, with ``alpha = delay + o`` and
``beta = 1 / rate`` (and a second model with ``beta + beta0``), and the crossovers, measured and
predicted, per collective."""

from __future__ import annotations

import itertools
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench.netemlib.common import DEFAULT_SEGMENT_BYTES, REPO, say

if TYPE_CHECKING:
    from bench.netemlib.run import Run

LOCAL_SOURCE = "bench/netem.py cost_terms"  # the JSON's name for the local formulas (unchanged by the split)

Terms = tuple[float, float]


def _log2_floor_pow(p: int) -> int:
    """The largest power of two <= p."""
    return 1 << (p.bit_length() - 1)


def _all_reduce_terms(algorithm: str, n: float, p: int, segment_bytes: int) -> Terms | None:
    L = math.ceil(math.log2(p))
    p2 = _log2_floor_pow(p)
    k = p2.bit_length() - 1
    extra = p != p2
    if algorithm == "ring":  # 2(P-1) steps, 2(P-1)/P N per rank; S segments per chunk pipelined
        s = max(1, math.ceil(n / p / segment_bytes))
        return 2 * (p - 1) + (s - 1), 2 * (p - 1) / p * n
    if algorithm == "doubling":  # log2 P' rounds (+2 with extra ranks), the whole N each
        steps = k + (2 if extra else 0)
        return steps, steps * n
    if algorithm == "halving":  # 2 log2 P' steps, 2(P'-1)/P' N (+ N in and N out with extras)
        return 2 * k + (2 if extra else 0), 2 * (p2 - 1) / p2 * n + (2 * n if extra else 0)
    if algorithm == "tree":  # reduce (L levels) + broadcast (L levels); the root's link carries L*N each way
        s = max(1, math.ceil(n / segment_bytes))
        return 2 * (L + s - 1), 2 * L * n
    if algorithm == "allpairs":  # 1 step, (P-1) N sent and received per rank
        return 1, (p - 1) * n
    return None


def _all_gather_terms(algorithm: str, n: float, p: int, segment_bytes: int) -> Terms | None:
    if algorithm == "ring":  # P-1 steps, (P-1)/P N
        s = max(1, math.ceil(n / p / segment_bytes))
        return (p - 1) + (s - 1), (p - 1) / p * n
    if algorithm == "doubling":  # Bruck: L steps, (P-1)/P N
        return math.ceil(math.log2(p)), (p - 1) / p * n
    return None


def _broadcast_terms(algorithm: str, n: float, p: int, segment_bytes: int) -> Terms | None:
    s = max(1, math.ceil(n / segment_bytes))
    if algorithm == "tree":  # L levels, L+S-1 segment times; the root sends L*N
        L = math.ceil(math.log2(p))
        return L + s - 1, L * n
    if algorithm == "ring":  # chain: P+S-2 segment times of N/S bytes
        return p + s - 2, (p + s - 2) * n / s
    return None


_TERMS: dict[str, Callable[[str, float, int, int], Terms | None]] = {
    "all_reduce": _all_reduce_terms,
    "all_gather": _all_gather_terms,
    "broadcast": _broadcast_terms,
}


def cost_terms(
    op: str, algorithm: str, nbytes: int, p: int, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> tuple[float, float]:
    """``(steps, link_bytes)`` of one call: the latency terms on the critical path and the
    bytes through the busiest link direction, from the cost headers of netcoll/algorithms.

    ``T = steps * alpha + link_bytes * beta``. ``nbytes`` as nccl-tests' size: all_reduce's
    and broadcast's buffer, all_gather's output (all P blocks).
    """
    if p <= 1:
        return 0.0, 0.0
    terms = _TERMS.get(op)
    found = terms(algorithm, float(nbytes), p, segment_bytes) if terms is not None else None
    if found is None:
        raise ValueError(f"no cost formula for {op} / {algorithm}")
    return found


def auto_choice(op: str, nbytes: int, p: int) -> str:
    """What ``auto`` runs (netcoll.selection.choose, with the size the Communicator passes)."""
    from netcoll.selection import choose

    return str(choose(op, 0 if op in ("broadcast", "scatter") else nbytes, p))


def _load_by_path(path: str) -> Any:
    """The module at ``path`` as ``netcoll_cost_model``, or None where it does not load (said)."""
    import importlib.util

    try:
        spec = importlib.util.spec_from_file_location("netcoll_cost_model", path)
        if spec is None or spec.loader is None:
            return None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["netcoll_cost_model"] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
    except Exception as exc:  # noqa: BLE001 - someone else's module: fall back, and say so
        say(f"{path} does not load ({exc}); using the local formulas")
        return None
    return mod


def _cost_paths(root: str) -> tuple[str, ...]:
    return tuple(os.path.join(root, "netcoll", pkg, "cost.py") for pkg in ("selection", "algorithms"))


def load_cost_module(*roots: str) -> Any:
    """``netcoll/selection/cost.py`` (the cost model behind ``auto``: pure functions, no
    imports of netcoll; ``netcoll/algorithms/cost.py`` in checkouts before issue 39) loaded
    by path from the first root that has it, if its ``predict`` and ``Params`` are there;
    else None (the local formulas are used)."""
    for root in roots:
        path = next((p for p in _cost_paths(root) if os.path.exists(p)), None)
        if path is None:
            continue
        mod = _load_by_path(path)
        if mod is None:
            continue
        if callable(getattr(mod, "predict", None)) and getattr(mod, "Params", None) is not None:
            mod.path = path
            return mod
    return None


class Model:
    """Predicted seconds per call for one (alpha, beta): ``netcoll.selection.cost.predict``
    with ``Params(alpha, overhead=0, beta, gamma=0)`` when that module exists, else the local
    :func:`cost_terms`; both are ``steps * alpha + bytes * beta``."""

    def __init__(self, alpha: float, beta: float, p: int, cost: Any = None) -> None:
        self.alpha, self.beta, self.p, self.cost = alpha, beta, p, cost
        self.source = f"{cost.path} predict()" if cost is not None else LOCAL_SOURCE

    def local(self, op: str, algorithm: str, nbytes: int) -> float:
        steps, link_bytes = cost_terms(op, algorithm, nbytes, self.p)
        return steps * self.alpha + link_bytes * self.beta

    def seconds(self, op: str, algorithm: str, nbytes: int) -> float:
        if algorithm == "auto":
            algorithm = auto_choice(op, nbytes, self.p)
        if self.cost is not None:
            try:
                params = self.cost.Params(self.alpha, 0.0, self.beta, 0.0)
                t = float(self.cost.predict(op, algorithm, nbytes, self.p, params, DEFAULT_SEGMENT_BYTES))
                if math.isfinite(t) and t >= 0:
                    return t
                raise ValueError(f"predicted {t}")
            except Exception as exc:  # noqa: BLE001 - an unknown module's failure: fall back, and say so
                say(f"cost.predict failed for {op}/{algorithm} ({exc}); using the local formulas from now on")
                self.cost, self.source = None, LOCAL_SOURCE
        return self.local(op, algorithm, nbytes)


def _winners(table: dict[str, dict[float, float]], sizes: list[float], smooth: bool) -> list[tuple[float, str]]:
    """The fastest algorithm at each size; ``smooth``: a lone winner between two sizes won by
    the same other algorithm is taken as noise."""
    algs = sorted(table)
    best: list[tuple[float, str]] = []
    for s in sizes:
        cands = [(table[a][s], a) for a in algs if s in table[a] and table[a][s] > 0]
        if cands:
            best.append((s, min(cands)[1]))
    if smooth:
        for i in range(1, len(best) - 1):
            if best[i - 1][1] == best[i + 1][1] != best[i][1]:
                best[i] = (best[i][0], best[i - 1][1])
    return best


def _crossing(table: dict[str, dict[float, float]], a0: str, a1: str, s0: float, s1: float) -> float:
    """Where the curves of ``a0`` and ``a1`` cross between ``s0`` and ``s1`` (log-log)."""
    at = math.sqrt(s0 * s1)
    try:  # log t_a0 - log t_a1 goes from <0 at s0 to >0 at s1: where is it 0?
        d0 = math.log(table[a0][s0]) - math.log(table[a1][s0])
        d1 = math.log(table[a0][s1]) - math.log(table[a1][s1])
        if d1 != d0:
            f = min(1.0, max(0.0, -d0 / (d1 - d0)))
            at = math.exp(math.log(s0) + f * (math.log(s1) - math.log(s0)))
    except (KeyError, ValueError):
        pass
    return at


def crossovers(curves: dict[str, list[tuple[float, float]]], *, smooth: bool = False) -> list[dict[str, Any]]:
    """Where the fastest algorithm changes along size. ``curves``: algorithm -> [(size, time)]
    on the same sizes. Each crossover: the sizes it lies between, the algorithms before and
    after, and the size where their two curves cross (log-log interpolation). ``smooth``: a
    winner at one size only, between two sizes won by the same other algorithm, is taken
    as noise (for measurements)."""
    if len(curves) < 2:
        return []
    sizes = sorted({s for pts in curves.values() for s, _ in pts if s > 0})
    table = {a: dict(curves[a]) for a in sorted(curves)}
    best = _winners(table, sizes, smooth)
    out = []
    for (s0, a0), (s1, a1) in itertools.pairwise(best):
        if a0 != a1:
            out.append({"from": a0, "to": a1, "between": [s0, s1], "at": _crossing(table, a0, a1, s0, s1)})
    return out


# -- predictions for a run -------------------------------------------------------------------------
Rows = list[dict[str, Any]]


def _models(run: Run) -> tuple[Model, Model]:
    """The network model and the one with the CPU's per-byte cost added; described in the result."""
    a = run.args
    cal = run.result["calibration_veth" if a.overhead == "veth" else "calibration"]
    o, beta0 = cal["overhead_per_message_s"], cal["beta0_s_per_byte"]
    beta = 8.0 / a.rate if run.shaping != "none" else 0.0
    alpha = run.delay_applied + o
    cost = load_cost_module(a.netcoll_path, REPO)
    net = Model(alpha, beta, a.ranks, cost)
    cpu = Model(alpha, beta + beta0, a.ranks, cost)
    run.result["model"] = {
        "formula": "T = steps * alpha + link_bytes * beta "
        "(netcoll/algorithms cost headers; link_bytes: the busiest link direction)",
        "overhead_from": "calibration_veth" if a.overhead == "veth" else "calibration (loopback)",
        "alpha_s": alpha,
        "beta_s_per_byte": beta,
        "beta0_s_per_byte": beta0,
        "source": net.source,
        "cpu_model": "the same with beta + beta0 (the per-byte CPU cost measured on loopback)",
    }
    return net, cpu


def _annotate(run: Run, net: Model, cpu: Model) -> dict[str, dict[str, Rows]]:
    """Each measured row gets its predictions (and, for ``auto``, what auto runs); the rows by
    collective and algorithm."""
    by_op: dict[str, dict[str, Rows]] = {}
    for sw in run.result["sweeps"]:
        op, alg = sw["op"], sw["algorithm"]
        for r in sw["rows"]:
            r["predicted_us"] = net.seconds(op, alg, r["size"]) * 1e6
            r["predicted_cpu_us"] = cpu.seconds(op, alg, r["size"]) * 1e6
            if alg != "auto":
                r["predicted_local_formulas_us"] = net.local(op, alg, r["size"]) * 1e6
            if alg == "auto":
                r["auto_runs"] = auto_choice(op, r["size"], run.args.ranks)
        by_op.setdefault(op, {})[alg] = sw["rows"]
    return by_op


def _op_crossovers(op: str, algs: dict[str, Rows], net: Model, cpu: Model) -> dict[str, Any]:
    """One collective's crossovers among its fixed algorithms: measured (smoothed and raw),
    predicted on a fine grid (both models) and on the sampled sizes."""
    fixed = {k: v for k, v in algs.items() if k != "auto"}
    measured = {k: [(r["size"], r["time_us"]) for r in v if r["size"] > 0] for k, v in fixed.items()}
    predicted = {k: [(r["size"], r["predicted_us"]) for r in v if r["size"] > 0] for k, v in fixed.items()}
    # the model's crossovers on a fine grid over the same range, for the exact sizes
    lo = max(1, min((s for pts in measured.values() for s, _ in pts), default=1))
    hi = max((s for pts in measured.values() for s, _ in pts), default=1)
    grid = sorted({round(lo * (hi / lo) ** (i / 400)) for i in range(401)}) if hi > lo else [lo]
    fine = {k: [(s, net.seconds(op, k, s)) for s in grid] for k in fixed}
    return {
        "measured_crossovers": crossovers(measured, smooth=True),
        "measured_crossovers_raw": crossovers(measured),
        "predicted_crossovers": crossovers(fine),
        "predicted_crossovers_cpu_model": crossovers({k: [(s, cpu.seconds(op, k, s)) for s in grid] for k in fixed}),
        "predicted_crossovers_on_sampled_sizes": crossovers(predicted),
    }


def predict(run: Run) -> None:
    """``result["model"]``, the predictions in every row and ``result["crossovers"]``."""
    net, cpu = _models(run)
    by_op = _annotate(run, net, cpu)
    run.result["model"]["source"] = net.source  # net.seconds may have fallen back to the local formulas
    run.result["crossovers"] = {op: _op_crossovers(op, algs, net, cpu) for op, algs in by_op.items()}
