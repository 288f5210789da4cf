"""examples/training/torch_ddp.py, as its docstring runs it: ``netcoll run -n 4``; DDP
on the netcoll backend against the same training in one process."""

from __future__ import annotations

import re

import pytest

from tests.support import REPO

from .launch import run

pytestmark = pytest.mark.tcp


@pytest.mark.timeout(400)
def test_torch_ddp_example_matches_one_process() -> None:
    done = run(4, str(REPO / "examples" / "training" / "torch_ddp.py"))
    assert done.returncode == 0, done.output[-5000:]
    for rank in range(4):
        assert re.search(rf"\[rank {rank}\] rank {rank}: loss .* bit-identical on all ranks: True", done.output)
    found = re.search(r"4 ranks x 20 steps: max \|DDP - single process\| = (\S+) ", done.output)
    assert found and float(found.group(1)) <= 1e-5, done.output[-3000:]
    assert "[rank 0] OK" in done.output


@pytest.mark.timeout(400)
def test_torch_ddp_example_with_the_compression_hook() -> None:
    done = run(4, str(REPO / "examples" / "training" / "torch_ddp.py"), "--compression", "int8", "--error-feedback")
    assert done.returncode == 0, done.output[-5000:]
    for rank in range(4):
        assert re.search(rf"\[rank {rank}\] rank {rank}: loss .* bit-identical on all ranks: True", done.output)
    found = re.search(
        r"4 ranks x 20 steps, int8 with error feedback: final loss (\S+), single process uncompressed (\S+) "
        r"\(allowed: (\S+) apart\)",
        done.output,
    )
    assert found, done.output[-3000:]
    final, reference, allowed = map(float, found.groups())
    assert abs(final - reference) <= allowed
    assert "[rank 0] OK" in done.output
