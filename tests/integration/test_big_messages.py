"""Issue 38's first finding, as the new user ran it: ``netcoll run -n 4`` of a
``netcoll.sync`` script doing one all_reduce of 300 MiB, which deadlocked with the
default 64 MiB receive window (256 MiB passed). One process per rank, over TCP and
over shared memory; every rank checks its result (``bench/bigmessage.py``'s worker;
the benchmark runs the whole matrix at 1 GiB per rank)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO

pytestmark = [pytest.mark.tcp, pytest.mark.slow]
MARK = "BIGMESSAGE "


@pytest.mark.timeout(600)
@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_a_300_mib_all_reduce_at_4_ranks_completes_with_the_default_window(transport: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
    env["NETCOLL_TRANSPORT"] = transport
    script = str(REPO / "bench" / "bigmessage.py")
    cmd = [
        sys.executable,
        "-m",
        "netcoll",
        "run",
        "-n",
        "4",
        script,
        "--worker",
        "all_reduce",
        "--size",
        "300M",
        "--iters",
        "1",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540, check=False, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line.split(MARK, 1)[1]) for line in out.stdout.splitlines() if MARK in line]
    assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3]
    assert all(r["right"] for r in rows)
