"""Errors of send/recv name the communicator's ranks, not the message's two places
(its operation's members are the pair (src, dst); 0 and 1 mean nothing to users)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import netcoll
from netcoll.comm import Communicator
from tests.support import run_world_settled


async def test_recv_timeout_names_the_ranks() -> None:
    async def body(c: Communicator) -> None:
        if c.rank == 2:
            await c.recv(1, timeout=0.3)  # rank 1 never sends

    res = await run_world_settled(3, body)
    assert res[:2] == [None, None]
    err = res[2]
    assert isinstance(err, netcoll.CollectiveTimeout), err
    assert "on rank 2" in str(err) and "waiting for rank 1" in str(err), err
    assert err.ranks == (1,)


async def test_cancelled_recv_names_the_cancelling_rank() -> None:
    async def body(c: Communicator) -> str:
        if c.rank == 2:
            work = c.recv(1)
            await asyncio.sleep(0)
            work.cancel()
            with pytest.raises(asyncio.CancelledError):
                await work
            await c.barrier()
            return "cancelled"
        await c.barrier()  # rank 2 cancelled its recv before it entered the barrier
        if c.rank == 1:
            with pytest.raises(netcoll.CollectiveCancelled) as peer:
                await c.send(np.ones(1), 2)
            assert peer.value.ranks == (2,)
            return str(peer.value)
        return ""

    res = await run_world_settled(3, body)
    assert res[2] == "cancelled", res
    assert "cancelled on rank 2" in res[1], res
