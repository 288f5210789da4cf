"""Sizes and counts a joiner or requester declares are checked against
:mod:`netcoll.limits` before anything is allocated or looped over by them
(issue 10, finding 1): a refusal is a typed ``RendezvousError`` naming the
limit (plus a log line), and no value of any type makes a handler raise
anything else (``OverflowError``, ``MemoryError``...) or stall the loop."""

from __future__ import annotations

import asyncio
import logging
import time
import tracemalloc
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import netcoll
from netcoll.errors import RendezvousError
from netcoll.limits import Limits
from netcoll.rendezvous import Coordinator, RendezvousClient
from netcoll.rendezvous.groups import parse_join, show

# every type a peer could put in a numeric field, and the sizes that hurt
ANY_VALUE = st.one_of(
    st.integers(),
    st.integers(min_value=2**62),
    st.integers(max_value=-(2**62)),
    st.sampled_from([0, -1, 1, 2, 2**31, 2**63, 2**64, 2**70, 10**7, 10**9, 10**5000, -(10**5000)]),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -0.0, 5e-324]),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.none(),
    st.lists(st.integers(), max_size=3),
)
ALLOWED = (RendezvousError, TypeError, ValueError)  # what a refusal may be (RendezvousTimeout is a RendezvousError)
QUICK = 0.5  # seconds of this thread's CPU: a refusal is immediate, it never stalls the loop
#: loop iterations a handler may take before it counts as waiting (for other members, a timer...)
STEPS = 20


def _session(n: int = 0) -> Any:
    """The parts of an RPC Session the rendezvous handlers use."""
    return SimpleNamespace(peer=("127.0.0.1", 40000 + n), data={}, hello={}, proto=None)


async def _call(coord: Coordinator, method: str, session: Any, params: dict[str, Any], payload: bytes = b"") -> Any:
    """Run one handler: its result, its refusal (an ALLOWED error, returned), or
    "waiting" if it is still (legitimately) waiting for something outside it after
    :data:`STEPS` iterations of the loop (counted, not timed: on a loaded machine a
    moment of wall time was not always enough for an immediate answer). Whatever it
    did, it took under :data:`QUICK` of this thread's CPU (time spent waiting for a core
    does not count)."""
    cpu = time.thread_time()
    task = asyncio.ensure_future(coord.methods[method](session, params, memoryview(payload)))
    for _ in range(STEPS):
        if task.done():
            break
        await asyncio.sleep(0)
    assert time.thread_time() - cpu < QUICK
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return "waiting"
    exc = task.exception()
    if exc is None:
        return task.result()
    if not isinstance(exc, ALLOWED):
        pytest.fail(f"{method}({show(params)}) raised {type(exc).__name__}: {show(str(exc))}")
    return exc


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(["world_size", "rank", "listen_port", "timeout"]), value=ANY_VALUE)
def test_join_fields_of_any_value_are_refused_cleanly(field: str, value: Any) -> None:
    params: dict[str, Any] = {"group": "g", "world_size": 2, "rank": None, "member_id": "m", "listen_port": 1}
    params["timeout"] = 30.0
    params[field] = value

    async def main() -> None:
        coord = Coordinator(limits=Limits())
        await _call(coord, "join", _session(), params)
        assert not coord.groups or all(g.world_size <= Limits().max_world_size for g in coord.groups.values())

    _run(main())
    try:  # the client-side check takes the same path
        parse_join(params)
    except ALLOWED:
        pass


async def _running_group(coord: Coordinator) -> Any:
    session = _session()
    result = await _call(coord, "join", session, {"group": "g", "world_size": 1, "member_id": "m", "listen_port": 1})
    assert isinstance(result, dict) and result["rank"] == 0, result
    return session


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    call=st.sampled_from(
        [
            ("kv_add", "amount"),
            ("kv_get", "timeout"),
            ("barrier", "timeout"),
            ("kv_set", "value"),
            ("kv_get", "key"),
            ("kv_set", "key"),
            ("barrier", "name"),
            ("kv_delete", "key"),
            ("kv_decide", "key"),
            ("kv_decide", "seq"),
        ]
    ),
    value=ANY_VALUE,
    preset=st.sampled_from([None, 0, 2**63 - 1, -(2**63)]),
)
def test_kv_and_barrier_fields_of_any_value_are_refused_cleanly(
    call: tuple[str, str], value: Any, preset: int | None
) -> None:
    method, field = call
    params: dict[str, Any] = {
        "group": "g",
        "key": "k",
        "name": "b",
        "timeout": 30.0,
        "amount": 1,
        "value": 1,
        "seq": 0,
    }
    params[field] = value

    async def main() -> None:
        coord = Coordinator(limits=Limits())
        session = await _running_group(coord)
        if preset is not None:  # an int already stored (kv_add must not overflow it)
            assert await _call(coord, "kv_set", session, {"group": "g", "key": "k", "value": preset}) == {}
        await _call(coord, method, session, params, b"\x91\x00" if method == "kv_decide" else b"")
        store = coord.groups["g"].store
        decided = sum(len(v) for book in store.decisions.values() for v in book.values.values())
        assert store.kv_bytes == sum(len(v) for v in store.kv.values()) + decided

    _run(main())


@pytest.mark.parametrize("world_size", [10**7, 10**9, 2**70, 10**5000], ids=["1e7", "1e9", "2**70", "1e5000"])
async def test_a_huge_world_size_is_refused_at_once_without_allocating(
    world_size: int, caplog: pytest.LogCaptureFixture
) -> None:
    coord = Coordinator()
    params = {"group": "g", "world_size": world_size, "member_id": "m", "listen_port": 1, "timeout": 30}
    tracemalloc.start()
    try:
        start = time.thread_time()  # CPU time: a loaded machine's waits for a core do not count
        with caplog.at_level(logging.INFO, logger="netcoll.rendezvous"):
            exc = await _call(coord, "join", _session(), params)
        took = time.thread_time() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(exc, RendezvousError) and not isinstance(exc, TimeoutError)
    assert "max_world_size=4096" in str(exc) and "NETCOLL_LIMIT_MAX_WORLD_SIZE" in str(exc)
    assert took < 0.1 and peak < 1 << 20, (took, peak)
    assert not coord.groups
    assert any(r.levelno == logging.WARNING and "max_world_size" in r.getMessage() for r in caplog.records)


@pytest.mark.tcp
async def test_limits_over_real_rpc(caplog: pytest.LogCaptureFixture) -> None:
    limits = Limits(max_world_size=8, max_kv_keys=4, max_kv_key_bytes=16, max_kv_value_bytes=1000, max_kv_bytes=2500)
    async with (
        netcoll.Coordinator(limits=limits) as coord,
        await RendezvousClient.connect(coord.address, heartbeat=None) as rdv,
    ):
        with pytest.raises(RendezvousError, match=r"world_size 9 exceeds .*max_world_size=8"):
            await rdv.join("big", world_size=9, timeout=5)
        # the raw request, without the client-side check
        with pytest.raises(RendezvousError, match="max_world_size"):
            await rdv.rpc.call("join", {"group": "g", "world_size": 10**9, "member_id": "m", "listen_port": 0})
        await rdv.join("g", world_size=1, timeout=5)

        with pytest.raises(RendezvousError, match="max_kv_key_bytes=16"):
            await rdv.kv_set("k" * 17, 1)
        with pytest.raises(RendezvousError, match="max_kv_key_bytes=16"):
            await rdv.kv_get("é" * 9, timeout=1)  # 18 UTF-8 bytes
        with pytest.raises(RendezvousError, match="max_kv_key_bytes=16"):
            await rdv.barrier("b" * 100, timeout=1)
        with pytest.raises(RendezvousError, match="max_kv_value_bytes=1000"):
            await rdv.kv_set("a", b"x" * 2000)
        await rdv.kv_set("a", b"x" * 900)
        await rdv.kv_set("b", b"x" * 900)
        with pytest.raises(RendezvousError, match="max_kv_bytes=2500"):
            await rdv.kv_set("c", b"x" * 900)
        await rdv.kv_set("a", b"x" * 10)  # replacing a value frees its bytes
        await rdv.kv_set("c", b"x" * 900)
        assert await rdv.kv_add("n", 5) == 5
        with pytest.raises(RendezvousError, match="max_kv_keys=4"):
            await rdv.kv_set("d", 1)
        with pytest.raises(RendezvousError, match="max_kv_keys=4"):
            await rdv.kv_get("never", timeout=1)  # a waiter would be a fifth key
        assert await rdv.kv_delete("c")
        await rdv.kv_set("d", 1)  # room again
        with pytest.raises(ValueError, match="overflow"):
            await rdv.kv_add("n", 2**63 - 1)
        assert await rdv.kv_get("n") == 5
        with pytest.raises(RendezvousError, match="max_deadline_s"):
            await rdv.kv_get("a", timeout=10**6)
        # the coordinator still serves
        assert await rdv.kv_get("b", timeout=1) == b"x" * 900
    refusals = [
        r.getMessage() for r in caplog.records if r.name == "netcoll.rendezvous" and "refused" in r.getMessage()
    ]
    assert any("max_kv_keys" in m for m in refusals) and any("max_world_size" in m for m in refusals)


async def test_refusals_show_hostile_strings_escaped(caplog: pytest.LogCaptureFixture) -> None:
    coord = Coordinator()
    hostile = "\x1b[2J\x1b[31mEVIL\nFAKE LOG LINE\u202e" + "x" * 5000
    with caplog.at_level(logging.INFO, logger="netcoll.rendezvous"):
        exc = await _call(coord, "join", _session(), {"group": hostile, "world_size": 1, "member_id": "m"})
        assert isinstance(exc, TypeError)
        exc = await _call(
            coord,
            "join",
            _session(),
            {"group": "g", "world_size": 2, "member_id": "m\x1b[1m", "listen_port": 1, "advertise_host": "0.0.0.0"},
        )
        assert isinstance(exc, RendezvousError)
    for r in caplog.records:
        text = r.getMessage()
        assert "\x1b" not in text and "\n" not in text and "\u202e" not in text
        assert len(text) < 2000
    assert any("\\x1b" in r.getMessage() for r in caplog.records)
