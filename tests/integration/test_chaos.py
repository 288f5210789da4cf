"""Chaos (issue 10), CI size: the code of netcoll/testing/harness/chaos.py -- 100 jobs against a
coordinator and 3 rank-daemon subprocesses on loopback, 8 of them with a daemon
SIGKILLed and 8 with one SIGSTOPped, before, during or between jobs (seeded RNG;
the seed is printed, and ``NETCOLL_CHAOS_SEED`` replays one). Every job ends
succeeded or failed naming the faulted rank, the job after each fault succeeds
on the re-formed group, nothing dies that was not killed, descriptors are back
to their baseline and every process started is gone at the end. Default
settings (``liveness_timeout_s`` 4 s). The full run is
``python3 -m netcoll.testing.harness.chaos --jobs 300 --kills 30 --stops 30``."""

from __future__ import annotations

import os
import secrets

import pytest

from netcoll.testing.harness import chaos

pytestmark = [pytest.mark.slow, pytest.mark.tcp, pytest.mark.timeout(300)]

#: fault -> failed-job end, seconds. The goal (and the harness's default) is 5 s; a
#: stopped daemon is declared gone 3-4 s after the fault (liveness_timeout_s = 4 s minus
#: the time since its last beat), measured 3.1-4.0 s, a killed one at once (0.01-0.04 s).
#: CI adds 2 s for a loaded 2-core machine (the cancel and reports after the verdict are
#: loop round trips); the script reports the real distribution.
BOUND_S = 5.0 + 2.0


async def test_chaos_kills_and_stops() -> None:
    seed = int(os.environ.get("NETCOLL_CHAOS_SEED") or secrets.randbits(32))
    print(f"chaos seed {seed} (NETCOLL_CHAOS_SEED={seed} replays it)")
    report = await chaos.chaos(jobs=100, kills=8, stops=8, ranks=3, seed=seed, bound=BOUND_S, log=print)
    print({k: v for k, v in report.items() if k != "faults"})  # the figures, with -s
    assert report["ok"], (seed, report["problems"])
    assert report["jobs"] == 100 and report["succeeded"] + report["failed"] == 100, report
    assert report["after_fault_succeeded"] == "16/16", report
    assert report["processes_left"] == 0 and report["client_fds_delta"] <= 0, report
    assert report["fds"]["coordinator"][1] <= report["fds"]["coordinator"][0], report["fds"]
    failed_by = {f["job"]: f for f in report["faults"] if f["state"] == "failed"}
    assert len(failed_by) == report["failed"], report["faults"]  # only faulted jobs failed
    assert any(f["kind"] == "stop" for f in failed_by.values()), report["faults"]
