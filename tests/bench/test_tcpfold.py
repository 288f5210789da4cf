"""bench/tcpfold.py, the measurement behind folding over TCP: both ways of receiving a
reduction's segment give the right sums (it checks each) and it reports both, over
loopback only; bad arguments are refused."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import REPO
from tests.support.env import subprocess_env

ENV = subprocess_env()  # the script imports netcoll: this checkout's, installed or not


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "bench/tcpfold.py", *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60
    )


@pytest.mark.tcp
def test_it_measures_both_ways_and_checks_the_sums() -> None:
    out = run("--size", "64K", "--iters", "5", "--rounds", "2", "--piece", "10K")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["whole", "pieces"]
    for line in lines:
        assert re.fullmatch(r"\w+: \d+ us wall, \d+ us receiver CPU per 65536 bytes", line), line


@pytest.mark.parametrize("args", [["--size", "lots"], ["--size", "6"], ["--iters", "0"], ["--piece", "2"]])
def test_bad_arguments_are_refused(args: list[str]) -> None:
    out = run(*args)
    assert out.returncode == 2 and "error:" in out.stderr
