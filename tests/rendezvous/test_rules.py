"""The coordinator's rules without a coordinator or a socket: one group instance's
key-value store and barriers (netcoll.rendezvous.store), joining and leaving
(netcoll.rendezvous.membership) and the liveness verdicts (netcoll.rendezvous.liveness),
driven directly with stand-in sessions."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from netcoll.errors import RendezvousError, RendezvousTimeout
from netcoll.limits import Limits
from netcoll.rendezvous.groups import Member
from netcoll.rendezvous.liveness import LEASE_KEY, UNRESPONSIVE, Liveness
from netcoll.rendezvous.membership import RUNNING, SESSION_KEY, Membership
from netcoll.rendezvous.store import Store, pack


def _session(n: int = 0, **hello: Any) -> Any:
    """The parts of an RPC Session the rules read."""
    return SimpleNamespace(peer=("127.0.0.1", 40000 + n), data={}, hello=hello, last_seen=0.0)


# -- the store -------------------------------------------------------------------------------


async def test_set_get_delete_keep_the_byte_count_exact() -> None:
    store = Store("g", 2)
    store.set("a", pack("a", [1, 2, 3]))
    store.set("b", memoryview(msgpack.packb(b"xy")))
    assert msgpack.unpackb(await store.get("a", 1.0)) == [1, 2, 3]
    assert store.kv_bytes == sum(len(v) for v in store.kv.values())
    store.set("a", pack("a", 7))  # overwrite: the old size is given back
    assert store.kv_bytes == sum(len(v) for v in store.kv.values())
    assert store.delete("a") is True and store.delete("a") is False
    assert store.kv_bytes == len(store.kv["b"])


async def test_a_value_over_a_limit_is_refused_before_it_is_stored() -> None:
    store = Store("g", 2, Limits(max_kv_value_bytes=10, max_kv_bytes=15, max_kv_keys=100))
    with pytest.raises(RendezvousError, match="max_kv_value_bytes"):
        store.set("k", memoryview(bytes(11)))
    store.set("k", bytes(10))
    with pytest.raises(RendezvousError, match="max_kv_bytes"):
        store.set("j", bytes(6))
    store.set("k", bytes(5))  # replacing k frees its 10 bytes
    store.set("j", bytes(10))
    assert store.kv_bytes == 15 and "j" in store.kv


async def test_keys_awaited_keys_and_barriers_count_against_max_kv_keys() -> None:
    store = Store("g", 2, Limits(max_kv_keys=3))
    store.set("a", b"\x01")
    waiter = asyncio.ensure_future(store.get("b", 30.0))
    barrier = asyncio.ensure_future(store.barrier(0, "x", 30.0))
    await asyncio.sleep(0)
    assert set(store.kv_waiters) == {"b"} and set(store.barriers) == {"x"}
    with pytest.raises(RendezvousError, match="max_kv_keys"):
        store.set("c", b"\x01")
    store.set("a", b"\x02")  # an existing key is not a new one
    with pytest.raises(RendezvousError, match="max_kv_keys"):
        store.set("b", b"\x03")  # nor is an awaited one stored while it would be a fourth
    assert store.delete("a")
    store.set("b", b"\x03")  # the awaited key is set: its waiter is answered
    assert await waiter == b"\x03"
    store.close(RendezvousError("gone"))
    with pytest.raises(RendezvousError, match="gone"):
        await barrier


async def test_add_counts_in_64_bits_and_refuses_what_is_not_an_int() -> None:
    store = Store("g", 2)
    assert store.add("n", 5) == 5 and store.add("n", -7) == -2
    with pytest.raises(ValueError, match="overflow"):
        store.add("n", -(2**63))
    with pytest.raises(TypeError, match="amount must be an int"):
        store.add("n", True)
    store.set("s", pack("s", "text"))
    with pytest.raises(TypeError, match="holds a str"):
        store.add("s", 1)
    assert msgpack.unpackb(store.kv["n"]) == -2


async def test_get_waits_for_the_key_and_times_out_cleanly() -> None:
    store = Store("g", 2)
    with pytest.raises(RendezvousTimeout, match="not set within"):
        await store.get("k", 0.01)
    assert not store.kv_waiters  # the waiter left no trace
    waiting = asyncio.ensure_future(store.get("k", 30.0))
    await asyncio.sleep(0)
    store.set("k", b"\x05")
    assert await waiting == b"\x05"


async def test_a_barrier_opens_when_every_rank_arrived_and_breaks_when_one_is_gone() -> None:
    store = Store("g", 3)
    first = [asyncio.ensure_future(store.barrier(r, "b", 30.0)) for r in (0, 1)]
    await asyncio.sleep(0)
    with pytest.raises(RendezvousError, match="already waiting"):
        await store.barrier(0, "b", 30.0)
    await store.barrier(2, "b", 30.0)
    await asyncio.gather(*first)
    assert not store.barriers
    with pytest.raises(RendezvousTimeout, match="b"):
        await store.barrier(0, "late", 0.01)
    assert not store.barriers  # the lone arrival left
    waiting = asyncio.ensure_future(store.barrier(1, "c", 30.0))
    await asyncio.sleep(0)
    store.break_barriers("rank 2 left")
    with pytest.raises(RendezvousError, match="rank 2 left"):
        await waiting
    with pytest.raises(RendezvousError, match="cannot complete: rank 2 left"):
        await store.barrier(0, "d", 30.0)


# -- membership --------------------------------------------------------------------------------


def _join(n: int, **extra: Any) -> dict[str, Any]:
    return {"group": "g", "world_size": 2, "member_id": f"m{n}", "listen_port": 1000 + n, "timeout": 30, **extra}


async def test_a_group_completes_announces_losses_and_is_deleted_when_empty() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    groups = Membership(notify=lambda m, e: events.append((m.member_id, e)))
    s0, s1 = _session(0), _session(1)
    joins = [asyncio.ensure_future(groups.join(s, _join(n))) for n, s in enumerate((s0, s1))]
    r0, r1 = await asyncio.gather(*joins)
    assert (r0["rank"], r1["rank"], r0["generation"]) == (0, 1, 1) and r0["peers"] == r1["peers"]
    group = groups.groups["g"]
    assert group.state == RUNNING and s0.data[SESSION_KEY]["g"][0] is group
    assert groups.running(s1, {"group": "g"})[1].rank == 1
    groups.closed(s0, "connection closed", "was lost")
    assert [(who, e["topic"], e["rank"]) for who, e in events] == [("m1", "member_lost", 0)]
    assert group.store.broken is not None and "rank 0" in group.store.broken
    groups.leave(s1, {"group": "g"})
    assert not groups.groups and not s1.data[SESSION_KEY]
    again = [asyncio.ensure_future(groups.join(_session(n), _join(n))) for n in (2, 3)]
    assert (await asyncio.gather(*again))[0]["generation"] == 2  # a new instance of the name


async def test_a_pending_group_refuses_a_disagreeing_joiner_and_dies_with_its_last_joiner() -> None:
    groups = Membership()
    s0 = _session(0)
    waiting = asyncio.ensure_future(groups.join(s0, _join(0)))
    await asyncio.sleep(0)
    with pytest.raises(RendezvousError, match="world_size disagreement"):
        await groups.join(_session(1), _join(1, world_size=3))
    with pytest.raises(RendezvousError, match="still pending"):
        groups.running(s0, {"group": "g"})
    groups.leave(s0, {"group": "g"})
    with pytest.raises(RendezvousError, match="left group 'g' before it completed"):
        await waiting
    assert not groups.groups


# -- liveness ------------------------------------------------------------------------------------


def _main_and_heartbeat(liveness: Liveness) -> tuple[Any, Any]:
    main, beat = _session(0, lease="L", heartbeat=0.5), _session(1)
    main.proto = beat.proto = SimpleNamespace(lost=None)
    liveness.opened(main)
    assert liveness.claim(beat, {"lease": "L"}) == {"interval": 2.5, "timeout": 10.0}
    return main, beat


def test_a_lease_holder_silent_past_the_timeout_is_gone() -> None:
    dropped: list[tuple[Any, str, str]] = []
    sessions: list[Any] = []
    liveness = Liveness(lambda: sessions, lambda s, why, v: dropped.append((s, why, v)), Limits(liveness_timeout_s=10))
    main, beat = _main_and_heartbeat(liveness)
    sessions.extend((main, beat))
    assert main.data[LEASE_KEY] is beat
    beat.last_seen = main.last_seen = 100.0
    assert 0 < liveness.check(105.0) <= 1.0 and not dropped
    assert liveness.check(110.5) and [(s, v) for s, _, v in dropped] == [(main, "is gone")]
    assert "no heartbeat for 10.5s" in dropped[0][1]


def test_a_quiet_event_loop_under_a_live_heartbeat_is_unresponsive_not_gone() -> None:
    sessions: list[Any] = []
    limits = Limits(liveness_timeout_s=10, progress_timeout_s=30)
    liveness = Liveness(lambda: sessions, lambda *a: pytest.fail(f"dropped {a}"), limits)
    main, beat = _main_and_heartbeat(liveness)
    sessions.extend((main, beat))
    main.last_seen, beat.last_seen = 0.0, 40.0
    liveness.check(40.0)
    assert main.data[UNRESPONSIVE] == 0.0
    main.last_seen = 41.0  # its loop answered again
    liveness.check(41.0)
    assert UNRESPONSIVE not in main.data


def test_a_second_claim_of_a_held_lease_is_refused() -> None:
    liveness = Liveness(set, lambda *a: None, Limits(liveness_timeout_s=10))
    _main_and_heartbeat(liveness)
    other = _session(2)
    other.proto = SimpleNamespace(lost=None)
    with pytest.raises(RendezvousError, match="already held"):
        liveness.claim(other, {"lease": "L"})
    with pytest.raises(ValueError, match="already in use"):
        liveness.opened(_session(3, lease="L"))
    assert liveness.row(Member("m", None, "h", 1, ("h", 1), connected=False)) == {"liveness": "disconnected"}
