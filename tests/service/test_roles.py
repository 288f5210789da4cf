"""Member and client credentials at the coordinator (issue 10, finding 4): a client
token submits, watches, gets and cancels jobs and reads status, but can never join
a group, register as a rank daemon, or report (forge) a job's result; the member
token may do everything."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np
import pytest

import netcoll
from netcoll.errors import AuthenticationError, RendezvousError
from netcoll.rendezvous import RendezvousClient
from netcoll.service import Client, JobService, RankDaemon

pytestmark = pytest.mark.tcp

MEMBER, CLIENT = "member-s3cret", "client-s3cret"
MEMBER_ONLY = "is for members only"


@contextlib.asynccontextmanager
async def cluster(n: int) -> AsyncIterator[tuple[netcoll.Coordinator, JobService]]:
    """A coordinator with both tokens and ``n`` rank daemons holding the member token."""
    async with netcoll.Coordinator(token=MEMBER, client_token=CLIENT) as coord:
        svc = JobService(coord)
        svc.start()
        daemons = [
            RankDaemon(
                coord.address,
                host=f"127.0.0.{i + 2}",
                port=0,
                local_host=f"127.0.0.{i + 2}",
                heartbeat=0.5,
                token=MEMBER,
            )
            for i in range(n)
        ]
        tasks = [asyncio.create_task(d.run()) for d in daemons]
        try:
            async with asyncio.timeout(10):
                while len(svc.ready_members()) < n:
                    await asyncio.sleep(0.05)
            yield coord, svc
        finally:
            for d in daemons:
                d.request_stop()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
            await svc.close()


async def test_a_client_token_runs_jobs() -> None:
    async with cluster(2) as (coord, _), Client(coord.address, client_token=CLIENT) as client:
        xs = [np.arange(4, dtype=np.float32) * (r + 1) for r in range(2)]
        rec = await client.run("all_reduce", inputs=xs)  # submit + get the result
        assert rec["state"] == "succeeded", rec
        np.testing.assert_array_equal(rec["result"], xs[0] + xs[1])
        events = [e async for e in client.progress(await client.submit("all_reduce", size="4KiB", iters=3))]
        assert events[-1]["topic"] == "done" and events[-1]["state"] == "succeeded"  # watch
        assert (await client.job(rec["id"]))["state"] == "succeeded"
        assert len(await client.members()) == 2 and "members" in await client.status()  # read status
        # cancel: a job that cannot run yet (it waits for 3 ranks) is cancelled
        job = await client.submit("all_reduce", size="4KiB", world_size=3)
        await client.cancel(job)
        assert (await client.wait(job, timeout=10))["state"] in ("cancelled", "failed")
        assert await client.rpc.call("status", {}) is not None  # type: ignore[union-attr]


async def test_a_client_token_cannot_act_as_a_member() -> None:
    async with cluster(2) as (coord, svc), Client(coord.address, client_token=CLIENT) as client:
        rpc = client.rpc
        assert rpc is not None
        # it cannot register as a rank daemon (and so never receives a job's input) ...
        with pytest.raises(AuthenticationError, match=MEMBER_ONLY):
            await rpc.call("daemon_register", {"member_id": "evil", "listen_port": 1234})
        assert "evil" not in svc.members
        # ... nor join a group or use a group's store and barriers ...
        with pytest.raises(AuthenticationError, match=MEMBER_ONLY):
            await rpc.call("join", {"group": "g", "world_size": 1, "member_id": "evil", "listen_port": 1})
        for method, params in (
            ("kv_set", {"group": "g", "key": "k", "value": 1}),
            ("kv_get", {"group": "g", "key": "k", "timeout": 1}),
            ("barrier", {"group": "g", "name": "b", "timeout": 1}),
            ("daemon_drain", {}),
        ):
            with pytest.raises(AuthenticationError, match=MEMBER_ONLY):
                await rpc.call(method, params)
        # ... nor report a forged result or progress for a running job
        job = await client.submit("all_reduce", size="4KiB", world_size=3)  # waits for a third rank
        for method in ("job_result", "job_progress"):
            with pytest.raises(AuthenticationError, match=MEMBER_ONLY):
                await rpc.call(method, {"job_id": job, "rank": 0, "state": "succeeded"})
        await client.cancel(job)
        # the connection stays usable for what a client may do
        assert len(await client.members()) == 2


async def test_the_client_token_cannot_join_as_a_member() -> None:
    async with netcoll.Coordinator(token=MEMBER, client_token=CLIENT) as coord:
        with pytest.raises(AuthenticationError, match=r"NETCOLL_CLIENT_TOKEN.*member token NETCOLL_TOKEN"):
            await RendezvousClient.connect(coord.address, token=CLIENT, timeout=5)
        with pytest.raises(AuthenticationError, match="NETCOLL_CLIENT_TOKEN"):
            async with netcoll.connect(coord.address, world_size=1, token=CLIENT, timeout=5):
                pass
        # a wrong client token says which token is wrong
        with pytest.raises(AuthenticationError, match=r"wrong token.*NETCOLL_CLIENT_TOKEN"):
            async with Client(coord.address, client_token="guess"):
                pass


async def test_the_member_token_may_do_everything() -> None:
    async with cluster(2) as (coord, _):
        async with Client(coord.address, token=MEMBER) as client:
            rec = await client.run("all_reduce", size="4KiB")
            assert rec["state"] == "succeeded", rec
            # member-only methods get past the role check to the method itself
            with pytest.raises(RendezvousError, match="not a member of group"):
                await client.rpc.call("kv_delete", {"group": "none", "key": "k"})  # type: ignore[union-attr]
        async with netcoll.connect(coord.address, world_size=1, token=MEMBER, group="solo", timeout=10) as comm:
            y = await comm.all_reduce(np.ones(3, np.float32))
            np.testing.assert_array_equal(y, np.ones(3, np.float32))


async def test_a_coordinator_with_only_a_member_token_takes_no_client_token() -> None:
    async with netcoll.Coordinator(token=MEMBER) as coord:
        with pytest.raises(AuthenticationError, match="accepts members only"):
            async with Client(coord.address, client_token=CLIENT):
                pass
        async with Client(coord.address, token=MEMBER) as client:  # the operator's token still works
            assert "groups" in await client.rpc.call("status", {})  # type: ignore[union-attr]
