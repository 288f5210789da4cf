"""The weighted all_reduce in a Communicator: calibration agrees on every rank's told
rate, ``"auto"`` runs it for a large buffer when one rank is slow (and only then),
by name and by NETCOLL_ALGO, in memory and over loopback TCP; results exact and
bit-identical on every rank."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from netcoll.algorithms import ALGORITHMS, weighted
from netcoll.comm import Communicator
from netcoll.selection import weighting
from tests.support.calibration import TOLD, tell_calibration
from tests.support.worlds import connected_world, memory_world

BIG = weighting.MIN_BYTES * 2  # bytes


def _algorithm(comms: list[Communicator]) -> set[str]:
    return {c.model_stats["choices"]["all_reduce"]["algorithm"] for c in comms}


async def _check(comms: list[Communicator], nbytes: int, **kw: object) -> None:
    """An all_reduce of ``nbytes`` of float32, exact (small integers) and the same bits everywhere."""
    xs = [np.arange(nbytes // 4, dtype=np.float32) % 97 + c.rank for c in comms]
    got = await asyncio.gather(*(c.all_reduce(x, **kw) for c, x in zip(comms, xs, strict=True)))  # type: ignore[arg-type]
    want = np.sum(xs, axis=0, dtype=np.float32)
    assert all(g.tobytes() == want.tobytes() for g in got)


async def test_a_slow_rank_is_agreed_and_auto_runs_weighted(monkeypatch: pytest.MonkeyPatch) -> None:
    rates = [1e9, 1e9, 0.25e9, 1e9]
    tell_calibration(monkeypatch, rates=rates)
    _, comms = memory_world(4)
    got = await asyncio.gather(*(c.calibrate() for c in comms))
    assert all(p is not None and p.rates == tuple(rates) for p in got)
    await _check(comms, BIG)
    assert _algorithm(comms) == {"weighted"}
    assert comms[0].model_stats["model"]["rates_Bps"] == rates
    await _check(comms, 64 * 1024)  # small: the model's choice
    assert _algorithm(comms) != {"weighted"}


async def test_equal_rates_keep_the_models_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    tell_calibration(monkeypatch, rates=[1e9] * 4)
    _, comms = memory_world(4)
    await asyncio.gather(*(c.calibrate() for c in comms))
    await _check(comms, BIG)
    assert _algorithm(comms) != {"weighted"}


async def test_refinements_keep_the_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    rates = [1e9, 0.2e9, 1e9]
    tell_calibration(monkeypatch, rates=rates)
    _, comms = memory_world(3)
    await asyncio.gather(*(c.calibrate() for c in comms))
    for c in comms:
        c._engine.tuner.every = 2  # a refinement every other call
    for _ in range(6):
        await _check(comms, BIG)
    for c in comms:
        for fut in c._engine.tuner.pending():
            await asyncio.wait([fut])
    assert len(comms[0]._engine.tuner.versions) > 2  # refinements happened
    assert {c._engine.tuner.current().rates for c in comms} == {tuple(rates)}  # type: ignore[union-attr]
    assert _algorithm(comms) == {"weighted"}


async def test_by_name_without_a_model_equal_shares() -> None:
    _, comms = memory_world(3)
    await _check(comms, 3 * 1000 + 4, algorithm="weighted")
    assert _algorithm(comms) == {"weighted"}


async def test_out_buffer_leaves_the_input_as_it_was() -> None:
    """With ``out=`` the weighted all_reduce reads the input in place (``src``) and writes only ``out``."""
    _, comms = memory_world(3)
    xs = [np.arange(50_001, dtype=np.float32) % 89 + c.rank for c in comms]
    before = [x.copy() for x in xs]
    outs = [np.full_like(x, np.nan) for x in xs]
    got = await asyncio.gather(
        *(c.all_reduce(x, out=o, algorithm="weighted") for c, x, o in zip(comms, xs, outs, strict=True))
    )
    want = np.sum(before, axis=0, dtype=np.float32)
    assert all(g is o and o.tobytes() == want.tobytes() for g, o in zip(got, outs, strict=True))
    assert all(x.tobytes() == b.tobytes() for x, b in zip(xs, before, strict=True))


async def test_netcoll_algo_forces_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_ALGO", "all_reduce=weighted")
    tell_calibration(monkeypatch, rates=[1e9, 1e9, 1e9, 1e8, 1e9])
    _, comms = memory_world(5)
    await asyncio.gather(*(c.calibrate() for c in comms))
    await _check(comms, 4096)  # however small
    assert _algorithm(comms) == {"weighted"}


async def test_by_name_waits_for_the_rates_being_agreed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A weighted call issued while calibration runs takes the rates it agrees on."""
    rates = [1e9, 0.1e9]
    tell_calibration(monkeypatch, rates=rates)
    seen: list[object] = []
    real = weighted.all_reduce

    async def spy(ch: object, buf: np.ndarray, op: object, **kw: object) -> None:
        seen.append(kw.get("rates"))
        await real(ch, buf, op, **kw)  # type: ignore[arg-type]

    monkeypatch.setitem(ALGORITHMS["all_reduce"], "weighted", spy)
    _, comms = memory_world(2)
    calibrations = [c.calibrate() for c in comms]
    await _check(comms, 4096, algorithm="weighted")
    await asyncio.gather(*calibrations)
    assert seen == [tuple(rates)] * 2


async def test_over_tcp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_COST_MODEL", "1")
    rates = [1e9, 1e9, 0.25e9, 1e9]
    tell_calibration(monkeypatch, TOLD, rates=rates)
    async with connected_world(4) as comms:
        assert {c._engine.tuner.current().rates for c in comms} == {tuple(rates)}  # type: ignore[union-attr]
        await _check(comms, BIG)
        assert _algorithm(comms) == {"weighted"}
