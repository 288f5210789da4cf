"""bench/cma.py, the CMA-against-memcpy measurement behind the shm link's design:
it copies the right bytes both ways and reports both rates, or says why the
kernel refused the read, and rejects bad arguments."""

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
        [sys.executable, "bench/cma.py", *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process_vm_readv is Linux only")
def test_it_measures_both_copies_or_says_why_not() -> None:
    out = run("--size", "256K", "--iters", "5")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    if lines[0].startswith("cma: not measured:"):  # a kernel that refuses ptrace-like reads
        assert "refused" in lines[0]
        return
    assert [line.split(":")[0] for line in lines] == ["cma", "memcpy"]
    for line in lines:
        assert re.fullmatch(r"\w+: \d+ us per 262144 bytes = \d+\.\d\d GB/s", line), line


@pytest.mark.parametrize("args", [["--size", "lots"], ["--size", "0"], ["--iters", "0"]])
def test_bad_arguments_are_refused(args: list[str]) -> None:
    out = run(*args)
    assert out.returncode == 2 and "error:" in out.stderr
