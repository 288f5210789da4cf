"""What ``netcoll submit`` and ``netcoll status`` print about a job (issue 38, "Output"):
the algorithm that ran, not just ``auto``; what time/iter is wherever it is shown."""

from __future__ import annotations

from typing import Any

import pytest

from netcoll.cli.status import print_status
from netcoll.cli.submit import print_job


def record(**over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": 3,
        "op": "all_reduce",
        "state": "succeeded",
        "world_size": 2,
        "epoch": 1,
        "time_s": 0.5,
        "algbw": 0.1,
        "busbw": 0.1,
        "verified": True,
        "timings": {"0": [0.5], "1": [0.4]},
        "ranks": [],
        "spec": {"size": 1 << 20, "dtype": "float32", "reduce_op": "sum", "algorithm": "auto", "iters": 1},
        "model": {
            "0": {"choices": {"all_reduce": {"algorithm": "ring"}, "barrier": {"algorithm": "doubling"}}},
            "1": {"choices": {"all_reduce": {"algorithm": "ring"}}},
        },
    }
    rec.update(over)
    return rec


def data_line(rec: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    print_job(rec)
    return capsys.readouterr().out.splitlines()[1]


def test_auto_says_what_it_ran(capsys: pytest.CaptureFixture[str]) -> None:
    assert data_line(record(), capsys) == "  1 MiB float32 per rank, op sum, algorithm auto (ran ring), 1 iteration"


def test_a_fixed_algorithm_and_a_job_that_did_not_run_say_what_was_asked(capsys: pytest.CaptureFixture[str]) -> None:
    fixed = record(spec={**record()["spec"], "algorithm": "tree"})
    assert ", algorithm tree, " in data_line(fixed, capsys)
    assert ", algorithm auto, " in data_line(record(state="failed", model={}), capsys)
    assert ", algorithm auto, " in data_line(record(model={"0": {"choices": {}}}), capsys)


def test_status_says_what_time_per_iteration_is(capsys: pytest.CaptureFixture[str]) -> None:
    job = {"id": 3, "op": "all_reduce", "state": "succeeded", "world_size": 2, "time_s": 0.5, "busbw": 0.1}
    print_status({"members": [], "jobs": [job], "epoch": 1}, "127.0.0.1:29400", 10)
    out = capsys.readouterr().out
    assert "time/iter: the mean of each iteration's slowest rank" in out


def test_a_compressed_job_names_its_codec(capsys: pytest.CaptureFixture[str]) -> None:
    line = data_line(record(spec={**record()["spec"], "compression": "int8"}), capsys)
    assert line.startswith("  1 MiB float32 per rank, op sum, compression int8, algorithm auto")
    assert "compression" not in data_line(record(spec={**record()["spec"], "compression": None}), capsys)
