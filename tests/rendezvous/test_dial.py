"""``netcoll.connect()`` with the coordinator not up yet (issue 38, "Starting up"): the
connection is tried again with backoff until the rendezvous timeout, then a typed error
naming the address. Containers start in any order."""

from __future__ import annotations

import asyncio
import itertools
import socket
from typing import Any

import pytest

import netcoll
from netcoll.errors import AuthenticationError, NetcollError, RendezvousTimeout
from netcoll.rendezvous import Coordinator, dial
from netcoll.rendezvous import dialing as dial_module
from netcoll.rendezvous.dialing import backoffs

pytestmark = [pytest.mark.tcp, pytest.mark.timeout(60)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def tries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every connection try, by outcome ("refused" / "ok" / the error's type); short backoffs."""
    seen: list[str] = []
    real = dial_module.RendezvousClient.connect

    async def counted(*args: Any, **kw: Any) -> Any:
        try:
            client = await real(*args, **kw)
        except ConnectionRefusedError:
            seen.append("refused")
            raise
        except Exception as exc:
            seen.append(type(exc).__name__)
            raise
        seen.append("ok")
        return client

    monkeypatch.setattr(dial_module.RendezvousClient, "connect", counted)
    monkeypatch.setattr(dial_module, "backoffs", lambda: itertools.repeat(0.01))
    return seen


def test_the_backoff_doubles_up_to_its_cap() -> None:
    assert list(itertools.islice(backoffs(0.05, 1.0), 7)) == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


async def test_a_coordinator_that_comes_up_later_is_reached(tries: list[str]) -> None:
    port = free_port()
    connecting = asyncio.ensure_future(dial(f"127.0.0.1:{port}", timeout=30.0, heartbeat=None))
    async with asyncio.timeout(30):
        while "refused" not in tries:  # it was not up at the first try...
            await asyncio.sleep(0.01)
    async with Coordinator(port=port):  # ... and comes up now
        client = await connecting
        await client.close()
    assert tries[0] == "refused" and tries[-1] == "ok"


async def test_connect_and_sync_connect_wait_for_the_coordinator(tries: list[str]) -> None:
    port = free_port()
    joining = asyncio.ensure_future(netcoll.connect(f"127.0.0.1:{port}", world_size=1, timeout=30.0).__aenter__())
    async with asyncio.timeout(30):
        while "refused" not in tries:
            await asyncio.sleep(0.01)
    async with Coordinator(port=port):
        comm = await joining
        assert comm.world_size == 1
        await comm.close()


async def test_no_coordinator_is_a_rendezvous_timeout_naming_the_address(tries: list[str]) -> None:
    port = free_port()
    with pytest.raises(RendezvousTimeout) as info:
        await dial(f"127.0.0.1:{port}", timeout=0.3, heartbeat=None)
    assert isinstance(info.value, NetcollError) and isinstance(info.value, TimeoutError)
    assert str(info.value).startswith(f"no coordinator at 127.0.0.1:{port} within 0.3s (connection refused; tried ")
    assert set(tries) == {"refused"}


async def test_a_refusal_by_the_server_is_not_tried_again(tries: list[str]) -> None:
    async with Coordinator(token="right") as coord:
        with pytest.raises(AuthenticationError):
            await dial(coord.address, timeout=30.0, token="wrong", heartbeat=None)
    assert tries == ["AuthenticationError"]
