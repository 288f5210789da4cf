"""``netcoll submit`` explains why its time per iteration sits above every rank's
mean (issue 38, item 5): it is the mean of each iteration's slowest rank."""

from __future__ import annotations

import pytest

from netcoll.cli.submit import print_job


def test_the_job_output_says_what_time_per_iteration_is(capsys: pytest.CaptureFixture[str]) -> None:
    rec = {
        "id": 1,
        "op": "all_reduce",
        "state": "succeeded",
        "world_size": 2,
        "epoch": 1,
        "time_s": 3.0,  # iterations: (1, 3) and (3, 1) -> slowest 3 and 3 -> 3.0; the means are 2.0
        "algbw": 0.1,
        "busbw": 0.1,
        "verified": True,
        "timings": {"0": [1.0, 3.0], "1": [3.0, 1.0]},
        "ranks": [{"rank": 0, "address": "127.0.0.2:1"}, {"rank": 1, "address": "127.0.0.3:1"}],
        "spec": {"size": 1024, "dtype": "float32", "reduce_op": "sum", "algorithm": "auto", "iters": 2},
    }
    print_job(rec)
    lines = capsys.readouterr().out.splitlines()
    assert any("time 3.000 s/iter" in line for line in lines)
    assert sum(line.strip().endswith("2.000 s") for line in lines) == 2  # each rank's mean
    assert lines[-1].strip() == (
        "(time/iter is the mean of each iteration's slowest rank, so it is at least every rank's mean)"
    )
