"""Calibration of a told machine: the cost model's tests must not depend on the
speed of the machine they run on, so they tell calibration what it measures.

:func:`tell_calibration` keeps the probe's traffic (every message still goes,
over whatever transport the test uses) but replaces every sample's measured
seconds with what a machine of the told :class:`~netcoll.selection.cost.Params`
takes for its terms; the fit then finds those parameters again, and every
prediction of the model is a pure function of the test's own numbers. The per-rank
rate probe (:func:`~netcoll.selection.probe.rate`) runs too and says the told rates
(by group rank), or that it measured nothing (no rates agreed: equal shares, and the
weighted all_reduce never chosen).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from netcoll.mesh.channel import Channel
from netcoll.selection import cost, probe
from netcoll.selection.probe import Sample

#: a loopback-like machine, not the model's prior (:data:`~netcoll.selection.cost.DEFAULT_PARAMS`):
#: what calibration then agrees on comes from the told samples
TOLD = cost.Params(alpha=30e-6, overhead=10e-6, beta=0.4e-9, gamma=0.2e-9, solo=0.3e-9)


def told_seconds(terms: cost.Terms, params: cost.Params) -> float:
    """The seconds a machine of ``params`` takes for ``terms`` (no efficiency factors)."""
    return sum(t * v for t, v in zip(terms, params.vector(), strict=True))


def tell(samples: list[Sample], params: cost.Params) -> list[Sample]:
    """``samples`` with their measured seconds replaced by ``params``' (:func:`told_seconds`)."""
    return [(terms, told_seconds(terms, params)) for terms, _ in samples]


def tell_calibration(
    monkeypatch: pytest.MonkeyPatch, params: cost.Params = TOLD, rates: Sequence[float] | None = None
) -> cost.Params:
    """Make every calibration in this test measure a machine of ``params``: the link
    probe runs as ever, and its samples and the local reduction's say ``params``; the
    rate probe says ``rates[rank]`` (None: nothing measured). Returns ``params``."""
    real_probe, real_reduce, real_rate = probe.probe, probe.reduce_samples, probe.rate

    async def told_rate(ch: Channel, **kw: Any) -> float:
        await real_rate(ch, **kw)
        return 0.0 if rates is None else float(rates[ch.rank])

    async def told_probe(ch: Channel, **kw: Any) -> list[Sample]:
        return tell(await real_probe(ch, **kw), params)

    def told_reduce(*args: Any, **kw: Any) -> list[Sample]:
        return tell(real_reduce(*args, **kw), params)

    monkeypatch.setattr(probe, "probe", told_probe)
    monkeypatch.setattr(probe, "reduce_samples", told_reduce)
    monkeypatch.setattr(probe, "rate", told_rate)
    return params


__all__ = ["TOLD", "tell", "tell_calibration", "told_seconds"]
