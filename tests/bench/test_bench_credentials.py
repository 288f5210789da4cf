"""``netcoll bench --coordinator`` takes the credentials every client command takes:
``--token-file``, ``--client-token``, ``--client-token-file``, ``--tls-*`` and their
``NETCOLL_*`` variables (issue 10 leftover: it used to read ``NETCOLL_TOKEN`` only)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

import netcoll
from netcoll.bench import _credentials, add_arguments
from netcoll.bench import run as bench_run
from netcoll.cli.common import add_tls_arguments, add_token_arguments
from netcoll.config import ConfigError

MEMBER, CLIENT = "bench-member-s3cret", "bench-client-s3cret"


def parse(argv: list[str]) -> argparse.Namespace:
    """The flags as ``netcoll bench`` parses them (netcoll.cli.bench.run)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    add_token_arguments(parser, client=True)
    add_tls_arguments(parser)
    return parser.parse_args(argv)


def test_credentials_from_flags_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NETCOLL_TOKEN", "NETCOLL_CLIENT_TOKEN", "NETCOLL_TOKEN_FILE", "NETCOLL_CLIENT_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    token_file = tmp_path / "client-token"
    token_file.write_text(CLIENT + "\n")
    creds = _credentials(parse(["--coordinator", "127.0.0.1:1", "--client-token-file", str(token_file)]))
    assert creds == {"token": None, "client_token": CLIENT, "tls": None}
    monkeypatch.setenv("NETCOLL_TOKEN", MEMBER)
    assert _credentials(parse(["--coordinator", "127.0.0.1:1"]))["token"] == MEMBER
    with pytest.raises(ConfigError, match="--client-token-file"):
        _credentials(parse(["--coordinator", "127.0.0.1:1", "--client-token-file", str(tmp_path / "nope")]))


@pytest.mark.tcp
async def test_bench_with_a_client_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from netcoll.service import JobService, RankDaemon

    monkeypatch.delenv("NETCOLL_TOKEN", raising=False)
    async with netcoll.Coordinator(token=MEMBER, client_token=CLIENT) as coord:
        svc = JobService(coord)
        svc.start()
        daemons = [
            RankDaemon(coord.address, host="127.0.0.1", port=0, local_host="127.0.0.1", token=MEMBER) for _ in range(2)
        ]
        tasks = [asyncio.create_task(d.run()) for d in daemons]
        try:
            async with asyncio.timeout(10):
                while sum(d.registered for d in daemons) < 2:
                    await asyncio.sleep(0.05)
            argv = ["--coordinator", coord.address, "-b", "8", "-e", "8", "--op", "all_reduce", "--no-progress"]
            assert await bench_run(parse([*argv, "--client-token", CLIENT])) == 0
        finally:
            for d in daemons:
                d.request_stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            await svc.close()
