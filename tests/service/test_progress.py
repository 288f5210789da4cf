"""A job's progress as it happens (``Client.progress`` and ``netcoll submit --progress``),
and the coordinator's own checks of a submit (a ``Client`` user who bypasses the CLI gets
a typed error; nothing is queued, no epoch is forced). In one event loop over loopback
TCP, like test_service.py; the CLI runs as a child process against it."""

from __future__ import annotations

import asyncio
import io
import os
import sys
from typing import Any

import pytest

from netcoll.cli.progress import ProgressDisplay, bar, describe
from netcoll.service import runner
from tests.support import REPO
from tests.support.services import service

pytestmark = pytest.mark.tcp


async def until(predicate: Any, seconds: float = 20.0) -> None:
    async with asyncio.timeout(seconds):
        while not await predicate():
            await asyncio.sleep(0.02)


async def submit(address: str, *flags: str) -> asyncio.subprocess.Process:
    """``netcoll submit all_reduce FLAGS`` at ``address`` in a process of its own (stderr a
    pipe, not a terminal; no NETCOLL_ settings of this environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "netcoll", "submit", "all_reduce", *flags, "--coordinator", address),
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def states(events: list[dict[str, Any]]) -> list[str]:
    """The states in order, repeats folded."""
    out: list[str] = []
    for e in events:
        if not out or out[-1] != e["state"]:
            out.append(e["state"])
    return out


async def test_progress_goes_waiting_running_done(monkeypatch: pytest.MonkeyPatch) -> None:
    # reports every 50 ms: the 20 calls may take under the default 0.5 s on a fast run (seen in CI)
    monkeypatch.setattr(runner, "PROGRESS_INTERVAL", 0.05)
    async with service(2) as (c, client):
        jid = await client.submit("all_reduce", size="16MiB", iters=20, world_size=3, deadline=120)
        events: list[dict[str, Any]] = []

        async def collect() -> None:
            async for event in client.progress(jid):
                events.append(event)

        async def started() -> bool:
            return bool(events)

        task = asyncio.create_task(collect())
        await until(started)
        assert events[0]["topic"] == "progress" and events[0]["state"] == "queued", events
        assert events[0]["waiting"] == "waiting for 1 more rank (has 2 of 3)"
        c.add(1)
        await asyncio.wait_for(task, 120)
        assert states(events) == ["queued", "running", "succeeded"], events
        assert events[-1]["topic"] == "done" and events[-1]["verified"] is True
        running = [e for e in events if e["state"] == "running"]
        assert all(e["world_size"] == 3 and e["of"] == 20 and 0 <= e["iteration"] <= 20 for e in running)
        assert all(0 <= e["ranks_reporting"] <= 3 and e["elapsed_s"] >= 0 for e in running)
        sent = [e["bytes_sent"] for e in running]
        assert sent == sorted(sent) and sent[-1] > 0, running  # 20 x 16 MiB runs for seconds: reports came
        done = [e["iteration"] for e in running]
        assert done == sorted(done), running


async def test_the_coordinator_checks_what_a_client_submits() -> None:
    """Raw submits (no client-side JobSpec): typed errors with the choices; nothing queued."""
    async with service(2) as (c, client):
        assert (await client.run("barrier", timeout=20))["state"] == "succeeded"
        epoch, submitted = c.svc.epoch, c.svc.submitted
        rpc = client.rpc
        assert rpc is not None
        cases = [
            ({"op": "all_reduce", "algorithm": "rign"}, r"has no algorithm 'rign'; did you mean 'ring'\? choose from"),
            ({"op": "all_reduc"}, r"unknown op 'all_reduc'; did you mean 'all_reduce'\?"),
            ({"op": "all_reduce", "dtype": "float33"}, r"unknown dtype 'float33'; did you mean 'float32'\?"),
            ({"op": "all_reduce", "reduce_op": "summ"}, r"unknown reduction 'summ'; did you mean 'sum'\?"),
            ({"op": "broadcast", "root": 3, "world_size": 3}, r"root 3 is out of range for 3 ranks"),
            ({"op": "reduce", "root": 2}, r"root 2 is out of range: 2 rank daemons are ready"),
            ({"op": "all_reduce", "size": 6}, "not a whole number of float32 elements"),
        ]
        for spec, pattern in cases:
            with pytest.raises(ValueError, match=pattern):
                await rpc.call("submit", {"spec": spec})
        with pytest.raises(ValueError, match="did you mean 'ring'"):  # the Client checks before sending
            await client.submit("all_reduce", algorithm="rign")
        assert (c.svc.epoch, c.svc.submitted, (await client.status())["queued"]) == (epoch, submitted, 0)
        ok = await client.run("reduce", root=1, size="4KiB", timeout=20)  # in range: runs
        assert ok["state"] == "succeeded" and ok["verified"], ok


async def test_a_root_that_no_longer_fits_fails_the_job_before_any_rank_sees_it() -> None:
    async with service(2) as (c, client):
        long = await client.submit("all_reduce", size="4MiB", iters=100_000, deadline=120)
        rooted = await client.submit("reduce", root=1, size="4KiB")  # 2 ready: accepted, queued

        async def running() -> bool:
            return (await client.job(long))["state"] == "running"

        await until(running)
        c.daemons[1].request_stop()  # it drains: no new job once the running one ends

        async def draining() -> bool:
            return any(m["state"] == "draining" for m in await client.members())

        await until(draining)
        await client.cancel(long)  # then `rooted` is picked, with 1 rank ready
        rec = await client.wait(rooted, timeout=60)
        assert rec["state"] == "failed" and rec["epoch"] is None and rec["world_size"] == 0, rec
        assert rec["error"].startswith("root 1 is out of range for the 1 rank ready"), rec["error"]
        assert (await client.wait(long, timeout=60))["state"] == "cancelled"


async def test_netcoll_submit_prints_progress_lines_when_not_a_terminal() -> None:
    async with service(2) as (c, _):
        proc = await submit(c.coord.address, "--size", "16MiB", "--iters", "20", "--world-size", "3", "--progress")
        try:
            assert proc.stderr is not None
            first = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert first.decode().strip().endswith("queued: waiting for 1 more rank (has 2 of 3)"), first
            c.add(1)
            out, err = await asyncio.wait_for(proc.communicate(), 120)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        lines = err.decode().splitlines()
        assert proc.returncode == 0, (out, err)
        assert any(" running: " in line and "ranks reporting" in line for line in lines), lines
        assert lines[-1].endswith(" succeeded"), lines
        assert "SUCCEEDED" not in out.decode() and "succeeded on 3 ranks" in out.decode()


RUNNING = {
    "topic": "progress",
    "state": "running",
    "iteration": 5,
    "of": 10,
    "bytes_sent": 3 << 30,
    "ranks_reporting": 4,
    "world_size": 4,
    "elapsed_s": 2.0,
}
#: the first report: the data made, 1 GiB sent (the rate counts from here)
FIRST = {**RUNNING, "iteration": 1, "bytes_sent": 1 << 30, "elapsed_s": 1.0}
DONE = {
    "topic": "done",
    "state": "succeeded",
    "spec": {"iters": 10},
    "world_size": 4,
    "time_s": 0.25,
    "busbw": 1.5,
    "started_at": 1000.0,
    "finished_at": 1003.5,
}


def test_the_display_draws_a_bar_on_a_terminal_and_lines_elsewhere() -> None:
    # the rate is what was sent between two reports over the time between them: 2 GiB in 1 s
    assert bar(RUNNING, FIRST).startswith("[##########..........] 5/10 iters  3.0 GiB sent  2.0 GiB/s  4/4 ranks")
    assert " 3.0 GiB sent  -  4/4 ranks" in bar(RUNNING)  # one report: no rate yet (not bytes / time since start)
    assert describe({**RUNNING, "of": 1, "iteration": 1}).startswith("running: 1/1 iteration, ")
    tty = io.StringIO()
    shown = ProgressDisplay(7, "all_reduce", tty, tty=True)
    shown.show({"topic": "progress", "state": "queued", "waiting": "waiting for 2 more ranks (has 2 of 4)"})
    shown.show(FIRST)
    shown.show(RUNNING)
    shown.show(DONE)
    text = tty.getvalue()
    assert text.startswith("\rjob 7 all_reduce queued: waiting for 2 more ranks") and text.endswith("\n")
    assert "\rjob 7 all_reduce [##########.........." in text and text.count("\n") == 1
    # the last line: the job's own numbers (its record), never the last report's bytes
    full = "[####################] 10/10 iters  250.00 ms/iter  busbw 1.500 GB/s  4/4 ranks  3.5 s  succeeded"
    assert text.rstrip().endswith(full), text
    lines = io.StringIO()
    shown = ProgressDisplay(7, "all_reduce", lines, tty=False)
    for event in (RUNNING, RUNNING, {**RUNNING, "iteration": 6}, {"topic": "done", "state": "failed"}):
        shown.show(event)  # the same state again within a second: not repeated
    assert lines.getvalue().splitlines() == [
        "netcoll submit: job 7 running: 5/10 iterations, 3.0 GiB sent, -, 4/4 ranks reporting, 2.0 s",
        "netcoll submit: job 7 failed",
    ]


def test_a_failed_job_ends_its_bar_as_far_as_it_went() -> None:
    tty = io.StringIO()
    shown = ProgressDisplay(7, "all_reduce", tty, tty=True)
    shown.show(FIRST)
    shown.show(RUNNING)
    shown.finish("failed", {"state": "failed", "error": "boom"})
    assert tty.getvalue().rstrip().endswith("5/10 iters  3.0 GiB sent  2.0 GiB/s  4/4 ranks  2.0 s  failed")


def test_off_a_terminal_a_waiting_job_says_what_it_waits_for_and_nothing_else() -> None:
    """``netcoll submit`` without --progress, stderr a file: a job waiting for ranks that
    never come is not silent (issue 38); a job that runs at once prints nothing."""
    from netcoll.cli.submit import progress_mode

    assert progress_mode(None, tty=False) == "waiting" and progress_mode(None, tty=True) == "all"
    assert progress_mode(False, tty=True) == "none" and progress_mode(True, tty=False) == "all"
    out = io.StringIO()
    shown = ProgressDisplay(3, "all_reduce", out, waiting_only=True)
    shown.show({"topic": "progress", "state": "queued", "waiting": "waiting for 2 more ranks (has 2 of 4)"})
    shown.show(RUNNING)
    shown.show({"topic": "done", "state": "failed"})
    assert out.getvalue().splitlines() == [
        "netcoll submit: job 3 queued: waiting for 2 more ranks (has 2 of 4)",
        "netcoll submit: job 3 failed",
    ]
    quiet = io.StringIO()
    shown = ProgressDisplay(4, "all_reduce", quiet, waiting_only=True)
    shown.show(RUNNING)
    shown.show(DONE)
    assert quiet.getvalue() == ""


async def test_a_job_waiting_for_ranks_that_never_come_says_so_and_gives_up() -> None:
    """No --progress, stderr a pipe: the waiting line still shows, and the job fails at its
    --deadline saying what it waited for; --json gives the job's record (issue 38)."""
    import json

    async with service(1) as (c, _):
        proc = await submit(c.coord.address, "--world-size", "2", "--deadline", "1", "--json")
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 120)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    lines = err.decode().splitlines()
    assert proc.returncode == 1, lines
    assert lines[0].endswith("queued: waiting for 1 more rank (has 1 of 2)"), lines
    assert "waited 1s for 2 rank daemon(s)" in lines[-1], lines
    doc = json.loads(out)
    assert doc["state"] == "failed" and doc["error"].startswith("waited 1s for 2 rank daemon(s)"), doc
