"""When ``"auto"`` runs the weighted all_reduce (netcoll.selection.weighting), and how the
per-rank rates it needs are measured and agreed (probe.rate, fit.combine, the Tuner)."""

from __future__ import annotations

import dataclasses
from itertools import combinations

import pytest

from netcoll.calls.agreements import on_trial
from netcoll.selection import cost as cm
from netcoll.selection import decide, probe, weighting
from netcoll.selection.fit import ROW, combine, fit_factors, with_rate
from netcoll.selection.tuner import Tuner, Version
from tests.support.calibration import TOLD

MiB = 1 << 20
SLOW = (1e9, 1e9, 0.25e9, 1e9)  # the case: one rank's link 4x slower


def told(rates: tuple[float, ...]) -> cm.Params:
    return dataclasses.replace(TOLD, rates=rates)


def test_a_slow_rank_makes_auto_run_weighted_for_large_buffers() -> None:
    params = told(SLOW)
    algo, _, predicted = decide("all_reduce", 64 * MiB, 4, params)
    model = cm.learnt("all_reduce", 64 * MiB, 4, params)
    assert algo == "weighted" and predicted is not None and predicted < (1 - weighting.GAIN) * model[2]
    assert predicted == weighting.predict(64 * MiB, 4, params, model[1])


@pytest.mark.parametrize(
    ("collective", "nbytes", "p", "rates"),
    [
        ("all_reduce", 64 * MiB, 4, (1e9,) * 4),  # equal rates: nothing to gain
        ("all_reduce", 64 * MiB, 4, ()),  # not measured (the model off, or a sub-group)
        ("all_reduce", 64 * MiB, 4, SLOW[:3]),  # not one per rank
        ("all_reduce", weighting.MIN_BYTES - 1, 4, SLOW),  # small: the model's choice
        ("all_reduce", 64 * MiB, 2, (1e9, 0.25e9)),  # two ranks: every share costs the same
        ("reduce_scatter", 64 * MiB, 4, SLOW),
    ],
)
def test_otherwise_nothing_changes(collective: str, nbytes: int, p: int, rates: tuple[float, ...]) -> None:
    params = told(rates)
    assert decide(collective, nbytes, p, params) == decide(collective, nbytes, p, told(()))
    assert decide(collective, nbytes, p, params)[0] != "weighted"


@pytest.mark.parametrize("p", [3, 4, 5, 8])
@pytest.mark.parametrize("nbytes", [4 * MiB, 64 * MiB, 1 << 30])
def test_chosen_exactly_when_the_predicted_gain_passes_the_threshold(p: int, nbytes: int) -> None:
    flips = 0
    for k in range(1, 41):  # one rank from 1x down to 0.025x the others' rate
        params = told((1e9,) * (p - 1) + (1e9 * (1 - k / 41),))
        model = cm.learnt("all_reduce", nbytes, p, params)
        gain = 1 - weighting.predict(nbytes, p, params, model[1]) / model[2]
        chosen = decide("all_reduce", nbytes, p, params)[0] == "weighted"
        assert chosen == (gain > weighting.GAIN), (k, gain)
        flips += chosen
    assert 0 < flips < 40  # a mildly slower rank keeps the model's choice; a much slower one does not


def test_weighted_is_never_on_trial() -> None:
    assert not on_trial(told(SLOW), "all_reduce", 64 * MiB, 4, None)
    assert on_trial(told(()), "all_reduce", 64 * MiB, 4, None)  # (nothing measured yet)


def test_rates_go_through_the_row_and_combine_per_rank() -> None:
    rows = [with_rate(TOLD, r) for r in (1.23456e9, 2e9, 0.5e9)]
    assert len(rows[0]) == ROW + 1
    got = combine(rows, "max")
    assert got.rates == (1.23e9, 2e9, 0.5e9)
    assert dataclasses.replace(got, rates=()) == combine([r[:-1] for r in rows], "max")
    assert combine(rows, "median").rates == got.rates  # kept per rank, whatever ``how``
    assert combine([*rows[:2], with_rate(TOLD, 0.0)], "max").rates == ()  # one rank not measured
    assert combine([*rows[:2], with_rate(TOLD, float("nan"))], "max").rates == ()
    assert "rates_Bps" in got.as_dict() and "rates_Bps" not in TOLD.as_dict()


def test_fit_factors_keeps_the_rates() -> None:
    n, p, seg = 16 * MiB, 4, 4 * MiB
    t = cm.terms("all_reduce", "ring", n, p, seg)
    got = fit_factors([("all_reduce", "ring", t, 1.0)] * 3, told(SLOW))
    assert got.rates == SLOW


def test_a_sub_group_does_not_inherit_the_rates() -> None:
    parent = Tuner()
    parent.versions = [Version(0, told(SLOW))]
    child = Tuner()
    child.inherit(parent, parent.versions[0])
    assert child.current() is not None and child.current().rates == ()  # type: ignore[union-attr]


@pytest.mark.parametrize("size", range(1, 10))
def test_every_pair_meets_once_in_size_rounds(size: int) -> None:
    met: list[tuple[int, int]] = []
    for k in range(size):
        pairs = {r: probe.partner(r, k, size) for r in range(size)}
        for r, q in pairs.items():
            assert q is None or pairs[q] == r  # a pairing: partners name each other
            if q is not None and r < q:
                met.append((r, q))
    assert sorted(met) == list(combinations(range(size), 2))
