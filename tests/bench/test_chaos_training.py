"""bench/chaos_training.py: its table in docs/training.md is the committed JSON
rendered, and a short chaos run (60 steps, one kill and a replacement) ends right."""

from __future__ import annotations

import asyncio
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import netcoll
import netcoll.sync
from bench import chaos_training, chaoslib
from tests.support import REPO
from tests.support.env import run_session
from tests.support.loops import LoopThread

FAILURE = {"kill_step": 22, "victim_rank": 0, "recovery_s": 0.2314, "detect_s": 0.055, "regroup_s": 0.228}
FAILURE |= {"steps_lost": 1, "steps_repeated": 0, "join_s": 2.02, "joined_at_step": 35}


def test_render_shows_each_failure_and_the_summary(tmp_path: Path) -> None:
    late = dict(FAILURE, kill_step=42, victim_rank=1, recovery_s=0.5, detect_s=None, join_s=None, joined_at_step=None)
    final = {"ranks": 4, "identical": True, "steps": 220, "eval_loss": 0.0717, "reference_eval_loss": 0.0716}
    final |= {"loss_diff_pct": 0.1397, "max_param_diff": 1.5e-7}
    machine = {"cpus": 2, "cpu": "Xeon", "python": "3.11.7", "numpy": "2.4", "netcoll": "0.1.0", "commit": "abc"}
    config = {"steps": 220, "ranks": 4, "kill_every": 20, "regroup_every": 5, "pause": 0.1, "batch": 48}
    data = {"date": "2026-11-29 06:30 UTC", "machine": machine, "config": config, "load_before": 3.5}
    data |= {"load_after": 4.0, "failures": [FAILURE, late], "final": final}
    path = tmp_path / "chaos.json"
    path.write_text(json.dumps(data))
    lines = chaos_training.render(str(path)).splitlines()
    assert lines[2] == "| 22 | 0 | 0.231 | 0.055 | 0.228 | 1 | 0 | 2.02 | 35 |"
    assert lines[3] == "| 42 | 1 | 0.500 | – | 0.228 | 1 | 0 | – | – |"
    assert "kill → next completed step median 0.366 s, worst 0.500 s" in lines[5]
    assert "bit-identical on the 4 ranks: yes" in lines[5] and "0.14 % apart" in lines[5]
    assert lines[-1].startswith("_2026-11-29 06:30 UTC; 2 CPUs (Xeon)") and "load average 3.5 → 4.0" in lines[-1]


def test_the_docs_table_is_the_committed_json_rendered() -> None:
    docs = (REPO / "docs" / "training.md").read_text()
    table = chaos_training.render(str(REPO / "bench" / "chaos-training-results.json"))
    want = chaos_training.docs_with(docs, table)
    assert want == docs, "run: python3 -m bench.chaos_training --docs bench/chaos-training-results.json"


def test_a_step_split_over_any_world_is_the_whole_batch_step() -> None:
    """What makes a step done again after a failure the same step: the average of the
    shards' gradients is the whole batch's, at 3 ranks as at 4."""
    params, _ = chaoslib.init()
    whole = chaoslib.flat(chaoslib.loss_and_grads(params, *chaoslib.batch(5))[1])
    for world in (3, 4):
        parts = [chaoslib.flat(chaoslib.loss_and_grads(params, *chaoslib.shard(5, r, world))[1]) for r in range(world)]
        np.testing.assert_allclose(np.mean(parts, axis=0), whole, rtol=1e-4, atol=1e-7)


@pytest.mark.slow
@pytest.mark.tcp
@pytest.mark.timeout(400)
def test_a_short_chaos_run_recovers_and_ends_as_without_failures(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    # one kill, after step 27; 33 steps of 0.15 s left for the replacement to start on a busy machine
    args = ["--steps", "60", "--kill-every", "25", "--pause", "0.15", "--json", str(out)]
    returncode, text = run_session([sys.executable, "-m", "bench.chaos_training", *args], cwd=REPO)
    assert returncode == 0, text[-4000:]
    data = json.loads(out.read_text())
    (failure,) = data["failures"]
    assert failure["kill_step"] >= 27 and failure["steps_lost"] <= 1 and failure["steps_repeated"] == 0
    assert failure["joined_at_step"] is not None
    assert data["final"]["identical"] and data["final"]["ranks"] == 4 and data["final"]["steps"] == 60
    assert data["final"]["loss_diff_pct"] < 1.0


def test_survivors_a_step_apart_all_take_the_most_advanced_state() -> None:
    """chaoslib.recover: a collective that ended on some ranks and failed on others leaves
    survivors a step apart; every rank goes on from the finished step's state."""
    thread = LoopThread("coordinator")
    coord = netcoll.Coordinator()
    asyncio.run_coroutine_threadsafe(coord.__aenter__(), thread.loop).result(30)

    def rank_main(rank: int) -> tuple[int, chaoslib.Params, chaoslib.Params]:
        p, m = chaoslib.init()
        step = 4 if rank == 1 else 5  # rank 1 failed step 5, ranks 0 and 2 finished it
        for k in p:
            p[k] += step
            m[k] += 10 * step
        with netcoll.sync.connect(coord.address, world_size=3, rank=rank, group="apart", timeout=30) as comm:
            return chaoslib.recover(comm, p, m, step), p, m

    try:
        with ThreadPoolExecutor(3) as pool:
            got = [f.result(60) for f in [pool.submit(rank_main, r) for r in range(3)]]
    finally:
        asyncio.run_coroutine_threadsafe(coord.__aexit__(None, None, None), thread.loop).result(30)
        thread.stop()
    want_p, want_m = chaoslib.init()
    for step, p, m in got:
        assert step == 5
        for k in p:
            np.testing.assert_array_equal(p[k], want_p[k] + 5)
            np.testing.assert_array_equal(m[k], want_m[k] + 50)
