"""Running ranks under ``netcoll run`` for the torch tests: the per-rank JSON
lines they print, and the launcher's exit status."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from tests.support import REPO

#: MASTER_PORT for torch's store is taken below the kernel's ephemeral range
#: (32768.. on Linux): a port in it can be taken first by a rank's own store
#: client, which connects to it while rank 0 is still starting (a TCP
#: self-connect), and rank 0's store then fails with EADDRINUSE.
PORTS = (20000, 32000)


def store_port() -> int:
    """A free loopback port outside the ephemeral range."""
    for _ in range(200):
        port = random.randrange(*PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port for torch's store")


@dataclass
class Launch:
    returncode: int
    output: str
    reports: dict[int, list[dict[str, Any]]]  # per rank, the JSON objects it printed


def run(n: int, *argv: str, limit: float = 300.0) -> Launch:
    """``netcoll run -n n argv…`` to the end (killed after ``limit`` s)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"  # torch's deprecation notes, once per rank
    cmd = [sys.executable, "-m", "netcoll", "run", "-n", str(n), "--master-port", str(store_port()), *argv]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the launcher stops its ranks (SIGTERM, then SIGKILL after its grace)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"netcoll run did not end within {limit}s:\n{out[-3000:]}{err[-3000:]}") from None
    reports: dict[int, list[dict[str, Any]]] = {}
    for line in out.splitlines():
        prefix, _, rest = line.partition("] ")
        if prefix.startswith("[rank ") and rest.startswith("{"):
            reports.setdefault(int(prefix[6:]), []).append(json.loads(rest))
    return Launch(proc.returncode, out + err, reports)
