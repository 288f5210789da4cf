"""Memory a long-lived daemon keeps must not grow with the jobs it runs
(issue 10, finding 2): pushed events are consumed or bounded, a job's inline
input is released when the job ends, and a closed coordinator connection is
freed by reference counting alone, without waiting for the cycle collector."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import netcoll
from netcoll.rendezvous import RendezvousClient
from netcoll.rendezvous.client import EVENT_QUEUE_MAX
from netcoll.rpc import Session
from netcoll.service import RankDaemon
from tests.service.test_service import cluster

pytestmark = pytest.mark.tcp


class _NoCycleCollector:
    """``with _NoCycleCollector():`` runs the body with the cycle collector off,
    so anything freed inside was freed by reference counting."""

    def __enter__(self) -> None:
        gc.collect()
        self._was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._was:
            gc.enable()


def _alive(refs: list[weakref.ref[Any]]) -> int:
    return sum(r() is not None for r in refs)


async def test_daemon_keeps_no_job_inputs_or_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """20 jobs with 4 MiB inline inputs: the daemons' event queues stay empty and
    every job's received input buffer is freed when its job ends (refcounting only)."""
    inputs: list[weakref.ref[Any]] = []
    job = RankDaemon._job

    async def watched(self: RankDaemon, event: dict[str, Any]) -> Any:
        payload = event.get("payload")
        if isinstance(payload, memoryview) and payload.nbytes:
            inputs.append(weakref.ref(payload.obj))  # the buffer the frame was received into
        del payload
        return await job(self, event)

    monkeypatch.setattr(RankDaemon, "_job", watched)
    n_jobs, ranks = 20, 2
    xs = [np.full(1 << 20, r + 1, np.float32) for r in range(ranks)]  # 4 MiB per rank
    async with cluster(ranks) as (c, client):
        await client.run("all_reduce", inputs=xs)  # links up, warm
        with _NoCycleCollector():
            start = len(inputs)
            for _ in range(n_jobs):
                rec = await client.run("all_reduce", inputs=xs)
                assert rec["state"] == "succeeded", rec
            await asyncio.sleep(0.05)  # the daemons' job tasks finish after reporting
            received = inputs[start:]
            assert len(received) == n_jobs * ranks
            assert _alive(received) == 0, f"{_alive(received)} of {len(received)} job inputs still held"
            for d in c.daemons:
                assert d.rdv is not None
                assert d.rdv.events.qsize() == 0 and d.rdv.events_dropped == 0
            np.testing.assert_array_equal(rec["result"], xs[0] + xs[1])


async def test_unread_events_are_bounded() -> None:
    """A client nobody reads events from keeps at most EVENT_QUEUE_MAX of them (the newest)."""
    pushes = EVENT_QUEUE_MAX + 50
    async with netcoll.Coordinator() as coord:

        async def spam(session: Session, params: dict[str, Any], _: memoryview) -> int:
            for i in range(pushes):
                await session.push("spam", {"i": i}, b"x" * 1024)
            return pushes

        coord.register("spam", spam)
        async with await RendezvousClient.connect(coord.address, heartbeat=None) as rdv:
            assert await rdv.rpc.call("spam", {}, timeout=10) == pushes
            async with asyncio.timeout(5):
                while rdv.events_dropped < pushes - EVENT_QUEUE_MAX:
                    await asyncio.sleep(0.01)
            assert rdv.events.qsize() == EVENT_QUEUE_MAX
            first = rdv.events.get_nowait()
            assert first["topic"] == "spam" and first["i"] == pushes - EVENT_QUEUE_MAX

            # with a subscriber, nothing is queued at all
            seen: list[int] = []
            rdv.on_event = lambda ev: seen.append(ev["i"])
            assert await rdv.rpc.call("spam", {}, timeout=10) == pushes
            async with asyncio.timeout(5):
                while len(seen) < pushes:
                    await asyncio.sleep(0.01)
            assert seen == list(range(pushes))
            assert rdv.events.qsize() == EVENT_QUEUE_MAX - 1


def _refs(rdv: RendezvousClient) -> Iterator[tuple[str, weakref.ref[Any]]]:
    yield "RendezvousClient", weakref.ref(rdv)
    yield "RpcClient", weakref.ref(rdv.rpc)


@pytest.mark.parametrize("how", ["close", "coordinator_gone"])
async def test_closed_client_is_freed_without_the_cycle_collector(how: str) -> None:
    async with netcoll.Coordinator() as coord:
        with _NoCycleCollector():
            rdv = await RendezvousClient.connect(coord.address, heartbeat=0.2)
            await rdv.join("g", world_size=1, timeout=5)
            await rdv.kv_set("k", b"v" * 1000)
            lost: list[str] = []
            rdv.on_event = lambda ev: lost.append(ev["topic"])
            refs = dict(_refs(rdv))
            if how == "close":
                await rdv.close()
            else:
                await coord.close()
                async with asyncio.timeout(5):
                    while not lost:
                        await asyncio.sleep(0.01)
                assert lost == ["coordinator_lost"]
                await rdv.close()
            del rdv
            await asyncio.sleep(0.05)
            held = [name for name, ref in refs.items() if ref() is not None]
            assert not held, f"still alive without the cycle collector: {held}"


async def test_closed_connection_protocol_is_freed_without_the_cycle_collector() -> None:
    async with netcoll.Coordinator() as coord:
        with _NoCycleCollector():
            rdv = await RendezvousClient.connect(coord.address, heartbeat=None)
            proto = weakref.ref(rdv.rpc.proto)
            await rdv.close()
            del rdv
            await asyncio.sleep(0.05)
            assert proto() is None
