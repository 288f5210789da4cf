"""Secure by default (issue 10, finding 4): a coordinator or rank daemon asked to
listen off loopback without credentials refuses to start (exit 2, one line) unless
``--insecure``; tokens may come from files; member and client tokens are checked.

Binding 0.0.0.0 locally is fine here; every connection goes to 127.0.0.1 only."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netcoll.config import ClientConfig, ConfigError, CoordinatorConfig, RankConfig, is_loopback
from tests.support.env import subprocess_env as env_of

MEMBER, CLIENT = "member-s3cret", "client-s3cret"
REFUSED = "without credentials"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netcoll", *args],
        env=env or env_of(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@contextlib.contextmanager
def coordinator(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """A ``netcoll coordinator`` process, until it is ready; stopped (SIGTERM, by its pid) after."""
    ready = tmp / "ready.json"
    log = open(tmp / "coordinator.log", "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "netcoll",
            "coordinator",
            "--port",
            "0",
            "--http-port",
            "off",
            *args,
            "--ready-file",
            str(ready),
        ],
        env=env or env_of(),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"the coordinator did not start (exit {proc.returncode}): {log.read()}")
            time.sleep(0.05)
        time.sleep(0.05)  # the file is written in one go, but be sure it is complete
        yield {"info": json.loads(ready.read_text()), "proc": proc}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        log.close()


def loopback_address(info: dict[str, Any]) -> str:
    """The coordinator's address, dialled on 127.0.0.1 (it may listen on 0.0.0.0)."""
    return "127.0.0.1:" + str(info["address"]).rpartition(":")[2]


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# -- refusing to start ----------------------------------------------------------------------------
def test_coordinator_off_loopback_without_a_token_refuses_to_start() -> None:
    proc = run_cli("coordinator", "--host", "0.0.0.0", "--port", "0", "--http-port", "off")
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc)
    assert line.startswith("netcoll coordinator: refusing to start the coordinator on 0.0.0.0 without credentials")
    assert "NETCOLL_TOKEN" in line and "--insecure" in line


def test_rank_off_loopback_without_a_token_refuses_to_start() -> None:
    # the rank default is 0.0.0.0; it refuses before dialling anything
    proc = run_cli("rank", "--coordinator", "127.0.0.1:9", "--port", "0", "--http-port", "off")
    assert proc.returncode == 2, proc.stderr
    assert REFUSED in one_line(proc) and "--insecure" in proc.stderr


def test_configuration_mistakes_exit_2(tmp_path: Path) -> None:
    proc = run_cli("coordinator", "--port", "0", "--http-port", "off", env=env_of(NETCOLL_CLIENT_TOKEN=CLIENT))
    assert proc.returncode == 2 and "set a member token too" in one_line(proc)
    same = env_of(NETCOLL_TOKEN=MEMBER, NETCOLL_CLIENT_TOKEN=MEMBER)
    proc = run_cli("coordinator", "--port", "0", "--http-port", "off", env=same)
    assert proc.returncode == 2 and "must differ" in one_line(proc)
    missing = env_of(NETCOLL_TOKEN_FILE=str(tmp_path / "nope"))
    proc = run_cli("coordinator", "--host", "0.0.0.0", "--port", "0", "--http-port", "off", env=missing)
    assert proc.returncode == 2 and "NETCOLL_TOKEN_FILE" in one_line(proc) and "cannot read" in proc.stderr


def test_settings() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "coordinator", ""))
    CoordinatorConfig.load({}, {}).require_credentials("coordinator")  # loopback: no token needed
    with pytest.raises(ConfigError, match=REFUSED):
        RankConfig.load({}, {}).require_credentials("rank daemon")
    RankConfig.load({}, {"NETCOLL_INSECURE": "1"}).require_credentials("rank daemon")
    RankConfig.load({"insecure": True}, {}).require_credentials("rank daemon")
    RankConfig.load({}, {"NETCOLL_TOKEN": MEMBER}).require_credentials("rank daemon")
    cfg = ClientConfig.load({"client_token": CLIENT}, {"NETCOLL_TOKEN": MEMBER})
    assert (cfg.token, cfg.client_token) == (MEMBER, CLIENT)
    assert cfg.redacted()["client_token"] == "***" and cfg.redacted()["token"] == "***"


# -- starting ---------------------------------------------------------------------------------------
@pytest.mark.tcp
def test_insecure_lets_it_start(tmp_path: Path) -> None:
    with coordinator(tmp_path, "--host", "0.0.0.0", "--insecure") as c:
        assert c["info"]["address"].startswith("0.0.0.0:")
        proc = run_cli("status", "--coordinator", loopback_address(c["info"]), "--json")
        assert proc.returncode == 0, proc.stderr
    assert c["proc"].returncode == 0


@pytest.mark.tcp
def test_token_files_and_roles_end_to_end(tmp_path: Path) -> None:
    (tmp_path / "member").write_text(MEMBER + "\n")
    (tmp_path / "client").write_text(CLIENT + "\n")
    files = env_of(NETCOLL_TOKEN_FILE=str(tmp_path / "member"), NETCOLL_CLIENT_TOKEN_FILE=str(tmp_path / "client"))
    # credentials from files count: it starts off loopback without --insecure
    with coordinator(tmp_path, "--host", "0.0.0.0", env=files) as c:
        address = loopback_address(c["info"])
        as_client = env_of(NETCOLL_CLIENT_TOKEN_FILE=str(tmp_path / "client"))
        proc = run_cli("status", "--coordinator", address, "--json", env=as_client)
        assert proc.returncode == 0, proc.stderr
        assert run_cli("status", "--coordinator", address, "--client-token", CLIENT).returncode == 0
        as_member = env_of(NETCOLL_TOKEN_FILE=str(tmp_path / "member"))
        assert run_cli("status", "--coordinator", address, env=as_member).returncode == 0
        # mix-ups: one clear line each
        proc = run_cli("status", "--coordinator", address, "--client-token", "guess")
        assert proc.returncode == 1 and "wrong token" in one_line(proc) and "NETCOLL_CLIENT_TOKEN" in proc.stderr
        proc = run_cli("status", "--coordinator", address, env=env_of(NETCOLL_TOKEN=CLIENT))
        assert proc.returncode == 1 and "client token (NETCOLL_CLIENT_TOKEN)" in one_line(proc)
        proc = run_cli("status", "--coordinator", address)
        assert proc.returncode == 1 and "authentication" in one_line(proc)
    assert c["proc"].returncode == 0
