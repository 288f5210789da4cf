"""Strings from peers (member ids, addresses, job errors) reach the terminal
escaped: no ANSI sequences, no forged lines (issue 10, finding 9)."""

from __future__ import annotations

import pytest

from netcoll.cli.errors import one_line
from netcoll.cli.status import print_status
from netcoll.cli.submit import print_job

EVIL = "m\x1b[2J\x1b]0;owned\x07\nfake line\u202e"


def _clean(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert not any(line.startswith("fake line") for line in text.splitlines())


def test_status_escapes_member_ids_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    status = {
        "members": [{"rank": 0, "member_id": EVIL, "address": EVIL, "state": "ready", "current_job": None}],
        "jobs": [{"id": 1, "op": EVIL, "state": "failed", "world_size": 1, "error": EVIL}],
        "queue": [],
        "epoch": 1,
    }
    print_status(status, "127.0.0.1:29400", 5)
    out = capsys.readouterr().out
    _clean(out)
    assert "\\x1b[2J" in out
    assert not any(line.startswith("fake line") for line in out.splitlines())


def test_job_output_and_errors_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    rec = {
        "id": 3,
        "op": "all_reduce",
        "state": EVIL,
        "world_size": 1,
        "epoch": 1,
        "timings": {"0": [1e-3]},
        "ranks": [{"rank": 0, "address": EVIL}],
        "spec": {},
    }
    print_job(rec)
    _clean(capsys.readouterr().out)
    message = one_line(RuntimeError(EVIL))
    _clean(message)
    assert "\n" not in message
