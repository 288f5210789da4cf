"""netcoll.elastic.heal with one OS process per rank (``netcoll run`` on loopback), over
TCP and shared-memory links: every joiner ends with the live members' state, bit for bit
(fingerprints of every key, dtype, shape, byte and scalar)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.elastic.heal_worker import MARK
from tests.elastic.states import fingerprint, live_state
from tests.support import REPO

pytestmark = pytest.mark.tcp
SCALE = 8  # the state's larger arrays x8: about 0.4 MB, dozens of slices of 64 KiB over the sources


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("ranks", "joiners", "transport"), [(2, 1, "tcp"), (3, 1, "tcp"), (3, 2, "tcp"), (4, 1, "tcp"), (4, 2, "auto")]
)
def test_joiners_heal_from_live_processes(ranks: int, joiners: int, transport: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
    env.update(
        NETCOLL_TRANSPORT=transport, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    )
    script = str(REPO / "tests" / "elastic" / "heal_worker.py")
    cmd = [sys.executable, "-m", "netcoll", "run", "-n", str(ranks), script, str(joiners), str(SCALE)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150, check=False, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = sorted(
        (json.loads(line.split(MARK, 1)[1]) for line in out.stdout.splitlines() if MARK in line),
        key=lambda r: r["rank"],
    )
    assert [r["rank"] for r in rows] == list(range(ranks))
    assert [r["joined"] for r in rows] == [r >= ranks - joiners for r in range(ranks)]
    want = fingerprint(live_state(scale=SCALE))
    assert all(r["fingerprint"] == want and r["step"] == 1000 for r in rows), rows
    assert all(not r["joined"] or not r["in_place"] for r in rows)  # the stale w has another shape at this scale
    kinds = {k for r in rows for k in r["kinds"]}
    assert kinds == ({"tcp"} if transport == "tcp" else {"shm"}), kinds
