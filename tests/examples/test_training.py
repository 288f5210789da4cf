"""The training examples (examples/training/): each is one command, and each
checks its distributed result against a single-process numpy computation
(exit status 1 and an AssertionError otherwise)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = pytest.mark.tcp

EXAMPLES = REPO / "examples" / "training"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("script", "ranks", "says"),
    [
        (
            "ddp.py",
            4,
            r"ddp: 20 steps on 4 ranks; parameters identical on every rank; max \|difference\| from "
            r"single-process training \d\.\de-\d\d",
        ),
        ("zero3.py", 3, r"zero3: 20 steps on 3 ranks, 107 of 321 parameters per rank; max \|difference\|"),
        ("tensor_parallel.py", 4, r"tensor_parallel: 20 steps on 4 ranks, hidden 32 split 8 per rank; "),
        (
            "moe.py",
            4,
            r"moe: 38 tokens on 4 ranks routed to 4 experts; tokens per expert \[\d+, \d+, \d+, \d+\]; "
            r"every rank's outputs match",
        ),
        ("pipeline.py", 4, r"pipeline: 10 batches of 4 micro-batches through 4 stages; max \|difference\|"),
    ],
)
def test_training_example(script: str, ranks: int, says: str) -> None:
    proc = run("-m", "netcoll", "run", "-n", str(ranks), str(EXAMPLES / script))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.fullmatch(rf"\[rank 0\] {says}.*", proc.stdout.strip()), proc.stdout


def test_push_weights_example() -> None:
    proc = run(str(EXAMPLES / "push_weights.py"), "--replicas", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    for v in (1, 2, 3):
        assert any(line.startswith(f"version {v}: 65536 bytes on all 3 replicas in ") for line in lines), lines
    assert lines[-1] == "push_weights: every replica holds each new version, bit for bit"


@pytest.mark.parametrize("flags", [["--compression", "bf16"], ["--compression", "int8", "--error-feedback"]])
def test_ddp_example_compressed(flags: list[str], tmp_path: Path) -> None:
    """Under a codec: parameters still identical on every rank (the example asserts it),
    the final loss within the stated tolerance of uncompressed training's, and the loss
    curve written."""
    losses = tmp_path / "losses.json"
    proc = run(
        "-m", "netcoll", "run", "-n", "4", str(EXAMPLES / "ddp.py"), *flags, "--steps", "40", "--losses", str(losses)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    feedback = " with error feedback" if "--error-feedback" in flags else ""
    says = (
        rf"\[rank 0\] ddp: 40 steps on 4 ranks, {flags[1]}{feedback}; parameters identical on every rank; "
        r"final loss (\S+), uncompressed (\S+) \(allowed: (\S+) apart\)"
    )
    found = re.fullmatch(says, proc.stdout.strip())
    assert found, proc.stdout
    final, reference, allowed = map(float, found.groups())
    assert abs(final - reference) <= allowed
    curve = json.loads(losses.read_text())
    assert curve["compression"] == flags[1] and curve["error_feedback"] == bool(feedback)
    assert len(curve["loss"]) == 40 and curve["loss"][-1] < curve["loss"][0]
    assert curve["final"] == pytest.approx(final, rel=1e-3) and curve["reference"] == pytest.approx(reference, rel=1e-3)
