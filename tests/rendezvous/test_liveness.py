"""Liveness independent of the user's event loop (issue 10, finding 3).

A client's heartbeats come from a thread of its own, so a member whose event
loop is blocked (a training step, a checkpoint write) stays in its group and is
only *reported* unresponsive; a member whose process stops or dies is *gone*
within ``liveness_timeout_s``. Clients here run on event loops in other threads
(or in other processes) so that blocking them does not block the coordinator.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import pytest

import netcoll
from netcoll.limits import Limits
from netcoll.rendezvous import Coordinator, RendezvousClient
from tests.support.loops import LoopThread

pytestmark = [pytest.mark.tcp, pytest.mark.timeout(40)]

LIVENESS = 1.0
PROGRESS = 1.5


@pytest.fixture
async def coord() -> AsyncIterator[Coordinator]:
    async with Coordinator(limits=Limits(liveness_timeout_s=LIVENESS, progress_timeout_s=PROGRESS)) as c:
        yield c


@pytest.fixture
def loops() -> Iterator[Callable[[str], LoopThread]]:
    made: list[LoopThread] = []

    def make(name: str) -> LoopThread:
        made.append(LoopThread(name))
        return made[-1]

    yield make
    for lt in made:
        lt.stop()


def heartbeat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "netcoll-heartbeat"]


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> float:
    """Wait for ``cond``; return how long it took."""
    start = time.monotonic()
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)
    return time.monotonic() - start


def member_rows(coord: Coordinator, group: str) -> list[dict[str, Any]]:
    for g in coord.status()["groups"]:
        if g["name"] == group:
            return list(g["members"])
    return []


async def test_a_blocked_loop_is_unresponsive_not_gone(
    coord: Coordinator, loops: Callable[[str], LoopThread], caplog: pytest.LogCaptureFixture
) -> None:
    """A loop heartbeat of 0.2 s would have dropped this member after 0.6 s of a
    blocked loop; blocked for 3 s (3 x liveness_timeout_s) it stays, and is
    reported unresponsive meanwhile."""
    caplog.set_level(logging.INFO, "netcoll.rendezvous")
    user_a, user_b = loops("user-a"), loops("user-b")

    async def member() -> RendezvousClient:
        return await RendezvousClient.connect(coord.address, heartbeat=0.2)

    a = await user_a.run(member())
    b = await user_b.run(member())
    try:
        await asyncio.gather(
            user_a.run(a.join("g", world_size=2, rank=0, member_id="a", listen_port=7000, timeout=5)),
            user_b.run(b.join("g", world_size=2, rank=1, member_id="b", listen_port=7001, timeout=5)),
        )
        await until(lambda: a.lease is not None and a.lease.beats > 0 and b.lease is not None and b.lease.beats > 0)
        assert b.lease is not None and b.lease.interval == pytest.approx(LIVENESS / 4)

        user_b.block(3.0)
        await until(lambda: member_rows(coord, "g")[1]["liveness"] == "unresponsive", timeout=3.0)
        row = member_rows(coord, "g")[1]
        assert row["connected"] and row["unresponsive_s"] >= PROGRESS - 0.1
        assert any(
            "rank 1 (member 'b' at 127.0.0.1:7001) is unresponsive: its process heartbeats but its event loop "
            "has not answered for" in r.getMessage()
            for r in caplog.records
        )
        # its loop comes back: still a member, responsive again, and the group works
        await until(lambda: member_rows(coord, "g")[1]["liveness"] == "ok", timeout=5.0)
        assert [m["connected"] for m in member_rows(coord, "g")] == [True, True]
        assert a.events.empty() and b.events.empty()  # nobody was told of a lost member
        await asyncio.gather(user_a.run(a.barrier("after", timeout=5)), user_b.run(b.barrier("after", timeout=5)))
        assert any("is responsive again" in r.getMessage() for r in caplog.records)
    finally:
        await user_a.run(a.close())
        await user_b.run(b.close())
    assert heartbeat_threads() == []


async def test_an_embedded_rank_survives_a_loop_blocked_longer_than_the_old_limit(
    coord: Coordinator, loops: Callable[[str], LoopThread]
) -> None:
    """netcoll.connect (default 2 s loop heartbeat: the old rule dropped a rank after
    6 s): rank 1 blocks its loop for 7 s between two all_reduces; it stays in its
    group and the next collective is correct."""
    blocked = threading.Event()

    async def rank(r: int) -> list[np.ndarray]:
        out = []
        async with netcoll.connect(coord.address, world_size=2, rank=r, group="emb", timeout=10) as comm:
            out.append(await comm.all_reduce(np.full(4, r + 1.0), timeout=20))
            if r == 1:
                blocked.set()
                time.sleep(7.0)  # noqa: ASYNC251 - the point: a loop blocked like a long training step
            out.append(await comm.all_reduce(np.full(4, 10.0 * (r + 1)), timeout=20))
        return out

    user = [loops(f"user-{r}") for r in range(2)]
    runs = [asyncio.ensure_future(user[r].run(rank(r))) for r in range(2)]
    try:
        await until(blocked.is_set, timeout=10)
        await asyncio.sleep(6.5)  # past the old 3 x 2 s limit
        rows = member_rows(coord, "emb")
    finally:  # both ranks end before their loops do (also when an assertion fails)
        results = await asyncio.gather(*runs, return_exceptions=True)
    assert [m["connected"] for m in rows] == [True, True]
    assert rows[1]["liveness"] == "unresponsive"
    for out in results:
        assert isinstance(out, list), out
        np.testing.assert_array_equal(out[0], np.full(4, 3.0))
        np.testing.assert_array_equal(out[1], np.full(4, 30.0))
    await until(lambda: heartbeat_threads() == [])


_MEMBER = textwrap.dedent(
    """
    import asyncio, sys
    from netcoll.rendezvous import RendezvousClient

    async def main():
        rdv = await RendezvousClient.connect(sys.argv[1], heartbeat=0.2)
        await rdv.join("p", world_size=2, rank=1, member_id="child", listen_port=7101, timeout=10)
        print("joined", flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("how", ["SIGSTOP", "SIGKILL"])
async def test_a_stopped_or_killed_member_is_gone_within_the_timeout(coord: Coordinator, how: str) -> None:
    parent = await RendezvousClient.connect(coord.address, heartbeat=0.2)
    child = subprocess.Popen(  # noqa: ASYNC220 - started once; read from a thread
        [sys.executable, "-c", _MEMBER, coord.address],
        stdout=subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        joining = asyncio.ensure_future(
            parent.join("p", world_size=2, rank=0, member_id="parent", listen_port=7100, timeout=15)
        )
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 15)
        assert line.strip() == b"joined"
        await joining
        await asyncio.sleep(0.5)  # its heartbeat thread is attached
        start = time.monotonic()
        os.kill(child.pid, getattr(signal, how))
        event = await asyncio.wait_for(parent.events.get(), LIVENESS + 2)
        took = time.monotonic() - start
        assert event["topic"] == "member_lost" and event["rank"] == 1
        if how == "SIGSTOP":
            assert took < LIVENESS + 1.0
            assert "no heartbeat for" in event["reason"]
            status = member_rows(coord, "p")
            assert [m["liveness"] for m in status] == ["ok", "disconnected"]
        else:
            assert took < 1.0
    finally:
        child.kill()
        child.send_signal(signal.SIGCONT)
        child.wait(10)
        assert child.stdout is not None
        child.stdout.close()
        await parent.close()


async def test_silent_heartbeats_mean_gone_even_while_the_loop_pings(coord: Coordinator) -> None:
    """Its heartbeat thread frozen (as SIGSTOP freezes it) while its event loop still
    PINGs: the member is gone, and the group's reason (what barriers fail with) says
    so. A heartbeat connection that *closes* instead (its thread failed) makes the
    coordinator fall back to the loop's PINGs: that member stays."""
    a = await RendezvousClient.connect(coord.address, heartbeat=0.2)
    b = await RendezvousClient.connect(coord.address, heartbeat=0.2)
    c = await RendezvousClient.connect(coord.address, heartbeat=0.2)
    try:
        await asyncio.gather(
            *(
                x.join("m", world_size=3, rank=r, member_id=n, listen_port=7200 + r, timeout=5)
                for r, (x, n) in enumerate([(a, "a"), (b, "b"), (c, "c")])
            )
        )
        await until(lambda: all(x.lease is not None and x.lease.beats > 0 for x in (a, b, c)))
        assert c.lease is not None and b.lease is not None and b.lease._loop is not None
        c.lease.request_stop()  # its heartbeat connection closes: judged by its loop's PINGs again
        await until(lambda: not c.lease.thread.is_alive())
        b.lease._loop.call_soon_threadsafe(time.sleep, 2.0)  # b's heartbeat thread freezes
        start = time.monotonic()
        event = await asyncio.wait_for(a.events.get(), LIVENESS + 2)
        assert time.monotonic() - start < LIVENESS + 0.5
        assert event["topic"] == "member_lost" and event["rank"] == 1 and "no heartbeat for" in event["reason"]
        with pytest.raises(netcoll.RendezvousError, match=r"rank 1 \(member 'b'\) is gone: no heartbeat for"):
            await a.barrier("x", timeout=2)
        await asyncio.sleep(LIVENESS)
        rows = member_rows(coord, "m")
        assert [(m["connected"], m["liveness"]) for m in rows] == [(True, "ok"), (False, "disconnected"), (True, "ok")]
        assert a.events.empty()
    finally:
        for x in (a, b, c):
            await x.close()


async def test_heartbeat_threads_never_outlive_their_clients(coord: Coordinator) -> None:
    before = heartbeat_threads()
    assert before == []
    clients = [await RendezvousClient.connect(coord.address, heartbeat=0.5) for _ in range(3)]
    await until(lambda: all(c.lease is not None and c.lease.interval for c in clients))
    assert len(heartbeat_threads()) == 3
    for c in clients:
        await c.close()
    assert heartbeat_threads() == []

    # the coordinator goes away: the threads end with their connections
    other = await Coordinator().start()
    orphan = await RendezvousClient.connect(other.address, heartbeat=0.5)
    await until(lambda: orphan.lease is not None and orphan.lease.interval is not None)
    await other.close()
    await until(lambda: heartbeat_threads() == [])
    await orphan.close()

    # the client's event loop ends without close(): the thread ends too
    def forgotten() -> None:
        async def main() -> None:
            rdv = await RendezvousClient.connect(coord.address, heartbeat=0.5)
            await until(lambda: rdv.lease is not None and rdv.lease.interval is not None)

        asyncio.run(main())

    await asyncio.to_thread(forgotten)
    await until(lambda: heartbeat_threads() == [], timeout=LIVENESS + 2)

    # no heartbeats asked for: no thread at all
    quiet = await RendezvousClient.connect(coord.address, heartbeat=None)
    assert quiet.lease is None and heartbeat_threads() == []
    await quiet.close()
