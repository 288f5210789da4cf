"""A job's "cancel" reaching a rank daemon after its collective ended never loses
the rank's report (issue 10, chaos). The job service cancels the other ranks
as soon as one is lost (killed or stopped); a survivor that had already failed
with PeerLost (or finished) was then cancelled *while reporting*, and the job
waited out its report grace and ended "never reported within the deadline"."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from netcoll.rpc import RpcClient
from netcoll.service import RankDaemon
from tests.support.services import service

pytestmark = pytest.mark.tcp


async def test_a_cancel_while_reporting_does_not_lose_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    async with service(2) as (c, client):
        daemons: dict[int, RankDaemon] = {}
        real = RpcClient.call

        async def call(self: RpcClient, method: str, params: Any = None, *a: Any, **kw: Any) -> Any:
            if method == "job_result":  # the coordinator's cancel arrives just as the report goes out
                d = next(d for d in c.daemons if d.rdv is not None and d.rdv.rpc is self)
                daemons[params["rank"]] = d
                assert d.rdv is not None and d.rdv.on_event is not None
                d.rdv.on_event({"topic": "cancel", "job_id": params["job_id"]})
                await asyncio.sleep(0)
            return await real(self, method, params, *a, **kw)

        monkeypatch.setattr(RpcClient, "call", call)
        rec = await client.run("all_reduce", size="4KiB", deadline=20, timeout=60)
        assert rec["state"] == "succeeded", rec["error"]
        assert sorted(rec["timings"]) == ["0", "1"]
        assert sorted(daemons) == [0, 1]
        monkeypatch.undo()
        again = await client.run("all_reduce", size="4KiB", timeout=60)
        assert again["state"] == "succeeded" and again["epoch"] == rec["epoch"], again


async def test_a_killed_daemon_fails_the_job_naming_it_and_every_survivor_reports() -> None:
    """With the cancel sent to the survivors for a *killed* rank too, each of them
    reports (cancelled or PeerLost) and the error names only the lost rank."""
    async with service(3) as (c, client):
        jid = await client.submit("all_reduce", size="8MiB", iters=100_000, deadline=60)
        async with asyncio.timeout(20):
            while (await client.job(jid))["state"] != "running":
                await asyncio.sleep(0.02)
        rec = await client.job(jid)
        victim = c.daemons[2].member_id
        rank = next(r["rank"] for r in rec["ranks"] if r["member_id"] == victim)
        await c.kill(2)
        rec = await client.wait(jid, timeout=30)
        assert rec["state"] == "failed"
        assert victim in rec["error"] and f"rank {rank} " in rec["error"], rec["error"]
        assert "never reported" not in rec["error"], rec["error"]
        assert sorted(rec["timings"]) == sorted(str(r) for r in range(3) if r != rank), rec
        nxt = await client.run("all_reduce", size="4KiB", timeout=30)
        assert nxt["state"] == "succeeded" and nxt["world_size"] == 2, nxt


async def test_an_error_while_reporting_does_not_stop_the_daemon_taking_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A report the coordinator refuses with a typed error (ValueError here) is logged;
    the daemon's job worker goes on, so the next job runs (it used to die silently and
    leave every later job waiting for its deadline)."""
    async with service(2) as (_, client):
        real = RpcClient.call
        refused: list[int] = []

        async def call(self: RpcClient, method: str, params: Any = None, *a: Any, **kw: Any) -> Any:
            if method == "job_result" and not refused:
                refused.append(params["rank"])
                raise ValueError("refused by the test")
            return await real(self, method, params, *a, **kw)

        monkeypatch.setattr(RpcClient, "call", call)
        rec = await client.run("all_reduce", size="4KiB", deadline=1.0, timeout=60)
        assert rec["state"] == "failed" and f"ranks {refused} never reported" in rec["error"], rec
        again = await client.run("all_reduce", size="4KiB", deadline=30, timeout=60)
        assert again["state"] == "succeeded", again
