"""An in-process job service: a Coordinator with the JobService and rank daemons on
distinct loopback addresses, and a Client (tests/service/)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import netcoll
from netcoll.service import Client, JobService, RankDaemon
from netcoll.service.journal import Journal


class Cluster:
    def __init__(self, coord: netcoll.Coordinator, svc: JobService) -> None:
        self.coord, self.svc = coord, svc
        self.token = coord.token
        self.daemons: list[RankDaemon] = []
        self.tasks: list[asyncio.Task[None]] = []

    def add(self, n: int = 1, **kw: Any) -> None:
        for _ in range(n):
            i = len(self.daemons)
            d = RankDaemon(
                self.coord.address,
                host=f"127.0.0.{i + 2}",
                port=0,
                local_host=f"127.0.0.{i + 2}",
                heartbeat=0.5,
                token=self.token,
                **kw,
            )
            self.daemons.append(d)
            self.tasks.append(asyncio.create_task(d.run()))

    async def kill(self, i: int) -> None:
        """Like SIGKILL: the daemon's task dies; its sockets close."""
        self.tasks[i].cancel()
        await asyncio.gather(self.tasks[i], return_exceptions=True)

    async def ready(self, client: Client, n: int) -> None:
        async with asyncio.timeout(10):
            while len([m for m in await client.members() if m["state"] != "draining"]) != n:
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def service(
    n: int, journal: Journal | None = None, *, coordinator: dict[str, Any] | None = None, **options: Any
) -> AsyncIterator[tuple[Cluster, Client]]:
    """A coordinator (``coordinator``: its options) with a JobService (``options``;
    ``journal``: closed on exit) and ``n`` rank daemons; everything stopped on exit."""
    try:
        async with _service(n, journal, options, coordinator or {}) as running:
            yield running
    finally:
        if journal is not None:
            journal.close()


@contextlib.asynccontextmanager
async def _service(
    n: int, journal: Journal | None, options: dict[str, Any], kw: dict[str, Any]
) -> AsyncIterator[tuple[Cluster, Client]]:
    async with netcoll.Coordinator(**kw) as coord:
        svc = JobService(coord, journal=journal, **options)
        svc.start()
        c = Cluster(coord, svc)
        c.add(n)
        try:
            async with Client(coord.address, token=kw.get("token")) as client:
                await c.ready(client, n)
                yield c, client
        finally:
            for d in c.daemons:
                d.request_stop()
            await asyncio.wait_for(asyncio.gather(*c.tasks, return_exceptions=True), 10)
            await svc.close()
