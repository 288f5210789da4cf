"""With ``--json``, stdout gets one JSON object whatever happens (issue 38, item 4): a
coordinator that cannot be reached, a bad setting, Ctrl-C. The error still goes to
stderr as one line, with its exit code."""

from __future__ import annotations

import json
import socket

import pytest

from netcoll.cli import main
from netcoll.cli.common import CliError, JsonDoc


@pytest.fixture
def nobody() -> str:
    """HOST:PORT where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("command", [["submit", "all_reduce"], ["status"]])
def test_an_unreachable_coordinator_still_gives_one_json_object(
    command: list[str], nobody: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--json", "--coordinator", nobody, "--connect-timeout", "5"]) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)  # one object, and nothing else
    assert out.count("\n") == 1
    assert doc["state"] == "error" and doc["exit_code"] == 1 and doc["coordinator"] == nobody
    assert doc["error"].startswith(f"cannot reach the coordinator at {nobody}")
    assert err.strip().endswith(doc["error"])


def test_a_bad_setting_gives_one_json_object_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "all_reduce", "--json", "--connect-timeout", "-1"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"] == "error" and doc["exit_code"] == 2 and "--connect-timeout" in doc["error"]


def test_an_interrupted_job_gives_its_id_and_state(capsys: pytest.CaptureFixture[str]) -> None:
    for exc, state, code in (
        (CliError("interrupted: cancelled job 7", 130), "interrupted", 130),
        (KeyboardInterrupt(), "interrupted", 130),
    ):
        with pytest.raises(type(exc)), JsonDoc(True, coordinator="h:1") as doc:
            doc["id"] = 7
            raise exc
        assert json.loads(capsys.readouterr().out) == {
            "coordinator": "h:1",
            "id": 7,
            "state": state,
            "error": str(exc) or "interrupted",
            "exit_code": code,
        }


def test_without_json_or_on_success_it_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(CliError), JsonDoc(False):
        raise CliError("no")
    with JsonDoc(True):
        pass
    assert capsys.readouterr().out == ""
