"""bench/heal.py --render: the heal table of docs/training.md comes from its committed JSON."""

from __future__ import annotations

import json
from pathlib import Path

from bench import heal
from tests.support import REPO


def test_render_shows_each_row_and_a_failed_one_as_failed(tmp_path: Path) -> None:
    ok = {"bytes": 1 << 30, "ranks": 4, "joiners": 1, "links": "tcp", "ok": True, "load_before": 3.5}
    ok.update(seconds_crc32=[1.5, 1.204, 1.3], median_crc32_s=1.3, seconds_none=[1.0, 1.1, 0.9], median_none_s=1.0)
    ok.update(gbs=0.826, peak_rss=[1 << 30, 3 << 29], load_after=2.25)
    bad = {"bytes": 1 << 30, "ranks": 4, "joiners": 1, "links": "shm", "ok": False, "error": "no result within 900s"}
    machine = {"cpus": 2, "cpu": "Xeon", "python": "3.11.7", "numpy": "2.4", "netcoll": "0.1.0", "commit": "abc"}
    path = tmp_path / "heal.json"
    data = {"date": "2026-11-29 05:30 UTC", "machine": machine, "crc32_s_per_gib": 0.41}
    path.write_text(json.dumps({**data, "rows": [ok, bad]}))
    lines = heal.render(str(path)).splitlines()
    want = "| 1 GiB | 4 (1) | tcp | 1.30 | 0.83 | 1.50, 1.20, 1.30 | 1.00 | 1.50 GiB | 3.5 → 2.25 | yes |"
    assert lines[2] == want
    assert lines[3] == "| 1 GiB | 4 (1) | shm | | | | | | | NO: no result within 900s |"
    assert lines[-1].startswith("_2026-11-29 05:30 UTC; 2 CPUs (Xeon)")
    assert "CRC-32 over 1 GiB on one core: 0.41 s" in lines[-1]


def test_the_docs_table_is_the_committed_json_rendered() -> None:
    docs = (REPO / "docs" / "training.md").read_text()
    table = heal.render(str(REPO / "bench" / "heal-results.json"))
    assert heal.docs_with(docs, table) == docs, "run: python3 bench/heal.py --docs bench/heal-results.json"
    assert "| 1 GiB | 4 (1) | tcp |" in table and "| 1 GiB | 4 (1) | shm |" in table
