"""The decider of a partial all_reduce: the store's set-once rule (Store.decide), the
in-process one (LocalDecider), and the coordinator's, reached over RPC by
netcoll.connect's Communicators (a partial all_reduce over loopback TCP)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import numpy as np
import pytest

from netcoll.errors import RendezvousError
from netcoll.limits import Limits
from netcoll.mesh.inprocess import LocalDecider
from netcoll.rendezvous import store as store_mod
from netcoll.rendezvous.store import Store
from tests.support.worlds import connected_world


def test_the_first_value_wins_and_every_caller_gets_it() -> None:
    store = Store("g", 3)
    first = msgpack.packb([0, 1])
    assert store.decide("partial/g/e0", 5, first) == first
    assert store.decide("partial/g/e0", 5, msgpack.packb([0, 1, 2])) == first  # set once
    assert store.decide("partial/g/e0", 6, msgpack.packb([2])) == msgpack.packb([2])  # another seq
    assert store.decide("partial/g/e1", 5, msgpack.packb([1])) == msgpack.packb([1])  # another epoch
    assert store.kv_bytes == sum(len(v) for b in store.decisions.values() for v in b.values.values())


def test_old_decisions_are_forgotten_and_refused_not_decided_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "DECISIONS_KEPT", 3)
    store = Store("g", 2)
    for seq in range(5):
        store.decide("n", seq, msgpack.packb([seq]))
    assert sorted(store.decisions["n"].values) == [2, 3, 4]
    assert store.decide("n", 3, msgpack.packb([9])) == msgpack.packb([3])  # still kept
    with pytest.raises(RendezvousError, match="forgotten"):
        store.decide("n", 1, msgpack.packb([9]))
    assert store.kv_bytes == sum(len(v) for v in store.decisions["n"].values.values())


def test_limits_and_bad_seqs() -> None:
    store = Store("g", 2, Limits(max_kv_value_bytes=10, max_kv_keys=2))
    with pytest.raises(RendezvousError, match="max_kv_value_bytes"):
        store.decide("n", 0, b"x" * 11)
    store.set("a", msgpack.packb(1))
    store.decide("n", 0, b"\x90")
    with pytest.raises(RendezvousError, match="max_kv_keys"):
        store.decide("m", 0, b"\x90")  # a second name is a third key
    for bad in (-1, True, "1", 2**64, None):
        with pytest.raises(TypeError, match="seq"):
            store.decide("n", bad, b"\x90")


async def test_local_decider_first_wins_and_forgets_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LocalDecider, "KEPT", 2)
    decide = LocalDecider()
    assert await decide("g", 0, (0, 1), 1.0) == (0, 1)
    assert await decide("g", 0, (0, 1, 2), 1.0) == (0, 1)
    await decide("g", 1, (0,), 1.0)
    await decide("g", 2, (0,), 1.0)
    with pytest.raises(LookupError, match="forgotten"):
        await decide("g", 0, (0, 1, 2), 1.0)


@pytest.mark.tcp
async def test_connected_ranks_agree_through_the_coordinator() -> None:
    async with connected_world(3) as comms:
        xs = [np.full(1000, r + 1.0) for r in range(3)]
        works = [c.all_reduce(xs[c.rank], op="avg", partial=True, timeout=30) for c in comms]
        got = await asyncio.gather(*works)
        for y, w in zip(got, works, strict=True):
            assert w.contributors == (0, 1, 2)
            np.testing.assert_array_equal(y, np.full(1000, 2.0))
        # a Communicator from connect() decides at the coordinator under its epoch's group id
        from netcoll.rendezvous.client import RendezvousClient

        assert isinstance(comms[0].transport.decider.__self__.rdv, RendezvousClient)  # type: ignore[union-attr]


@pytest.mark.tcp
async def test_over_tcp_a_late_rank_behind_a_small_window_and_the_next_collective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As in memory: sends to the held rank stall on its window (TCP links), are abandoned
    once the others decided; the late rank gets PartialExcluded; the next all_reduce is right."""
    from netcoll.errors import PartialExcluded

    monkeypatch.setenv("NETCOLL_RECV_WINDOW", "256K")
    monkeypatch.setenv("NETCOLL_TRANSPORT", "tcp")
    async with connected_world(3) as comms:
        xs = [np.full(1 << 20, r + 1.0, np.float32) for r in range(3)]  # 4 MiB each
        go = asyncio.Event()

        async def late(c: Any) -> BaseException:
            await go.wait()
            with pytest.raises(PartialExcluded) as info:
                await c.all_reduce(xs[c.rank], partial=True, timeout=2.0)
            return info.value

        held = asyncio.ensure_future(late(comms[2]))
        works = [c.all_reduce(xs[c.rank], partial=True, timeout=3.0) for c in comms[:2]]
        got = await asyncio.gather(*works)
        go.set()
        assert (await held).ranks == (0, 1)
        assert [w.contributors for w in works] == [(0, 1), (0, 1)]
        np.testing.assert_array_equal(got[0], np.full(1 << 20, 3.0, np.float32))
        again = await asyncio.wait_for(asyncio.gather(*(c.all_reduce(xs[c.rank]) for c in comms)), timeout=60)
        for y in again:
            np.testing.assert_array_equal(y, np.full(1 << 20, 6.0, np.float32))
