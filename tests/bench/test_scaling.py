"""bench/scaling.py: the alpha-beta formulas and the least-squares fit (no processes are run)."""

from __future__ import annotations

import numpy as np
import pytest

from bench import scaling
from netcoll.bench.common import geometry, make_row


def _row(op: str, p: int, req: int, seconds: float, algorithm: str | None = None) -> dict:
    g = geometry(op, req, np.float32, p)
    extra = {"algorithm": algorithm} if algorithm else {}
    return make_row(
        g, redop="sum", root=0, seconds=seconds, median_seconds=seconds, min_seconds=seconds, wrong=None,
        requested=req, **extra,
    )  # fmt: skip


def _synthetic(op: str, alg: str | None, alpha: float, beta: float, model: str, cores: int = 2) -> list[dict]:
    rows = []
    for p in (2, 4, 8, 16):
        for req in (4 << 10, 64 << 10, 1 << 20, 16 << 20):
            r = _row(op, p, req, 1.0, alg)
            a, b = scaling.terms(r, model, cores)
            rows.append(_row(op, p, req, a * alpha + b * beta, alg))
    return rows


def test_formulas_count_steps_and_bytes() -> None:
    ring = _row("all_reduce", 4, 1024, 1e-3, "auto:ring")
    assert scaling.algorithm_of(ring) == "ring"
    assert scaling.terms(ring, scaling.PLAIN, 2) == (6, 1536.0)  # 2(P-1) steps, 2(P-1)/P n bytes
    # with 4 ranks on 2 cores every step takes twice as long in the shared model
    assert scaling.terms(ring, scaling.SHARED, 2) == (12, 3072.0)
    assert scaling.terms(ring, scaling.SHARED, 8) == (6, 1536.0)  # enough cores: no sharing
    tree = _row("all_reduce", 8, 1024, 1e-3, "auto:tree")
    assert scaling.terms(tree, scaling.PLAIN, 8) == (6, 6 * 1024.0)  # 2 log2 P levels of n
    doubling = _row("all_reduce", 6, 1024, 1e-3, "doubling")  # P' = 4: 2 rounds + 2 for the extras
    assert scaling.terms(doubling, scaling.PLAIN, 8) == (4, 4 * 1024.0)
    # peers do not name an algorithm: the textbook large-message one is assumed
    peer = _row("broadcast", 16, 1 << 20, 1e-3)
    assert scaling.algorithm_of(peer) == "tree"
    assert scaling.terms(peer, scaling.PLAIN, 2) == (4, 4.0 * (1 << 20))
    gather = _row("gather", 4, 4096, 1e-3, "auto:direct")
    assert scaling.terms(gather, scaling.PLAIN, 4) == (3, 3 / 4 * 4096)


@pytest.mark.parametrize("model", scaling.MODELS)
def test_fit_recovers_alpha_beta_and_picks_the_model_that_made_the_data(model: str) -> None:
    rows = _synthetic("all_reduce", "auto:ring", 50e-6, 1 / 0.8e9, model)
    fits = {m: scaling.fit(rows, m, 2) for m in scaling.MODELS}
    f = fits[model]
    assert f is not None
    assert f.alpha == pytest.approx(50e-6, rel=1e-6) and f.beta == pytest.approx(1 / 0.8e9, rel=1e-6)
    assert f.rel_rms < 1e-6 and f.points == 16
    other = next(m for m in scaling.MODELS if m != model)
    assert fits[other].rel_rms > 0.05  # type: ignore[union-attr]
    assert scaling.best(fits).model == model  # type: ignore[arg-type]
    assert f.predict(rows[5], 2) == pytest.approx(rows[5]["time_us"] * 1e-6, rel=1e-6)


def test_fit_never_returns_a_negative_alpha_or_beta() -> None:
    # times that fall with more steps would need alpha < 0: alpha is clipped to 0 and beta refitted
    ab = np.array([[1.0, 1000.0], [2.0, 1000.0], [3.0, 1000.0]])
    t = np.array([3e-6, 2e-6, 1e-6])
    alpha, beta = scaling.least_squares(ab, t)
    assert alpha == 0.0 and beta > 0


def test_fit_needs_three_points_and_skips_empty_buffers() -> None:
    rows = _synthetic("all_gather", "auto:ring", 30e-6, 1e-9, scaling.PLAIN)[:2]
    assert scaling.fit(rows, scaling.PLAIN, 2) is None
    empty = _row("all_gather", 4, 4, 1e-4, "auto:doubling")  # 1 element, 4 ranks: size 0
    assert empty["size"] == 0
    assert scaling.fit([*rows, empty], scaling.PLAIN, 2) is None


def test_fit_all_covers_every_implementation_and_collective() -> None:
    runs = []
    nc = _synthetic("all_reduce", "auto:ring", 60e-6, 1e-9, scaling.SHARED)
    mpi = _synthetic("all_reduce", None, 5e-6, 2e-9, scaling.PLAIN)
    for p in (2, 4, 8, 16):
        runs.append(
            {
                "world_size": p,
                "impls": {
                    "netcoll-tcp": [r for r in nc if r["world_size"] == p],
                    "mpi": [r for r in mpi if r["world_size"] == p],
                },
            }
        )
    fits = scaling.fit_all(runs, 2, ["all_reduce", "broadcast"])
    assert set(fits) == {("netcoll-tcp", "all_reduce"), ("mpi", "all_reduce")}
    assert scaling.best(fits[("netcoll-tcp", "all_reduce")]).model == scaling.SHARED
    assert scaling.best(fits[("mpi", "all_reduce")]).model == scaling.PLAIN
    assert scaling.best(fits[("mpi", "all_reduce")]).alpha == pytest.approx(5e-6, rel=1e-6)
