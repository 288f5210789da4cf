"""The coordinator's job queue is fair and bounded: a job that cannot run yet (too few
ranks) does not hold up later jobs that can; runnable jobs keep FIFO order; world
size, deadline, queue length and inline bytes have ceilings (netcoll.limits) and a
submit beyond one is refused with an error naming the limit. In one event loop over
loopback TCP, like test_service.py."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from netcoll.cli.status import print_status
from netcoll.limits import DEFAULT, Limits
from tests.support.services import service

pytestmark = pytest.mark.tcp


async def until(predicate: Any, seconds: float = 20.0) -> None:
    async with asyncio.timeout(seconds):
        while not await predicate():
            await asyncio.sleep(0.02)


async def test_a_job_waiting_for_ranks_does_not_block_later_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    """The blocked-FIFO regression: a 4-rank job with 2 ranks registered waits, saying for
    what, while a 2-rank job submitted after it runs; it runs once 2 more ranks come."""
    async with service(2) as (c, client):
        big = await client.submit("all_reduce", size="4KiB", world_size=4, deadline=60)
        small = await client.run("all_reduce", size="4KiB", world_size=2, timeout=20)
        assert small["state"] == "succeeded" and small["world_size"] == 2 and small["verified"]
        rec = await client.job(big)
        assert rec["state"] == "queued"
        assert rec["waiting"] == "waiting for 2 more ranks (has 2 of 4)"
        status = await client.status()
        assert status["queued"] == 1
        print_status(status, c.coord.address, 10)
        assert "waiting for 2 more ranks (has 2 of 4)" in capsys.readouterr().out
        unsized = await client.run("barrier", timeout=20)  # world_size unset: every ready rank
        assert unsized["state"] == "succeeded" and unsized["world_size"] == 2
        c.add(2)
        done = await client.wait(big, timeout=30)
        assert done["state"] == "succeeded" and done["world_size"] == 4 and done["verified"], done
        assert done["waiting"] is None


async def test_runnable_jobs_run_in_submission_order() -> None:
    async with service(0) as (c, client):
        ids = [await client.submit("all_reduce", size="1KiB", world_size=2) for _ in range(4)]
        waiting = await client.job(ids[0])
        assert waiting["state"] == "queued" and "waiting for" in waiting["waiting"]
        c.add(2)
        recs = [await client.wait(i, timeout=30) for i in ids]
        assert [r["state"] for r in recs] == ["succeeded"] * 4
        starts = [r["started_at"] for r in recs]
        assert starts == sorted(starts), starts


async def test_a_waiting_job_fails_at_its_deadline_and_the_queue_goes_on() -> None:
    async with service(1) as (_, client):
        stuck = await client.submit("all_reduce", size="1KiB", world_size=3, deadline=0.5)
        after = await client.run("all_reduce", size="1KiB", timeout=20)
        assert after["state"] == "succeeded"
        rec = await client.wait(stuck, timeout=20)
        assert rec["state"] == "failed" and "waited 0.5s for 3 rank daemon(s)" in rec["error"], rec["error"]


async def test_world_size_above_the_limit_is_refused() -> None:
    async with service(1) as (_, client):
        with pytest.raises(ValueError, match=r"world_size 4097 exceeds the limit of 4096 ranks \(max_world_size"):
            await client.submit("barrier", world_size=DEFAULT.max_world_size + 1)
    async with service(1, limits=Limits(max_world_size=4)) as (_, client):
        with pytest.raises(ValueError, match="max_world_size"):
            await client.submit("barrier", world_size=5)
        assert (await client.run("barrier", world_size=1, timeout=20))["state"] == "succeeded"


async def test_deadline_ceiling() -> None:
    assert DEFAULT.max_deadline_s == 86400.0
    async with service(1) as (_, client):
        with pytest.raises(ValueError, match=r"deadline 172800s exceeds the limit of 86400s \(max_deadline_s"):
            await client.submit("barrier", deadline=2 * 86400)
        with pytest.raises(ValueError, match="exceeds the limit"):
            await client.submit("barrier", deadline=7 * 86400)  # accepted before issue 10
        assert (await client.run("barrier", deadline=86400, timeout=20))["state"] == "succeeded"
    async with service(1, limits=Limits(max_deadline_s=10)) as (_, client):
        with pytest.raises(ValueError, match="deadline 11s exceeds the limit of 10s"):
            await client.submit("barrier", deadline=11)
        assert (await client.run("barrier", deadline=10, timeout=20))["state"] == "succeeded"


async def test_queued_jobs_cap() -> None:
    async with service(0, limits=Limits(max_queued_jobs=2)) as (c, client):
        first = await client.submit("barrier")
        await client.submit("barrier")
        with pytest.raises(ValueError, match=r"the queue is full: 2 jobs queued, the limit is 2 \(max_queued_jobs"):
            await client.submit("barrier")
        await client.cancel(first)  # a cancelled job frees its place
        third = await client.submit("barrier")
        c.add(1)
        assert (await client.wait(third, timeout=30))["state"] == "succeeded"


async def test_inline_bytes_above_the_limit_are_refused() -> None:
    async with service(1, limits=Limits(max_job_bytes=64)) as (_, client):
        with pytest.raises(ValueError, match="exceeds the limit of 64 bytes per rank"):
            await client.submit("all_reduce", inputs=np.zeros(32, np.float32))
        rec = await client.run("all_reduce", inputs=np.ones(16, np.float32), timeout=20)
        assert rec["state"] == "succeeded" and rec["result"].tolist() == [1.0] * 16
