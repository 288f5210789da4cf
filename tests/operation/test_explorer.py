"""The schedule explorer on the in-process mesh (issue 34): hundreds of seeded
random programs, issued alike on every rank and awaited in per-rank random orders,
every result checked against numpy; and the explorer itself: its programs are
replayable and cover what they should, and it catches a wrong value, a hang and a
cancel that ends wrongly, each reported with its seed and replay command."""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

import numpy as np
import pytest

from netcoll import algorithms
from netcoll.errors import CollectiveCancelled, CollectiveTimeout
from netcoll.testing import explore, program, reference
from netcoll.testing.schedule import RankReport, Runner
from netcoll.testing.worlds import Config, judge, run_memory

#: (config, seeds): hundreds of seeds, a few seconds each on a 2-core machine; a small receive
#: window and segment make flow control (credit, request to send) and many frames per call
MEMORY = [(Config(r, tuning=False), n) for r, n in ((2, 150), (3, 150), (4, 150), (8, 50))]
MEMORY += [(Config(r, tuning=True), n) for r, n in ((2, 80), (3, 80), (4, 80), (8, 25))]
MEMORY += [(Config(4, tuning=t, window=64 << 10, segment=16 << 10), 40) for t in (False, True)]


@pytest.mark.parametrize(("config", "seeds"), MEMORY, ids=[c.name.replace(" ", "-") for c, _ in MEMORY])
async def test_seeds_pass_in_memory(config: Config, seeds: int) -> None:
    tally = await explore.explore(config, range(seeds))
    assert not tally.failed, "\n\n".join(v.text() for v in tally.failed)
    assert tally.passed == seeds
    assert (tally.model_ops > 0) == config.tuning  # with tuning, agreements ran mid-program


def test_a_seed_is_the_same_program_and_schedule_every_time() -> None:
    for seed in range(20):
        a, b = program.generate(seed, 4, tuning=True), program.generate(seed, 4, tuning=True)
        assert a == b and a.describe() == b.describe()
        assert program.schedule(a, 2) == program.schedule(b, 2)
        assert [s.index for s in a.steps] == list(range(len(a.steps)))
    assert program.generate(1, 4) != program.generate(2, 4)


def test_programs_cover_every_operation_size_and_schedule() -> None:
    seen: collections.Counter[str] = collections.Counter()
    for seed in range(300):
        p = program.generate(seed, 4, tuning=seed % 2 == 1)
        for s in p.steps:
            seen[s.kind] += 1
            seen["sub-group"] += s.on is not None
            nbytes = int(np.prod(s.shape)) * reference.dtype_of(s.dtype or "uint8").itemsize
            seen["0 bytes"] += bool(s.shape) and nbytes == 0
            seen["MiB"] += nbytes >= 1 << 20
            seen["fixed algorithm"] += s.algorithm != "auto" and s.kind in algorithms.ALGORITHMS
            seen["out= buffers"] += s.out
            seen[f"dtype {s.dtype}"] += 1
            seen[f"op {s.op}"] += 1
        if p.cancel is not None:
            seen["cancel " + ("now" if p.cancel.after < 0 else "yields" if p.cancel.after == 0 else "later")] += 1
            seen["cancel of the awaiting task"] += p.cancel.how == "task"
        schedules = [program.schedule(p, r) for r in range(4)]
        orders = {tuple(a.together or (a.step,) for a in s if a.verb != "issue") for s in schedules}
        seen["per-rank await orders"] += len(orders) > 1
        seen["awaits gathered"] += any(a.verb == "gather" for s in schedules for a in s)
    for what in [*program.KINDS, "sub-group", "0 bytes", "MiB", "fixed algorithm", "out= buffers", "cancel now"]:
        assert seen[what] > 0, (what, seen)
    assert all(seen[f"dtype {d}"] for d in program.DTYPES) and all(seen[f"op {o}"] for o in ("avg", "bxor", "prod"))
    assert seen["cancel yields"] and seen["cancel later"] and seen["cancel of the awaiting task"]
    assert seen["per-rank await orders"] > 250 and seen["awaits gathered"] > 50


def _seed_with(ranks: int, want: str) -> int:
    """The first seed whose program has a world step described with ``want``."""
    for seed in range(1000):
        p = program.generate(seed, ranks)
        if any(s.on is None and want in s.describe(()) and np.prod(s.shape) > 0 for s in p.steps):
            return seed
    raise AssertionError(want)


async def test_a_wrong_value_fails_with_its_seed_and_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    seed = _seed_with(3, "all_reduce float32")
    ring = algorithms.ALGORITHMS["all_reduce"]

    def corrupting(real: Any) -> Any:
        async def algorithm(ch: Any, buf: np.ndarray, *args: Any, **kw: Any) -> None:
            await real(ch, buf, *args, **kw)
            if ch.rank == 1 and buf.dtype == np.float32 and buf.size:
                buf[-1] += 1  # one element, on one rank

        return algorithm

    for name, fn in list(ring.items()):
        monkeypatch.setitem(ring, name, corrupting(fn))
    verdict = await run_memory(seed, Config(3))
    assert not verdict.ok
    text = verdict.text()
    assert "WRONG VALUE" in text and "rank 1: #" in text, text
    assert f"--seed {seed} --ranks 3 --links memory --tuning off" in text, text
    assert program.generate(seed, 3).describe() in text


def test_results_that_differ_between_ranks_fail() -> None:
    """An all_reduce must be bit-identical on every rank: the world compares digests."""
    reports = [RankReport(3, r, digests={0: "aa", 1: "bb" if r == 2 else "cc"}) for r in range(3)]
    verdict = judge(3, Config(3), reports)
    assert verdict.failures == ["#1: ranks got different results (ranks by result: [[0, 1], [2]])"]
    assert judge(3, Config(3), reports[:2]).ok


async def test_a_hang_is_a_failure_naming_its_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    seed = _seed_with(3, "all_gather")

    async def stuck(ch: Any, buf: Any, **kw: Any) -> None:
        await asyncio.Event().wait()  # never delivers

    for name in list(algorithms.ALGORITHMS["all_gather"]):
        monkeypatch.setitem(algorithms.ALGORITHMS["all_gather"], name, stuck)
    verdict = await run_memory(seed, Config(3, timeout=0.5))
    assert not verdict.ok
    assert CollectiveTimeout.__name__ in verdict.text() and f"--seed {seed} " in verdict.text()


def test_a_cancelled_step_may_end_three_ways_and_no_other() -> None:
    """The rules of a cancelled step: its result, CancelledError where it was cancelled,
    CollectiveCancelled naming the cancelling rank elsewhere; never a wrong value."""
    step = program.Step(0, "all_reduce", dtype="int32", shape=(4,), op="sum")
    p = program.Program(5, 3, False, (step,), program.Cancel(0, 1, -1.0))
    right = reference.expected(p, step, 0)

    class Rank:
        def __init__(self, rank: int) -> None:
            self.rank = rank

    def failures(rank: int, value: Any, error: BaseException | None) -> list[str]:
        runner = Runner(Rank(rank), p)  # type: ignore[arg-type]
        runner.verdict(step, value, error)
        return runner.report.failures

    assert failures(0, right, None) == [] and failures(1, right, None) == []
    assert failures(1, None, asyncio.CancelledError()) == []
    assert failures(0, None, CollectiveCancelled("cancelled on rank 1", ranks=(1,))) == []
    assert failures(0, None, CollectiveCancelled("cancelled on rank 2", ranks=(2,)))  # names the wrong rank
    assert failures(0, None, asyncio.CancelledError())  # not cancelled here
    assert failures(1, None, CollectiveCancelled("cancelled on rank 1", ranks=(1,)))
    assert "WRONG VALUE" in failures(2, right + 1, None)[0]
    other = program.Program(5, 3, False, (step,), None)
    runner = Runner(Rank(0), other)  # type: ignore[arg-type]
    runner.verdict(step, None, CollectiveCancelled("cancelled on rank 1", ranks=(1,)))
    assert runner.report.failures  # no cancel in the program: any error fails


def test_the_command_line_runs_seeds_and_says_how_to_replay(capsys: pytest.CaptureFixture[str]) -> None:
    level = logging.getLogger("netcoll").level
    assert explore.main(["--ranks", "2,3", "--seeds", "0:5,9", "--tuning", "on"]) == 0
    assert logging.getLogger("netcoll").level == level  # quiet while it ran, as it was after
    out = capsys.readouterr().out
    assert "2 ranks memory tuning on: 6 seeds passed" in out and "3 ranks memory tuning on: 6 seeds passed" in out
    assert explore.parse_seeds("0:3,7") == [0, 1, 2, 7]
    config = Config(4, "shm", "netcoll", True, scenario="pair")
    assert config.command([5, 6]) == (
        "python3 bench/explore.py --seeds 5,6 --ranks 4 --links shm --tuning on --loop netcoll --per-world 2 "
        "--timeout 20 --scenario pair"
    )
