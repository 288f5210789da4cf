"""docs/compression.md's measured tables are bench/compression.py's rendering of the
committed bench/compression-results.json, and that JSON meets the contract's ceilings."""

from __future__ import annotations

import json

from bench.compression import render
from tests.support import REPO


def test_docs_tables_come_from_the_committed_json() -> None:
    doc = json.loads((REPO / "bench" / "compression-results.json").read_text())
    page = (REPO / "docs" / "compression.md").read_text()
    assert render(doc) in page
    for name, row in doc["bytes_ratio"].items():
        assert row["fp16"] <= 0.55 and row["bf16"] <= 0.55 and row["int8"] <= 0.30, name
    for label, per in doc["errors"].items():
        assert per["all_gather"]["int8"]["max_abs_rel"] <= 1 / 254 * 1.001, label
        assert per["all_gather"]["fp16"]["max_abs_rel"] <= 2.0**-11, label
        assert per["all_gather"]["bf16"]["max_abs_rel"] <= 2.0**-8, label
