"""A stopped rank daemon fails its job within ``liveness_timeout_s`` (+1 s), and
the job's error names the rank as gone -- not "never reported within the
deadline" at the job's deadline (issue 10, finding 7: SIGSTOP).

The daemons are real processes (``python -m netcoll rank`` on loopback) so that
SIGSTOP stops every thread of theirs; every one is SIGKILLed (after SIGCONT)
on the way out."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import netcoll
from netcoll.limits import Limits
from netcoll.service import JobService, RankDaemon, scheduler
from netcoll.service.jobs import JobState
from tests.support.loops import LoopThread

pytestmark = [pytest.mark.tcp, pytest.mark.timeout(60)]

LIVENESS = 1.0


class Daemons:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, address: str, n: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
        for i in range(n):
            member = f"daemon-{i}"
            log = open(self.tmp / f"{member}.log", "wb")  # noqa: SIM115 - closed with the process
            self.procs[member] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "netcoll",
                    "rank",
                    "--coordinator",
                    address,
                    "--host",
                    f"127.0.0.{i + 2}",
                    "--port",
                    "0",
                    "--http-port",
                    "off",
                    "--member-id",
                    member,
                    "--heartbeat",
                    "0.5",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            log.close()

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGKILL's aftermath
                proc.kill()
        for proc in self.procs.values():
            proc.wait(10)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(self.tmp.glob("*.log")))


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[JobService, Daemons]]:
    limits = Limits(liveness_timeout_s=LIVENESS, progress_timeout_s=1.0)
    async with netcoll.Coordinator(limits=limits) as coord:
        svc = JobService(coord, limits=limits)
        svc.start()
        daemons = Daemons(tmp_path)
        try:
            yield svc, daemons
        finally:
            daemons.close()
            await svc.close()


async def test_a_stopped_rank_daemon_fails_its_job_naming_the_rank(service: tuple[JobService, Daemons]) -> None:
    svc, daemons = service
    daemons.start(svc.coord.address, 2)
    try:
        async with asyncio.timeout(30):
            while len(svc.ready_members()) < 2:
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError("the daemons did not register\n" + daemons.logs()) from None
    async with netcoll.Client(svc.coord.address) as client:
        job_id = await client.submit("all_reduce", size=1024, iters=100_000, world_size=2, deadline=40)
        job = svc.jobs[job_id]
        async with asyncio.timeout(20):  # running, and past its first iterations on every rank
            while job.state != JobState.RUNNING or not job.progress or job.progress["iteration"] < 10:
                await asyncio.sleep(0.02)
        stopped = job.members[1]
        where = f"{svc.members[stopped].host}:{svc.members[stopped].port}"
        start = time.monotonic()
        os.kill(daemons.procs[stopped].pid, signal.SIGSTOP)
        record = await client.wait(job_id, timeout=30)
        took = time.monotonic() - start
    assert record["state"] == "failed", record
    error = record["error"]
    assert f"rank 1 ({stopped} at {where}) is gone: no heartbeat for" in error, error
    assert "never reported" not in error and "rank 0" not in error, error
    assert took < LIVENESS + 1.0, (took, error)


async def test_a_daemon_with_a_blocked_loop_stays_and_is_named_unresponsive(
    service: tuple[JobService, Daemons], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its loop blocked for 4 s (4 x liveness_timeout_s): the daemon is not dropped;
    the job it holds up fails at its deadline naming it unresponsive, and the next
    job runs on the same ranks (no new epoch)."""
    monkeypatch.setattr(scheduler, "REPORT_GRACE", 0.5)
    svc, _ = service
    threads = [LoopThread(f"daemon-{i}") for i in range(2)]
    daemons: list[RankDaemon] = []
    tasks: list[asyncio.Future[None]] = []

    async def start(i: int) -> RankDaemon:
        d = RankDaemon(
            svc.coord.address,
            host=f"127.0.0.{i + 2}",
            port=0,
            local_host=f"127.0.0.{i + 2}",
            member_id=f"d{i}",
            heartbeat=0.2,
        )
        tasks.append(asyncio.ensure_future(d.run()))
        return d

    try:
        for i, lt in enumerate(threads):
            daemons.append(await lt.run(start(i)))
        async with asyncio.timeout(10):
            while len(svc.ready_members()) < 2:
                await asyncio.sleep(0.05)
        async with netcoll.Client(svc.coord.address) as client:
            first = await client.run("all_reduce", size=64, world_size=2, timeout=20)
            assert first["state"] == "succeeded", first
            epoch = svc.epoch
            job_id = await client.submit("all_reduce", size=1024, iters=100_000, world_size=2, deadline=2.5)
            job = svc.jobs[job_id]
            async with asyncio.timeout(10):
                while job.state != JobState.RUNNING or not job.progress or job.progress["iteration"] < 10:
                    await asyncio.sleep(0.02)
            threads[1].loop.call_soon_threadsafe(time.sleep, 4.0)  # rank 1's loop: a long synchronous step
            record = await client.wait(job_id, timeout=20)
            assert record["state"] == "failed", record
            assert "rank 1 (d1 at 127.0.0.3:" in record["error"], record["error"]
            assert "is unresponsive: its process heartbeats but its event loop has not answered" in record["error"]
            assert sorted(m.member_id for m in svc.ready_members()) == ["d0", "d1"]  # nobody was dropped
            async with asyncio.timeout(10):  # its loop is back: it answers again
                while svc.coord.unresponsive(svc.members["d1"].session) is not None:
                    await asyncio.sleep(0.05)
            again = await client.run("all_reduce", size=64, world_size=2, timeout=20)
            assert again["state"] == "succeeded", again
            assert sorted(m.member_id for m in svc.ready_members()) == ["d0", "d1"]
            assert svc.epoch == epoch + 1  # re-linked after the failed job, same members
    finally:
        for lt, d in zip(threads, daemons, strict=False):
            lt.loop.call_soon_threadsafe(d.request_stop)
        for lt, task in zip(threads, tasks, strict=False):
            await lt.run(asyncio.wait_for(_done(task), 15))
        for lt in threads:
            lt.stop()


async def _done(task: asyncio.Future[None]) -> None:
    await asyncio.gather(task, return_exceptions=True)
