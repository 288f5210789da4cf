"""Polling a link from inside an operation (``Channel.progress``): it reads
what arrived without the event loop, stops as soon as the receive is done,
never runs while other work is ready, gives up after its budget, and reads
its budget from ``NETCOLL_POLL_US``."""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

import numpy as np
import pytest

from netcoll.transport import base
from netcoll.transport.base import Channel
from tests.support.groups import tcp_group
from tests.transport.test_socketlink import pair


@pytest.fixture(autouse=True)
def alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """No other transport open in this process (other tests may leave some to the GC)."""
    monkeypatch.setattr(base, "_OPEN", weakref.WeakSet())


class FakeLink:
    """A link whose ``poll`` completes ``fut`` on the ``after``-th call."""

    def __init__(self, fut: asyncio.Future[Any], after: int) -> None:
        self.fut, self.after, self.polls = fut, after, 0

    def poll(self) -> bool:
        self.polls += 1
        if self.polls >= self.after and not self.fut.done():
            self.fut.set_result("arrived")
            return True
        return False


class FakeTransport:
    def __init__(self, link: FakeLink) -> None:
        self.links = {7: link}
        self.crowded = False


def channel(link: FakeLink) -> Channel:
    ch = Channel.__new__(Channel)  # only what progress() reads
    ch.transport = FakeTransport(link)  # type: ignore[assignment]
    ch.members = (3, 7)
    return ch


async def test_progress_polls_until_the_receive_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "POLL_BUDGET", 1.0)
    fut = asyncio.get_running_loop().create_future()
    link = FakeLink(fut, after=5)
    channel(link).progress(fut, 1)
    assert fut.done() and link.polls == 5


async def test_progress_does_not_poll_while_other_work_is_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "POLL_BUDGET", 1.0)
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    link = FakeLink(fut, after=1)
    loop.call_soon(lambda: None)  # another task's step is ready: run it instead of spinning
    channel(link).progress(fut, 1)
    assert link.polls == 0 and not fut.done()
    await asyncio.sleep(0)


async def test_progress_gives_up_after_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "POLL_BUDGET", 0.002)
    fut = asyncio.get_running_loop().create_future()
    link = FakeLink(fut, after=10**12)
    t0 = time.monotonic()
    channel(link).progress(fut, 1)
    assert not fut.done() and link.polls > 1
    assert time.monotonic() - t0 < 1.0  # bounded (generous: a loaded machine)


async def test_progress_off_when_the_budget_is_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "POLL_BUDGET", 0.0)
    fut = asyncio.get_running_loop().create_future()
    link = FakeLink(fut, after=1)
    channel(link).progress(fut, 1)
    assert link.polls == 0


def test_budget_from_the_environment() -> None:
    assert base._poll_budget({}) == pytest.approx(300e-6)
    assert base._poll_budget({"NETCOLL_POLL_US": "0"}) == 0
    assert base._poll_budget({"NETCOLL_POLL_US": "50"}) == pytest.approx(50e-6)
    for bad in ("fast", "-1", "1e9"):
        with pytest.raises(ValueError, match="NETCOLL_POLL_US"):
            base._poll_budget({"NETCOLL_POLL_US": bad})


async def test_socket_poll_reads_what_arrived_and_nothing_else() -> None:
    listener, client, server = await pair(small_buffers=False)
    try:
        assert server.transport.poll() is False  # type: ignore[union-attr]  # nothing sent yet
        client.transport.write(b"ping")  # type: ignore[union-attr]
        deadline = time.monotonic() + 5
        while not server.data and time.monotonic() < deadline:
            server.transport.poll()  # type: ignore[union-attr]  # no event loop turn needed
        assert bytes(server.data) == b"ping"
        server.transport.pause_reading()  # type: ignore[union-attr]
        client.transport.write(b"more")  # type: ignore[union-attr]
        await asyncio.sleep(0.05)
        assert server.transport.poll() is False  # type: ignore[union-attr]  # a paused reader is not read
        assert bytes(server.data) == b"ping"
    finally:
        listener.close()
        client.transport.abort()  # type: ignore[union-attr]


@pytest.mark.parametrize("budget", [0.0, 0.001])
async def test_small_collectives_over_tcp_with_and_without_polling(
    monkeypatch: pytest.MonkeyPatch, budget: float
) -> None:
    monkeypatch.setattr(base, "POLL_BUDGET", budget)
    g = await tcp_group(4)
    try:
        comms = g.communicators()
        for k in range(20):
            outs = await asyncio.gather(*(c.all_reduce(np.array([c.rank + k], np.int64)) for c in comms))
            assert [int(o[0]) for o in outs] == [6 + 4 * k] * 4
    finally:
        await g.close()


async def test_progress_does_not_poll_on_a_crowded_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "POLL_BUDGET", 1.0)
    fut = asyncio.get_running_loop().create_future()
    link = FakeLink(fut, after=1)
    ch = channel(link)
    ch.transport.crowded = True  # type: ignore[attr-defined]
    ch.progress(fut, 1)
    assert link.polls == 0


def test_local_ranks_counts_this_host_and_loopback() -> None:
    from netcoll.transport.tcp import local_ranks

    assert local_ranks([("127.0.0.1", 1), ("127.0.0.2", 2), ("127.0.0.3", 3)], 0) == 3
    assert local_ranks([("10.0.0.1", 1), ("10.0.0.2", 2), ("10.0.0.1", 3)], 0) == 2
    assert local_ranks([("10.0.0.1", 1), ("10.0.0.2", 2), ("10.0.0.1", 3)], 1) == 1
    assert local_ranks([("node-a", 1), ("node-b", 2), ("localhost", 3)], 0) == 2
    assert local_ranks([], 0) == 1


async def test_progress_does_not_poll_when_ranks_share_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "POLL_BUDGET", 1.0)
    fut = asyncio.get_running_loop().create_future()
    link = FakeLink(fut, after=1)
    others = [base.Transport(0, 2), base.Transport(1, 2)]  # two ranks in this process
    channel(link).progress(fut, 1)
    assert link.polls == 0
    for t in others:
        await t.close()
    assert len(base._OPEN) == 0
