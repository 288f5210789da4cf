"""bench/floor.py, the asyncio floor netcoll's small-message latency is compared
with (docs/performance.md): it runs, computes the right sum, and reports. Loopback only."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import REPO
from tests.support.env import subprocess_env

ENV = subprocess_env()  # the script imports netcoll: this checkout's, installed or not


@pytest.mark.parametrize(("flags", "what"), [((), ""), (("--shm",), r" \(shared memory\)")])
def test_the_floor_runs_real_processes_and_reports_the_slowest_rank(flags: tuple[str, ...], what: str) -> None:
    out = subprocess.run(
        [sys.executable, "bench/floor.py", "--ranks", "4", "--iters", "50", *flags],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr  # each rank asserts the all_reduce's sum
    m = re.fullmatch(rf"asyncio floor{what}, 4 processes, 4-byte all_reduce: median per call (\d+) µs .*\n", out.stdout)
    assert m and int(m.group(1)) > 0, out.stdout


@pytest.mark.parametrize("ranks", ["3", "1"])
def test_the_floor_wants_a_power_of_two(ranks: str) -> None:
    out = subprocess.run(
        [sys.executable, "bench/floor.py", "--ranks", ranks],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "power of two" in out.stderr
