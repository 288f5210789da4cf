"""``python -m netcoll.bench.versus``: the table's two verdicts (time, choice)."""

from __future__ import annotations

from netcoll.bench.versus import table


def test_time_and_choice_verdicts() -> None:
    cells = {
        ("all_reduce", 1 << 20): {  # the right choice, but its own run was noisy: time SLOW, choice ok
            "auto": {"time_us": 130.0, "algorithm": "auto:ring", "segment_bytes": 1 << 20, "predicted_us": 90.0},
            "ring": {"time_us": 100.0},
            "tree": {"time_us": 150.0},
        },
        ("reduce", 4096): {  # a wrong choice that happened to run fast: time ok, choice not
            "auto": {"time_us": 105.0, "algorithm": "auto:tree", "segment_bytes": 0, "predicted_us": None},
            "ring": {"time_us": 100.0},
            "tree": {"time_us": 140.0},
        },
        ("gather", 64): {"ring": {"time_us": 1.0}},  # no auto run: left out
    }
    rows, text = table(cells, 0.10)
    assert [(r["op"], r["ok"], r["choice_ok"]) for r in rows] == [("all_reduce", False, True), ("reduce", True, False)]
    assert rows[0]["choice_ratio"] == 1.0 and rows[1]["choice_ratio"] == 1.4
    assert "1.40!" in text and "SLOW" in text
    assert text.splitlines()[-1].startswith("within 10% of the best fixed algorithm: time 1 of 2 cells, choice 1 of 2")
