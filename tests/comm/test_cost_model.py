"""The cost model in a Communicator: calibration agreed by every rank,
refinement from traffic that keeps every rank's choice identical even when
their local estimates differ, calls deferred while parameters are agreed,
NETCOLL_ALGO, and the stats."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

from netcoll import selection
from netcoll.calls import agreements
from netcoll.comm import Communicator
from netcoll.errors import ConfigError
from netcoll.selection import cost as cm
from netcoll.selection import tuner
from netcoll.selection.tuner import TRIAL_AGAIN, TRIAL_CALLS, TRIAL_LAG, Tuner
from tests.support.calibration import tell_calibration
from tests.support.worlds import memory_world


def _params(comms: list[Communicator]) -> list[cm.Params | None]:
    return [c._engine.tuner.current() for c in comms]


async def _settled(comms: list[Communicator]) -> list[cm.Params | None]:
    """Every rank's newest parameters, once the agreements issued so far are done."""
    for c in comms:
        for fut in c._engine.tuner.pending():
            await asyncio.wait([fut])
    return _params(comms)


def _record_choices(comms: list[Communicator], monkeypatch: pytest.MonkeyPatch) -> dict[int, list[Any]]:
    """Every finished call's choice, per rank (in the order they finished)."""
    seen: dict[int, list[Any]] = {c.rank: [] for c in comms}
    rank_of = {id(c._engine.tuner): c.rank for c in comms}
    real = Tuner.learn

    def learn(self: Tuner, choice: Any, seconds: float, world_size: int) -> None:
        seen[rank_of[id(self)]].append(choice[:4])
        real(self, choice, seconds, world_size)

    monkeypatch.setattr(Tuner, "learn", learn)
    return seen


async def test_calibration_is_agreed() -> None:
    _, comms = memory_world(3)
    got = await asyncio.gather(*(c.calibrate() for c in comms))
    assert all(isinstance(p, cm.Params) for p in got)
    assert got[0] == got[1] == got[2] == _params(comms)[0]
    for name, v in zip(cm.BOUNDS, got[0].vector(), strict=True):
        assert cm.BOUNDS[name][0] <= v <= cm.BOUNDS[name][1]
    x = np.arange(1 << 16, dtype=np.float32)
    res = await asyncio.gather(*(c.all_reduce(x) for c in comms))
    assert all(np.array_equal(r, 3 * x) for r in res)
    stats = [c.model_stats for c in comms]
    assert stats[0]["model"] == got[0].as_dict()
    row = stats[0]["choices"]["all_reduce"]
    assert row["predicted_s"] > 0 and row["measured_s"] > 0 and row["calls"] == 1
    assert {s["choices"]["all_reduce"]["algorithm"] for s in stats} == {row["algorithm"]}


async def test_calibration_agrees_on_what_the_probe_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Told what the probe measures (the samples of a machine of ``told``, not the
    model's prior), calibration finds exactly that machine on every rank: what the
    tests that tell calibration rely on to keep the model's predictions fixed."""
    told = tell_calibration(monkeypatch)
    assert told != cm.DEFAULT_PARAMS
    _, comms = memory_world(4)
    got = await asyncio.gather(*(c.calibrate() for c in comms))
    assert got == [told] * 4 == _params(comms)


async def test_calls_wait_for_parameters_being_agreed() -> None:
    """Issued before calibration is done, an auto call waits for it and then
    chooses with the agreed parameters (a prediction is the sign)."""
    _, comms = memory_world(4)
    cal = [c.calibrate() for c in comms]
    x = np.ones(1000, np.float64)
    works = [c.all_reduce(x) for c in comms]
    forced = [c.all_reduce(x, algorithm="ring") for c in comms]  # a forced algorithm does not wait
    res = await asyncio.gather(*works, *forced, *cal)
    assert all(np.array_equal(r, 4 * x) for r in res[:8])
    assert all(c.model_stats["choices"]["all_reduce"]["calls"] >= 1 for c in comms)
    assert comms[0]._engine.tuner.versions[-1].params is not None


async def test_a_broadcast_issued_before_calibration_waits_and_then_learns_what_ran() -> None:
    """A broadcast issued while calibration is still being agreed is planned once it is
    (``sized``, the root's choice), and what it ran (the root's shape and the size) still
    reaches every rank's model: the rebuilt plan keeps ``Call.ran``."""
    _, comms = memory_world(4)
    cal = [c.calibrate() for c in comms]
    x = np.arange(1 << 16, dtype=np.float32)
    works = [c.broadcast(x if c.rank == 3 else None, root=3) for c in comms]
    got = await asyncio.gather(*works, *cal)
    assert all(np.array_equal(g, x) for g in got[:4])
    rows = [c.model_stats["choices"]["broadcast"] for c in comms]
    assert len({r["algorithm"] for r in rows}) == 1 and rows[0]["algorithm"] in ("tree", "ring")
    assert rows[3]["predicted_s"] is not None  # the root chose by the agreed parameters
    for c in comms:
        name, algo, terms, _ = c._engine.tuner.samples[-1]
        assert (name, algo) == ("broadcast", rows[0]["algorithm"])
        assert terms == cm.terms("broadcast", algo, x.nbytes, 4, c.segment_bytes)


async def test_ranks_with_different_estimates_still_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank is fed different local samples (rank r: 'halving is r+1 times
    slower'); refinements every few calls, with many calls in flight at once,
    still give every rank the same parameters and the same choice per call."""
    tell_calibration(monkeypatch)
    _, comms = memory_world(4)
    await asyncio.gather(*(c.calibrate() for c in comms))
    base = comms[0]._engine.tuner.current()
    assert base is not None
    for c in comms:
        t = c._engine.tuner
        t.every, t.lag = 3, 1  # refinements mid-round, applying at once: later calls must wait
        n, p, seg = 1 << 20, 4, 4 << 20
        terms = cm.terms("all_reduce", "halving", n, p, seg)
        slow = (c.rank + 1) * cm.predict("all_reduce", "halving", n, p, base, seg)
        for _ in range(20):
            t.samples.append(("all_reduce", "halving", terms, slow))
    seen = _record_choices(comms, monkeypatch)
    deferred = []
    real = Communicator._rebuilder
    monkeypatch.setattr(Communicator, "_rebuilder", lambda self, *a: deferred.append(1) or real(self, *a))
    sizes = [64, 4096, 1 << 16, 1 << 20, 1 << 18]
    rounds = 6
    for _ in range(rounds):  # 5 calls per round, all in flight together: refinements land mid-stream
        works = [[c.all_reduce(np.full(s // 8, c.rank + 1.0)) for s in sizes] for c in comms]
        results = await asyncio.gather(*(w for ws in works for w in ws))
        assert all(np.all(r == 10.0) for r in results)
    assert all(len(v) == rounds * len(sizes) for v in seen.values())
    # (a different choice for one call would also have failed it: the fingerprint names both)
    assert sorted(seen[0]) == sorted(seen[1]) == sorted(seen[2]) == sorted(seen[3])
    params = await _settled(comms)
    assert params[0] == params[1] == params[2] == params[3]
    assert params[0] is not None and params[0].factor("all_reduce", "halving") != (1.0, 1.0)
    assert len(comms[0]._engine.tuner.versions) > 2  # refinements happened
    assert deferred  # and calls waited for them


async def test_split_inherits_the_parameters() -> None:
    _, comms = memory_world(4)
    await asyncio.gather(*(c.calibrate() for c in comms))
    subs = await asyncio.gather(*(c.split(c.rank % 2) for c in comms))
    assert all(s is not None for s in subs)
    parent = comms[0]._engine.tuner.current()
    assert parent is not None
    # (but the per-rank rates: the sub-group's ranks are others)
    assert {s._engine.tuner.current() for s in subs} == {dataclasses.replace(parent, rates=())}
    res = await asyncio.gather(*(s.all_reduce(np.ones(10)) for s in subs))
    assert all(np.array_equal(r, 2 * np.ones(10)) for r in res)


async def test_a_deferred_call_plans_with_the_agreement_it_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call deferred behind an agreement chooses with that agreement's parameters
    however many versions were added before it ran: rank 0 defers its call and adds
    many more versions (agreements scheduled by the calls it issued meanwhile), rank 1
    issues it once the agreement is done. (The Tuner dropped all but its 8 newest
    versions, so rank 0 found none for the call's sequence number and chose by the
    table: a MismatchError, found by the schedule explorer at 2 and 4 ranks with
    refinements every 2 calls: seeds 1100, 1691, 1470.)"""
    _, comms = memory_world(2)
    await asyncio.gather(*(c.calibrate() for c in comms))
    params = comms[0]._engine.tuner.current()
    assert params is not None
    n = tuner.TRIAL_MIN_BYTES
    fast = tuple(
        sorted((cm.slot("all_reduce", a, n), 1.0 if a == "allpairs" else 2.0) for a in cm.FORMULAS["all_reduce"])
    )
    agreed = dataclasses.replace(params, measured=fast)  # all_reduce of n bytes: allpairs
    table = selection.decide("all_reduce", n, 2, None)[0]
    assert table != "allpairs"
    loop = asyncio.get_running_loop()
    agreements = [loop.create_future() for _ in comms]
    for c, f in zip(comms, agreements, strict=True):
        c._engine.tuner.add(c._engine.seq, f)
    x = np.ones(n // 4, np.float32)
    first = comms[0].all_reduce(x)  # deferred behind the agreement
    sub = comms[0].split(0)  # a sub-group made now starts from the same agreement, once made
    e = comms[0]._engine
    for k in range(2 * tuner.VERSIONS_KEPT):  # versions for later calls pile up meanwhile
        e.tuner.add(e.seq + k, loop.create_future())
    agreements[0].set_result(agreed)
    agreements[1].set_result(agreed)
    second = comms[1].all_reduce(x)
    got = await asyncio.gather(first, second)
    assert all(np.array_equal(g, 2 * x) for g in got)
    assert [c.model_stats["choices"]["all_reduce"]["algorithm"] for c in comms] == ["allpairs", "allpairs"]
    subs = await asyncio.gather(sub, comms[1].split(0))
    left = dataclasses.replace(agreed, measured=(), rates=())
    assert [s._engine.tuner.current() for s in subs if s is not None] == [left] * 2


async def test_a_group_of_one_never_waits_for_parameters() -> None:
    """A sub-group of one rank made while its parent's parameters are being agreed runs
    its calls at once: it has nothing to choose. (Such a call was deferred behind the
    agreement and then failed its rebuild with an AssertionError, since its plan needs
    no communication: found by the schedule explorer, 4 ranks with tuning, seed 53.)"""
    _, comms = memory_world(2)
    await asyncio.gather(*(c.calibrate() for c in comms))
    agreement: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    for c in comms:
        c._engine.tuner.add(c._engine.seq, agreement)  # an agreement still running
    subs = await asyncio.gather(*(c.split(c.rank) for c in comms))
    x = np.arange(5.0)
    for s in subs:
        assert s is not None and s.world_size == 1
        works = [s.all_reduce(x, "avg"), s.broadcast(x), s.all_gather(x), s.barrier()]
        assert all(w.done() for w in works), works
        assert np.array_equal(works[0].result(), x) and np.array_equal(works[2].result(), x[None])
    agreement.set_result(None)


async def test_split_leaves_the_measured_times_behind() -> None:
    """Times (and per-rank rates) measured at 4 ranks say nothing of a 2-rank sub-group:
    it starts without them."""
    _, comms = memory_world(4)
    await asyncio.gather(*(c.calibrate() for c in comms))
    params = comms[0]._engine.tuner.current()
    assert params is not None
    timed = dataclasses.replace(params, measured=((cm.slot("all_reduce", "ring", 1 << 20), 0.01),))
    for c in comms:
        assert c._engine.tuner.current() == params
        c._engine.tuner.versions[-1].params = timed
    subs = await asyncio.gather(*(c.split(c.rank % 2) for c in comms))
    assert all(s is not None for s in subs)
    assert {s._engine.tuner.current() for s in subs} == {dataclasses.replace(params, rates=())}


async def test_a_split_during_an_agreement_waits_for_it_without_its_measured_times() -> None:
    """A sub-group made while the parent's parameters are still being agreed
    starts from the ones before, defers to the agreement for calls after it,
    and takes its result without the measured times (another world size)."""
    base = cm.Params(alpha=1e-5, overhead=1e-6, beta=1e-9, gamma=1e-10)
    newer = dataclasses.replace(base, alpha=2e-5, measured=((cm.slot("all_reduce", "ring", 1 << 20), 0.01),))
    parent = Tuner(active=True)
    parent.versions = [tuner.Version(0, base)]
    agreement: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    parent.add(5, agreement)
    child = Tuner()
    child.inherit(parent, parent.version_at(7))
    assert child.active
    with pytest.raises(tuner.Pending):
        child.params_at(0)  # every call of the sub-group comes after the split
    agreement.set_result(newer)
    got = child.params_at(0)
    assert got == dataclasses.replace(newer, measured=())
    assert parent.params_at(5) == newer  # the parent keeps its own
    early = Tuner()
    early.inherit(parent, parent.version_at(3))  # made before the agreement applies: the settled version
    assert early.params_at(0) == base and early.pending() == []


async def test_netcoll_algo_overrides_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_ALGO", "all_reduce=allpairs,broadcast=ring")
    _, comms = memory_world(3)
    await asyncio.gather(*(c.calibrate() for c in comms))
    x = np.ones(1 << 18, np.float32)
    await asyncio.gather(*(c.all_reduce(x) for c in comms))
    await asyncio.gather(*(c.broadcast(x if c.rank == 0 else None) for c in comms))
    choices = comms[1].model_stats["choices"]
    assert choices["all_reduce"]["algorithm"] == "allpairs" and choices["all_reduce"]["predicted_s"] is None
    assert choices["broadcast"]["algorithm"] == "ring"
    r = await asyncio.gather(*(c.all_reduce(x, algorithm="ring") for c in comms))  # explicit wins
    assert np.array_equal(r[0], 3 * x) and comms[0].model_stats["choices"]["all_reduce"]["algorithm"] == "ring"


def test_invalid_netcoll_algo_fails_at_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_ALGO", "all_reduce=rign")
    with pytest.raises(ConfigError, match=r"NETCOLL_ALGO: all_reduce has no algorithm 'rign'; choose one of auto, "):
        memory_world(2)


async def test_cost_model_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_COST_MODEL", "0")
    _, comms = memory_world(2)
    assert await asyncio.gather(*(c.calibrate() for c in comms)) == [None, None]
    assert not comms[0]._engine.tuner.active
    await asyncio.gather(*(c.all_reduce(np.ones(4)) for c in comms))
    row = comms[0].model_stats["choices"]["all_reduce"]
    assert row["algorithm"] == "doubling" and row["predicted_s"] is None  # the table's choice


async def test_uncalibrated_communicators_send_nothing_extra() -> None:
    _, comms = memory_world(2)
    await asyncio.gather(*(c.all_reduce(np.ones(4)) for c in comms))
    assert comms[0].model_stats["model"] is None
    assert not any(c._engine.tuner.active for c in comms)


def test_groups_calibrate_only_when_asked() -> None:
    from netcoll.comm import cost_model_enabled

    assert not cost_model_enabled({})  # off by default: the fixed table decides
    assert cost_model_enabled({"NETCOLL_COST_MODEL": "1"}) and cost_model_enabled({"NETCOLL_COST_MODEL": " On "})
    assert not cost_model_enabled({"NETCOLL_COST_MODEL": "0"})


async def test_trials_measure_close_candidates_and_settle_on_the_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model proposes, measured times decide: each rank is told its own
    times (rank r: every algorithm r+1 times slower, and the model's first
    choice slowest of all); the group tries the algorithms the model finds
    close, agrees on their times, and then every call runs the fastest of
    them, on every rank alike, with no more trials. Calibration is told its machine
    (:func:`~tests.support.calibration.tell_calibration`): the model's predictions,
    which decide what is close, are this test's numbers, not this machine's speed."""
    tell_calibration(monkeypatch)
    _, comms = memory_world(4)
    await asyncio.gather(*(c.calibrate() for c in comms))
    params = comms[0]._engine.tuner.current()
    assert params is not None
    n = 1 << 20
    first = cm.learnt("all_reduce", n, 4, params)[0]
    preds = {a: cm.best("all_reduce", n, 4, params, algorithms=[a])[2] for a in cm.FORMULAS["all_reduce"]}
    close = {a for a, t in preds.items() if t < cm.EXPLORE * preds[first]}
    speed = {a: i + 1.0 for i, a in enumerate(sorted(close - {first}))} | {first: 100.0}
    real = Tuner.learn
    rank_of = {id(c._engine.tuner): c.rank for c in comms}

    def learn(self: Tuner, choice: Any, seconds: float, world_size: int) -> None:
        told = speed.get(choice[1], 50.0) * (rank_of[id(self)] + 1) * 1e-3 if choice[2] == n else seconds
        real(self, choice, told, world_size)

    monkeypatch.setattr(Tuner, "learn", learn)
    # the told times are not the clock's: a call is "overlapped" only while an agreement
    # runs, not by comparing a told time with the time since the last one ended (on a
    # loaded machine that threw away every call of an algorithm: 1 failure in 3 runs)
    monkeypatch.setattr(Tuner, "overlapped", lambda self, seconds: self.agreeing > 0)
    seen = _record_choices(comms, monkeypatch)
    x = np.ones(n // 8, np.float64)
    for _ in range((TRIAL_CALLS + TRIAL_LAG + 1) * len(preds) + 6):  # a trial, its agreement, the next
        res = await asyncio.gather(*(c.all_reduce(x) for c in comms))
        assert all(np.array_equal(r, 4 * x) for r in res)
    assert seen[0] == seen[1] == seen[2] == seen[3]
    tried = [c[1] for c in seen[0]]
    assert tried[0] == first and len(set(tried)) >= 2  # the model's best first, then another close one
    fastest = min(set(tried), key=lambda a: speed.get(a, 50.0))
    assert fastest != first and tried[-4:] == [fastest] * 4  # then the fastest measured one, for good
    after = await _settled(comms)
    assert after[0] == after[1] == after[2] == after[3]
    assert after[0] is not None and cm.learnt("all_reduce", n, 4, after[0])[0] == fastest
    assert after[0].seen("all_reduce", fastest, n) == pytest.approx(2.5e-3 * speed[fastest], rel=0.01)
    stats = comms[0].model_stats
    assert f"all_reduce/{fastest}/<{1 << 21}B" in stats["model"]["measured_s"]


async def test_agreements_with_nothing_on_trial_send_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once every algorithm of a band has an agreed time, the scheduled
    agreements of its trial phase exchange nothing (every rank sees alike that
    nothing is on trial); calls below TRIAL_MIN_BYTES schedule none at all."""
    monkeypatch.setattr(tuner, "REFINE_FIRST", ())  # no refinements of the factors either
    _, comms = memory_world(3)
    await asyncio.gather(*(c.calibrate() for c in comms))
    params = comms[0]._engine.tuner.current()
    assert params is not None
    n = tuner.TRIAL_MIN_BYTES
    every = tuple(sorted((cm.slot("all_reduce", a, n), 1.0 if a == "ring" else 2.0) for a in cm.FORMULAS["all_reduce"]))
    for c in comms:  # as if every algorithm had been tried: all alike, ring the fastest
        assert c._engine.tuner.current() == params  # settled
        c._engine.tuner.versions[-1].params = dataclasses.replace(params, measured=every)
    exchanges = []
    real = agreements.probe.exchange

    async def exchange(ch: Any, row: Any) -> Any:
        exchanges.append(ch.rank)
        return await real(ch, row)

    monkeypatch.setattr(agreements.probe, "exchange", exchange)
    seen = _record_choices(comms, monkeypatch)
    versions = len(comms[0]._engine.tuner.versions)
    for size in (n, n // 8):
        x = np.ones(size // 4, np.float32)
        for _ in range(3 * TRIAL_CALLS):
            await asyncio.gather(*(c.all_reduce(x) for c in comms))
    await _settled(comms)
    assert len(comms[0]._engine.tuner.versions) == versions + 3  # three agreements, for the large calls only
    assert exchanges == []  # ...which sent nothing
    assert {c[1] for c in seen[0][: 3 * TRIAL_CALLS]} == {"ring"}


@pytest.mark.parametrize("slow", ["first", "other"])
async def test_a_broadcast_root_tries_both_shapes_and_settles_on_the_faster(
    monkeypatch: pytest.MonkeyPatch, slow: str
) -> None:
    """Only a broadcast's root knows its size, so only it chooses (``sized``); every rank
    still learns what ran once it has, and the group agrees on the measured times of
    broadcasts on a schedule of broadcasts. Each rank is told its own times (rank r: r+1
    times slower; the slow shape 100x the fast one): the root runs the model's shape
    first, tries the other, and then runs the faster one for good, and every rank ran the
    same shape in every call. Calibration is told its machine, so both shapes are
    predicted close enough to the told times to be tried (on a machine whose measured
    parameters predicted the other shape beyond ``EXPLORE`` times the first's told time,
    it was never tried)."""
    params = tell_calibration(monkeypatch)
    _, comms = memory_world(4)
    await asyncio.gather(*(c.calibrate() for c in comms))
    assert comms[0]._engine.tuner.current() == params
    n = 1 << 20
    seg = comms[0].segment_bytes
    first = cm.learnt("broadcast", n, 4, params, segments=(seg,))[0]
    other = "tree" if first == "ring" else "ring"
    speed = {first: 100.0, other: 1.0} if slow == "first" else {first: 1.0, other: 100.0}
    unit = 1e-3  # told seconds of the fast shape on rank 0: the agreed time (the median) is 2.5 units
    predicted = {s: cm.predict("broadcast", s, n, 4, params, seg) for s in speed}
    assert max(predicted.values()) < cm.EXPLORE * 2.5 * unit  # so the model lets each be tried
    rank_of = {id(c._engine.tuner): c.rank for c in comms}
    real = Tuner.learn

    def learn(self: Tuner, choice: Any, seconds: float, world_size: int) -> None:
        told = speed[choice[1]] * (rank_of[id(self)] + 1) * unit if choice[0] == "broadcast" else seconds
        real(self, choice, told, world_size)

    monkeypatch.setattr(Tuner, "learn", learn)
    monkeypatch.setattr(Tuner, "overlapped", lambda self, seconds: self.agreeing > 0)
    seen = _record_choices(comms, monkeypatch)
    x = np.arange(n // 4, dtype=np.float32)
    for _ in range(4 * (TRIAL_CALLS + TRIAL_LAG) + 4):
        got = await asyncio.gather(*(c.broadcast(x if c.rank == 2 else None, root=2) for c in comms))
        assert all(np.array_equal(g, x) for g in got)
    assert seen[0] == seen[1] == seen[2] == seen[3]  # what ran, with its size, alike on every rank
    ran = [c[1] for c in seen[0] if c[0] == "broadcast"]
    assert {c[2] for c in seen[0] if c[0] == "broadcast"} == {n}
    faster = min(speed, key=lambda s: speed[s])
    assert ran[0] == first and other in ran  # the model's shape first, then the other was tried
    assert ran[-4:] == [faster] * 4  # then the faster, for good
    after = await _settled(comms)
    assert after[0] == after[1] == after[2] == after[3] and after[0] is not None
    assert after[0].seen("broadcast", faster, n) == pytest.approx(2.5 * unit * speed[faster], rel=0.01)
    assert selection.broadcast_shape(n, 4, after[0], seg)[0] == faster


def test_broadcast_trials_follow_the_count_of_broadcasts() -> None:
    """A broadcast's trials cannot depend on its size (only the root knows it): they follow
    the count of broadcasts on the usual schedule and always exchange."""
    t = Tuner(active=True)
    due = []
    for i in range(1, 300):
        t.asked = ("broadcast", tuner.ROOT_SIZED)
        if got := t.trial_due():
            due.append(i)
            assert got == ("broadcast", tuner.ROOT_SIZED, True)
    k = len(cm.FORMULAS["broadcast"]) + 1
    assert due == [TRIAL_CALLS * j for j in range(1, k + 1)] + [TRIAL_CALLS * TRIAL_AGAIN * 2**j for j in range(3)]


def test_trials_are_agreed_on_a_schedule_of_calls() -> None:
    """When a size band's measured times are agreed depends only on the calls
    issued (every rank issues the same), never on the parameters in force."""
    t = Tuner(active=True)
    due = []
    for i in range(1, 800):
        t.asked = ("all_reduce", 1 << 20 if i % 2 else 3 << 19)  # one band, two sizes
        if got := t.trial_due():
            due.append(i)
            assert got[:2] == t.asked and got[2] == (len(due) > len(cm.FORMULAS["all_reduce"]) + 1)
    k = len(cm.FORMULAS["all_reduce"]) + 1  # one trial per algorithm, plus one
    c = TRIAL_CALLS
    assert due == [c * j for j in range(1, k + 1)] + [
        c * TRIAL_AGAIN * 2**j for j in range(4) if c * TRIAL_AGAIN * 2**j < 800
    ]
    t.asked = ("gather", 1 << 20)  # one algorithm: nothing to try
    assert not any(t.trial_due() for _ in range(10))
    t.asked = ("all_reduce", tuner.TRIAL_MIN_BYTES - 1)  # too small to be worth measuring
    assert not any(t.trial_due() for _ in range(10))
    t.asked, t.active = ("all_reduce", 64), False  # no model: nothing
    assert not any(t.trial_due() for _ in range(10))
