"""Elastic groups in one process: ``Communicator.regroup`` and ``connect(elastic=True)``
over real loopback links at an in-process Coordinator (the SIGKILL case with rank
processes: tests/integration/test_elastic_processes.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import netcoll
from netcoll.epochs import Epochs
from netcoll.errors import CommunicatorClosed, RegroupTimeout, RendezvousError
from netcoll.rendezvous.membership import SESSION_KEY
from netcoll.wire import Kind

pytestmark = pytest.mark.tcp

Body = Callable[[netcoll.Communicator, int], Awaitable[Any]]


async def ranks(address: str, n: int, body: Body, **kw: Any) -> list[Any]:
    """Run ``body(comm, i)`` on ``n`` ranks joined at ``address``; their results."""

    async def one(i: int) -> Any:
        async with netcoll.connect(address, world_size=n, rank=i, timeout=30, **kw) as comm:
            return await body(comm, i)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


@contextlib.asynccontextmanager
async def coordinator() -> AsyncIterator[netcoll.Coordinator]:
    async with netcoll.Coordinator() as coord:
        yield coord


async def test_a_regroup_with_nothing_changed_returns_the_communicator_itself() -> None:
    async with coordinator() as coord:

        async def body(comm: netcoll.Communicator, i: int) -> tuple[bool, bool, bool, float, int]:
            first = await comm.regroup(timeout=20)
            second = await first.regroup(timeout=20)
            y = await second.all_reduce(np.full(3, i + 1.0))  # (every rank is still in the group here)
            return first is comm, second is comm, comm.joined, float(y[0]), coord.status()["groups"][0]["epoch"]

        out = await ranks(coord.address, 3, body)
        assert out == [(True, True, False, 6.0, 0)] * 3


async def test_the_member_that_never_calls_regroup_is_named() -> None:
    release = asyncio.Event()
    errors: list[BaseException] = []

    async def body(comm: netcoll.Communicator, i: int) -> None:
        if i == 2:
            await release.wait()  # alive, connected, never calls regroup
            return
        try:
            await comm.regroup(timeout=0.5)
        except RegroupTimeout as exc:
            errors.append(exc)
        finally:
            if len(errors) == 2:
                release.set()

    async with coordinator() as coord:
        await ranks(coord.address, 3, body)
    assert len(errors) == 2
    for exc in errors:
        text = str(exc)
        assert isinstance(exc, netcoll.NetcollError) and isinstance(exc, TimeoutError)
        assert "rank 2 (member" in text and "never called regroup" in text, text
        assert "rank 0 (" not in text and "rank 1 (" not in text, text


async def test_shrink_then_grow_in_order_with_a_newcomer_joined() -> None:
    """A member leaves; the others regroup to 2 in order; a newcomer connects with
    elastic=True and a regroup admits it last, with joined True."""
    seen: dict[str, Any] = {}
    shrunk = asyncio.Event()

    async def body(comm: netcoll.Communicator, i: int) -> list[Any]:
        if i == 1:
            return []  # leaves the group
        with contextlib.suppress(netcoll.NetcollError):
            await comm.all_reduce(np.ones(2), timeout=10)  # fails once rank 1 has left
        new = await comm.regroup(timeout=20)
        assert comm.closed and new is not comm
        got = [new.rank, new.world_size, new.group, float((await new.all_reduce(np.full(2, i + 1.0)))[0])]
        shrunk.set()
        grown = new
        while grown is new:  # every step regroups; admits the newcomer once it waits
            grown = await new.regroup(timeout=20)
            await asyncio.sleep(0.05)
        step = await grown.broadcast(np.array([7 if grown.rank == 0 else 0]), root=0)
        y = await grown.all_reduce(np.full(2, grown.rank + 1.0))
        return [*got, grown.rank, grown.world_size, grown.joined, int(step[0]), float(y[0])]

    async def newcomer(address: str) -> None:
        await shrunk.wait()
        async with netcoll.connect(address, group="default", elastic=True, timeout=30) as comm:
            step = await comm.broadcast(np.array([0]), root=0)
            y = await comm.all_reduce(np.full(2, comm.rank + 1.0))
            seen.update(rank=comm.rank, size=comm.world_size, joined=comm.joined, step=int(step[0]), y=float(y[0]))

    async with coordinator() as coord:
        out, _ = await asyncio.gather(ranks(coord.address, 3, body), newcomer(coord.address))
    assert out[0] == [0, 2, "default/e1", 4.0, 0, 3, False, 7, 6.0]
    assert out[2] == [1, 2, "default/e1", 4.0, 1, 3, False, 7, 6.0]
    assert seen == {"rank": 2, "size": 3, "joined": True, "step": 7, "y": 6.0}


async def test_a_frame_of_the_old_epoch_is_dropped_and_counted() -> None:
    async def body(comm: netcoll.Communicator, i: int) -> dict[str, Any]:
        if i == 2:
            return {}
        with contextlib.suppress(netcoll.NetcollError):
            await comm.barrier(timeout=10)
        new = await comm.regroup(timeout=20)
        mesh = new.transport
        if new.rank == 1:  # an old epoch's DATA, for the seq the next call of the new group takes
            header = {"g": "default", "q": 1, "f": "stale", "s": 0, "c": 0}
            await mesh.send(0, Kind.DATA, header, memoryview(np.full(4, 999.0).tobytes()))
            await new.send(np.ones(1), dst=0)
        else:
            await new.recv(src=1)  # (after the stale frame: one link keeps its order)
        y = await new.all_reduce(np.full(4, new.rank + 1.0))
        stats = new.link_stats()[1 - new.rank]
        return {"y": y.tolist(), "stale": stats["stale_frames"], "held": mesh.mailbox.early_bytes}

    async with coordinator() as coord:
        out = await ranks(coord.address, 3, body)
    assert out[0] == {"y": [3.0] * 4, "stale": 1, "held": 0}
    assert out[1] == {"y": [3.0] * 4, "stale": 0, "held": 0}


async def test_regroup_refusals() -> None:
    async with coordinator() as coord:

        async def body(comm: netcoll.Communicator, i: int) -> None:
            with pytest.raises(ValueError, match="timeout"):
                await comm.regroup(timeout=0)
            sub = await comm.split(0)
            assert sub is not None
            with pytest.raises(RendezvousError, match="cannot regroup"):
                await sub.regroup()
            await comm.barrier()

        await ranks(coord.address, 2, body)

        async def closed(comm: netcoll.Communicator, i: int) -> None:
            await comm.close()
            with pytest.raises(CommunicatorClosed):
                await comm.regroup()

        await ranks(coord.address, 1, closed)
        with pytest.raises(ValueError, match="no rank"):
            async with netcoll.connect(coord.address, elastic=True, rank=0):
                pass


async def test_a_newcomer_nobody_admits_times_out() -> None:
    async with coordinator() as coord:
        with pytest.raises(RegroupTimeout, match="no group 'nobody' is running"):
            async with netcoll.connect(coord.address, group="nobody", elastic=True, timeout=0.3):
                pass
        assert "nobody" not in coord.elastic.rounds  # it left the queue, and the empty round went


async def test_an_epoch_that_fails_to_link_is_left_by_the_next_regroup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 3 leaves; in the regroup that follows, rank 2 dies before linking the new
    epoch: ranks 0 and 1 fail to link it, call regroup again on the Communicator they
    hold, and get an epoch of the two of them."""
    opened = Epochs.open

    async def open_or_die(self: Epochs, result: dict[str, Any], timeout: float, *, joined: bool = False) -> Any:
        if result.get("epoch") == 1 and result["rank"] == 2:
            await self.rdv.close()  # gone from the coordinator, never linking
            raise ConnectionAbortedError("rank 2 died while the group regrouped")
        return await opened(self, result, timeout, joined=joined)

    monkeypatch.setattr(Epochs, "open", open_or_die)

    async def body(comm: netcoll.Communicator, i: int) -> Any:
        if i == 3:
            return None
        with contextlib.suppress(netcoll.NetcollError):
            await comm.barrier(timeout=10)
        try:
            await comm.regroup(timeout=1.0)
        except ConnectionAbortedError:
            return "died"
        except RendezvousError as exc:  # could not link to rank 2
            assert "could not link to ranks [2]" in str(exc), exc
        new = await comm.regroup(timeout=20)
        y = await new.all_reduce(np.full(2, new.rank + 1.0))
        return [new.rank, new.world_size, new.group, y.tolist()]

    async with coordinator() as coord:
        out = await ranks(coord.address, 4, body)
    assert out[2] == "died"
    assert out[0] == [0, 2, "default/e2", [3.0, 3.0]] and out[1] == [1, 2, "default/e2", [3.0, 3.0]]


async def test_the_coordinators_refusals_and_the_queue() -> None:
    async with coordinator() as coord:
        member = await netcoll.rendezvous.RendezvousClient.connect(coord.address)
        other = await netcoll.rendezvous.RendezvousClient.connect(coord.address)
        try:
            await member.join("g", world_size=1, listen_port=1)
            with pytest.raises(RendezvousError, match="at epoch 5, the group at 0"):
                await member.rpc.call("regroup", {"group": "g", "epoch": 5, "timeout": 5})
            with pytest.raises(TypeError, match="epoch must be an int"):
                await member.rpc.call("regroup", {"group": "g", "epoch": "0", "timeout": 5})
            with pytest.raises(RendezvousError, match="not a member of group 'h'"):
                await member.rpc.call("regroup", {"group": "h", "epoch": 0, "timeout": 5})
            elastic = {"group": "g", "elastic": True, "listen_port": 2, "timeout": 5}
            with pytest.raises(RendezvousError, match="takes no rank"):
                await other.rpc.call("join", {**elastic, "rank": 0, "member_id": "x"})
            with pytest.raises(RendezvousError, match="already a member"):
                await other.rpc.call("join", {**elastic, "member_id": member.member_id})
            waiting = asyncio.ensure_future(other.rpc.call("join", {**elastic, "member_id": "late"}))
            while "g" not in coord.elastic.rounds:
                await asyncio.sleep(0.01)
            assert [n.member_id for n in coord.elastic.rounds["g"].newcomers] == ["late"]
            await other.close()  # its connection closes while it waits: it leaves the queue
            with pytest.raises((ConnectionError, netcoll.NetcollError)):
                await waiting
            while "g" in coord.elastic.rounds:
                await asyncio.sleep(0.01)
            alone = await member.rpc.call("regroup", {"group": "g", "epoch": 0, "timeout": 5})
            assert alone == {"changed": False, "epoch": 0}  # nobody was admitted
        finally:
            await other.close()
            await member.close()


async def test_a_member_judged_gone_by_liveness_is_not_waited_for() -> None:
    """Rank 2 hangs (alive to the kernel, so its connection stays open); once liveness
    judges it gone (what an expired lease does: Liveness.drop), the round closes without it."""
    release = asyncio.Event()

    async with coordinator() as coord:

        def session_of(rank: int) -> Any:
            for s in coord.sessions:
                entry = s.data.get(SESSION_KEY, {}).get("default")
                if entry is not None and entry[1].rank == rank:
                    return s
            raise AssertionError(f"no session of rank {rank}")

        async def body(comm: netcoll.Communicator, i: int) -> Any:
            if i == 2:
                while len(getattr(coord.elastic.rounds.get("default"), "called", ())) < 2:
                    await asyncio.sleep(0.01)  # ranks 0 and 1 wait in the round, for rank 2
                coord.liveness.drop(session_of(2), "no heartbeat for 9.9s", "is gone")
                await release.wait()
                return None
            new = await comm.regroup(timeout=20)
            y = await new.all_reduce(np.full(2, new.rank + 1.0))
            release.set()
            return [new.rank, new.world_size, y.tolist()]

        out = await ranks(coord.address, 3, body)
    assert out[:2] == [[0, 2, [3.0, 3.0]], [1, 2, [3.0, 3.0]]]
