"""docs/compression.md's training tables are bench/losscurves.py's rendering of the committed
bench/losscurves-results.json; the JSON holds every codec with and without error feedback for
each scenario; thinning a curve keeps its first and last steps."""

from __future__ import annotations

import json

from bench.losscurves import SCENARIOS, SETTINGS, loss_at, name, render, thin
from tests.support import REPO


def test_docs_tables_come_from_the_committed_json() -> None:
    doc = json.loads((REPO / "bench" / "losscurves-results.json").read_text())
    page = (REPO / "docs" / "compression.md").read_text()
    assert render(doc) in page
    assert set(doc["scenarios"]) == set(SCENARIOS)
    for label, scenario in doc["scenarios"].items():
        assert list(scenario["runs"]) == [name(c, f) for c, f in SETTINGS], label
        steps = {run["steps"] for run in scenario["runs"].values()}
        assert len(steps) == 1, label
        none = scenario["runs"]["none"]
        assert none["final"] < none["loss"][0], label  # it trained


def test_thin_keeps_the_ends_and_loss_at_reads_them() -> None:
    losses = [float(v) for v in range(1, 1202)]  # 1201 steps
    every, kept = thin(losses)
    assert every == 3 and kept[0] == 1.0 and kept[-1] == 1201.0 and len(kept) <= 500 + 1
    run = {"steps": 1201, "every": every, "loss": kept}
    assert loss_at(run, 0) == 1.0 and loss_at(run, 1200) == 1201.0 and loss_at(run, 600) == 601.0
    assert thin([0.5, 0.25]) == (1, [0.5, 0.25])
