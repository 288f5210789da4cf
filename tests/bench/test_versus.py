"""``python -m netcoll.bench.versus``: the table's two verdicts (time, choice)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from netcoll.bench import sweep, versus
from netcoll.bench.common import SweepConfig
from netcoll.bench.remote import run_remote
from netcoll.bench.versus import table
from tests.support import run_world


def test_time_and_choice_verdicts() -> None:
    cells = {
        ("all_reduce", 1 << 20): {  # the right choice, but its own run was noisy: time SLOW, choice ok
            "auto": {"time_us": 130.0, "algorithm": "auto:ring", "segment_bytes": 1 << 20, "predicted_us": 90.0},
            "ring": {"time_us": 100.0},
            "tree": {"time_us": 150.0},
        },
        ("reduce", 4096): {  # a wrong choice that happened to run fast: time ok, choice not
            "auto": {"time_us": 105.0, "algorithm": "auto:tree", "segment_bytes": 0, "predicted_us": None},
            "ring": {"time_us": 100.0},
            "tree": {"time_us": 140.0},
        },
        ("gather", 64): {"ring": {"time_us": 1.0}},  # no auto run: left out
    }
    rows, text = table(cells, 0.10)
    assert [(r["op"], r["ok"], r["choice_ok"]) for r in rows] == [("all_reduce", False, True), ("reduce", True, False)]
    assert rows[0]["choice_ratio"] == 1.0 and rows[1]["choice_ratio"] == 1.4
    assert "1.40!" in text and "SLOW" in text
    assert text.splitlines()[-1].startswith("within 10% of the best fixed algorithm: time 1 of 2 cells, choice 1 of 2")


# -- --interleave: every algorithm alternating in one group --------------------------------------
async def test_an_alternating_sweep_times_every_algorithm_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each size runs a block of each algorithm the collective has (auto included), the order
    reversed every other round; one row per algorithm over all its calls, verified, and
    auto's row names what auto ran."""
    real = sweep._measure
    order: list[tuple[int, str, int, bool]] = []

    async def measure(comm: Any, g: Any, cfg: SweepConfig, data: Any) -> Any:
        if comm.rank == 0:
            order.append((g.size, cfg.algorithm, cfg.warmup, cfg.check))
        return await real(comm, g, cfg, data)

    monkeypatch.setattr(sweep, "_measure", measure)
    cfg = SweepConfig(
        ops=["all_reduce", "broadcast"], minbytes=4096, maxbytes=4096, iters=3, warmup=2,
        alternate=["auto", "ring", "tree", "sized"], rounds=3,
    ).validate()  # fmt: skip
    rows = (await run_world(3, lambda c: sweep.run_sweep(c, cfg)))[0]
    assert [(r["op"], r["algorithm"].split(":")[0]) for r in rows] == [
        ("all_reduce", "auto"), ("all_reduce", "ring"), ("all_reduce", "tree"),  # the last round: forwards
        ("broadcast", "auto"), ("broadcast", "ring"), ("broadcast", "tree"), ("broadcast", "sized"),
    ]  # fmt: skip
    assert all(r["wrong"] == 0 and r["iters"] == 9 and r["time_us"] > 0 for r in rows)
    assert rows[0]["algorithm"].startswith("auto:") and rows[3]["algorithm"].startswith("auto:")
    ar = [(a, w, c) for size, a, w, c in order[:9]]
    assert ar == [
        ("auto", 2, False), ("ring", 2, False), ("tree", 2, False),  # warmed up before the first block
        ("tree", 0, False), ("ring", 0, False), ("auto", 0, False),  # reversed
        ("auto", 0, True), ("ring", 0, True), ("tree", 0, True),  # the last block is verified
    ]  # fmt: skip


def test_alternating_needs_known_algorithms_and_a_local_cluster() -> None:
    with pytest.raises(ValueError, match="cannot alternate 'halving'"):
        SweepConfig(ops=["broadcast"], alternate=["auto", "halving"]).validate()
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        SweepConfig(rounds=0).validate()
    cfg = SweepConfig(alternate=["ring"]).validate()
    with pytest.raises(ValueError, match="local cluster only"):
        asyncio.run(run_remote(cfg, "127.0.0.1:1"))


async def test_interleave_keeps_one_row_per_algorithm_and_the_statistic(monkeypatch: pytest.MonkeyPatch) -> None:
    got: list[SweepConfig] = []

    async def fake(cfg: SweepConfig, ranks: int) -> dict[str, Any]:
        got.append(cfg)
        row = {"op": "all_reduce", "size": 64}
        return {
            "rows": [
                {**row, "algorithm": "auto:ring", "time_us": 9.0, "median_us": 5.0, "segment_bytes": 0},
                {**row, "algorithm": "ring", "time_us": 8.0, "median_us": 4.0},
                {**row, "algorithm": "tree", "time_us": 7.0, "median_us": 6.0},
            ]
        }

    monkeypatch.setattr(versus, "run_local", fake)
    ns = versus._parser().parse_args(["all_reduce", "--interleave", "--rounds", "3", "--statistic", "median"])
    cells = await versus.collect(ns)
    assert got[0].alternate == versus._runs(["all_reduce"]) and got[0].rounds == 3 and not got[0].check
    runs = cells[("all_reduce", 64)]
    assert {k: v["time_us"] for k, v in runs.items()} == {"auto": 5.0, "ring": 4.0, "tree": 6.0}
    rows, _ = versus.table(cells, 0.10)
    assert rows[0]["best"] == "ring" and rows[0]["ratio"] == 1.25 and rows[0]["choice_ratio"] == 1.0
