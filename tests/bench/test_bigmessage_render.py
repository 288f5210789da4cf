"""bench/bigmessage.py --render: the docs' table of large messages comes from its JSON."""

from __future__ import annotations

import json
from pathlib import Path

from bench import bigmessage


def test_render_shows_each_row_and_a_failed_one_as_failed(tmp_path: Path) -> None:
    ok = {"op": "all_reduce", "bytes": 1 << 30, "ranks": 4, "links": "tcp", "settings": "minimum", "ok": True}
    ok.update(seconds=2.9051, first_s=8.386, busbw_gbs=0.555, peak_rss=[1 << 30, 3 << 29])
    bad = {"op": "broadcast", "bytes": 1 << 30, "ranks": 4, "links": "shm", "settings": "default", "ok": False}
    bad["error"] = "no result within 900s"
    path = tmp_path / "big.json"
    path.write_text(
        json.dumps({"date": "2026-11-29 03:02 UTC", "machine": {"cpus": 2, "python": "3.11.7"}, "rows": [ok, bad]})
    )
    lines = bigmessage.render(str(path)).splitlines()
    assert lines[2] == "| all_reduce | tcp | minimum | 2.91 | 8.39 | 0.56 | 1.50 GiB | yes |"
    assert lines[3] == "| broadcast | shm | default | | | | | NO: no result within 900s |"
    assert lines[-1].startswith("_1 GiB per rank at 4 ranks; 2026-11-29 03:02 UTC; 2 CPUs")
