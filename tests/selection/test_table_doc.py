"""docs/algorithms.md's fixed table says what netcoll/selection/table.py holds: every constant,
its value, and the figures that set it, which come from bench/table-measurements.json (issue 37:
every figure in the reference pages from committed JSON)."""

from __future__ import annotations

import json
import re

from netcoll.selection import table
from netcoll.sizes import format_size
from tests.support import REPO


def _rows() -> dict[str, list[str]]:
    text = (REPO / "docs" / "algorithms.md").read_text()
    start = text.index("| constant | value | meaning | measured")
    rows = text[start : text.index("\n\n", start)].splitlines()[2:]
    cells = (re.split(r"(?<!\\)\|", r.strip().strip("|")) for r in rows)
    return {c[0].strip().strip("`"): [x.strip() for x in c[1:]] for c in cells}


def test_the_fixed_table_in_the_docs_is_the_code_and_the_committed_measurements() -> None:
    rows = _rows()
    recorded = json.loads((REPO / "bench" / "table-measurements.json").read_text())["constants"]
    assert set(rows) == set(recorded)
    for name, (value, _meaning, measured) in rows.items():
        actual = getattr(table, name)
        shown = format_size(actual) if "_BYTES" in name else str(actual)
        assert value == shown == recorded[name]["value"], name
        assert measured == recorded[name]["measured"], name
