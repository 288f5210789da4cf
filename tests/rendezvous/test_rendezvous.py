"""Rendezvous coordinator and client over real loopback TCP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack
import pytest

from netcoll.errors import AuthenticationError, RendezvousError, RendezvousTimeout
from netcoll.links.connection import FramedProtocol
from netcoll.mesh.handshake import server_handshake
from netcoll.mesh.server import Server
from netcoll.rendezvous import Coordinator, JoinResult, Peer, RendezvousClient
from netcoll.rendezvous.groups import JoinRequest, Member, check_join, is_loopback, resolve_host
from netcoll.rpc import RpcClient
from netcoll.wire import MAGIC, PREFIX, VERSION, Kind

pytestmark = [pytest.mark.tcp, pytest.mark.timeout(10)]

Connect = Callable[..., Awaitable[RendezvousClient]]


@pytest.fixture
async def coord() -> AsyncIterator[Coordinator]:
    async with Coordinator() as c:
        yield c


@pytest.fixture
async def connect(coord: Coordinator) -> AsyncIterator[Connect]:
    made: list[RendezvousClient] = []

    async def make(**kw: Any) -> RendezvousClient:
        client = await RendezvousClient.connect(coord.address, **kw)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


async def until(cond: Callable[[], bool], timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


def pending_ids(coord: Coordinator, group: str) -> list[str]:
    for g in coord.status()["groups"]:
        if g["name"] == group:
            return [m["member_id"] for m in g["members"]]
    return []


async def join_all(
    clients: list[RendezvousClient], group: str, ids: list[str], ranks: list[int | None] | None = None, **kw: Any
) -> list[JoinResult]:
    ranks = ranks or [None] * len(clients)
    return list(
        await asyncio.gather(
            *(
                c.join(group, world_size=len(clients), rank=r, member_id=m, listen_port=7000 + i, timeout=2, **kw)
                for i, (c, m, r) in enumerate(zip(clients, ids, ranks, strict=True))
            )
        )
    )


async def failing(task: asyncio.Task[Any]) -> BaseException:
    with pytest.raises(BaseException) as info:
        await asyncio.wait_for(task, 2)
    return info.value


# -- ranks and groups ------------------------------------------------------------------


async def test_explicit_ranks_are_honoured(connect: Connect) -> None:
    clients = [await connect() for _ in range(3)]
    results = await join_all(clients, "g", ["m-a", "m-b", "m-c"], ranks=[2, 0, 1])
    assert [r.rank for r in results] == [2, 0, 1]
    first = results[0]
    assert all(r.peers == first.peers and r.session == first.session for r in results)
    assert first.world_size == 3 and first.generation == 1 and len(first.session) == 16
    assert first.peers == (
        Peer(0, "127.0.0.1", 7001, "m-b"),
        Peer(1, "127.0.0.1", 7002, "m-c"),
        Peer(2, "127.0.0.1", 7000, "m-a"),
    )
    assert first.peers[0].address == "127.0.0.1:7001"


async def test_assigned_ranks_follow_sorted_member_ids(connect: Connect) -> None:
    clients = [await connect() for _ in range(4)]
    results = await join_all(clients, "g", ["delta", "bravo", "alpha", "charlie"])
    assert [r.rank for r in results] == [3, 1, 0, 2]
    # explicit ranks are kept, the rest fill the gaps in member-id order
    clients = [await connect() for _ in range(4)]
    results = await join_all(clients, "h", ["zulu", "bravo", "alpha", "yankee"], ranks=[0, None, None, 2])
    assert [r.rank for r in results] == [0, 3, 1, 2]
    assert [p.member_id for p in results[0].peers] == ["zulu", "alpha", "yankee", "bravo"]


async def test_generated_member_id(connect: Connect) -> None:
    client = await connect()
    result = await client.join("solo", world_size=1, listen_port=1, timeout=1)
    assert result.rank == 0 and result.peers[0].member_id == client.member_id
    assert client.member_id.count("-") >= 2


async def test_several_groups_meet_at_one_coordinator(coord: Coordinator, connect: Connect) -> None:
    xs = [await connect() for _ in range(2)]
    ys = [await connect() for _ in range(3)]
    rx, ry = await asyncio.gather(join_all(xs, "x", ["x0", "x1"]), join_all(ys, "y", ["y0", "y1", "y2"]))
    assert [r.world_size for r in rx] == [2, 2] and [r.world_size for r in ry] == [3, 3, 3]
    assert rx[0].session != ry[0].session
    status = coord.status()["groups"]
    assert [(g["name"], g["state"], len(g["members"])) for g in status] == [("x", "running", 2), ("y", "running", 3)]
    await xs[0].kv_set("k", "from x")
    with pytest.raises(RendezvousTimeout):
        await ys[0].kv_get("k", timeout=0.1)


# -- refusals ------------------------------------------------------------------------------


async def test_duplicate_explicit_rank_names_the_holder(coord: Coordinator, connect: Connect) -> None:
    a, b = await connect(), await connect()
    held = asyncio.create_task(a.join("g", world_size=2, rank=0, member_id="holder", timeout=2))
    await until(lambda: pending_ids(coord, "g") == ["holder"])
    status = (await b.status())["groups"][0]
    assert status["state"] == "pending" and status["members"][0]["rank"] == 0
    with pytest.raises(RendezvousError, match=r"rank 0 .*already held by member 'holder'"):
        await b.join("g", world_size=2, rank=0, member_id="other", timeout=1)
    held.cancel()


async def test_rank_out_of_range(coord: Coordinator, connect: Connect) -> None:
    client = await connect()
    with pytest.raises(RendezvousError, match=r"rank 5 is out of range for world_size 2 \(valid ranks are 0..1\)"):
        await client.join("g", world_size=2, rank=5, timeout=1)
    with pytest.raises(RendezvousError, match="out of range"):  # the coordinator checks it too
        await client.rpc.call(
            "join", {"group": "g", "world_size": 2, "rank": -1, "member_id": "m", "listen_port": 1, "timeout": 1}
        )
    assert coord.status()["groups"] == []


async def test_bad_param_types(connect: Connect) -> None:
    client = await connect()
    base = {"group": "g", "world_size": 2, "rank": None, "member_id": "m", "listen_port": 1, "timeout": 1}
    for bad in (
        {"world_size": "2"},
        {"world_size": 0},
        {"rank": True},
        {"member_id": ""},
        {"listen_port": 70000},
        {"timeout": -1},
        {"group": 3},
        {"advertise_host": 5},
    ):
        with pytest.raises((TypeError, ValueError)):
            await client.rpc.call("join", dict(base, **bad))
    with pytest.raises(ValueError, match="unknown method"):
        await client.rpc.call("no_such_method", {})


async def test_world_size_disagreement(connect: Connect) -> None:
    a, b = await connect(), await connect()
    first = asyncio.create_task(a.join("g", world_size=2, member_id="a", timeout=2))
    await asyncio.sleep(0.05)
    with pytest.raises(RendezvousError, match=r"has world_size 2 .* asked for world_size 3"):
        await b.join("g", world_size=3, member_id="b", timeout=1)
    first.cancel()


async def test_join_to_a_running_group_is_refused(connect: Connect) -> None:
    a, b = await connect(), await connect()
    await a.join("busy", world_size=1, timeout=1)
    with pytest.raises(RendezvousError, match=r"group 'busy' is already running with 1 ranks.*another group name"):
        await b.join("busy", world_size=1, timeout=1)


async def test_timeout_lists_joined_and_missing(coord: Coordinator, connect: Connect) -> None:
    a, b = await connect(), await connect()
    waiting = asyncio.create_task(a.join("g", world_size=3, rank=0, member_id="early", listen_port=5, timeout=3))
    await until(lambda: pending_ids(coord, "g") == ["early"])
    with pytest.raises(RendezvousTimeout) as info:
        await b.join("g", world_size=3, member_id="late", listen_port=6, timeout=0.3)
    text = str(info.value)
    assert "did not fill within 0.3s: 2 of 3 members joined" in text
    assert "rank 0: early at 127.0.0.1:5" in text and "unranked: late at 127.0.0.1:6" in text
    assert "1 missing" in text and "unclaimed ranks: 1, 2" in text
    assert pending_ids(coord, "g") == ["early"]  # the timed-out joiner is gone
    waiting.cancel()


async def test_timeout_with_explicit_ranks_names_missing_ranks(connect: Connect) -> None:
    a = await connect()
    missing = r"1 of 3 members joined \[rank 1: .*\]; 2 missing \(missing ranks: 0, 2\)"
    with pytest.raises(RendezvousTimeout, match=missing):
        await a.join("g", world_size=3, rank=1, timeout=0.2)


async def test_dropped_joiner_is_removed(coord: Coordinator, connect: Connect) -> None:
    a, b, c = await connect(), await connect(), await connect()
    doomed = asyncio.create_task(a.join("g", world_size=2, rank=0, member_id="doomed", timeout=5))
    await until(lambda: pending_ids(coord, "g") == ["doomed"])
    await a.close()
    assert isinstance(await failing(doomed), ConnectionError)
    await until(lambda: coord.status()["groups"] == [])
    results = await join_all([b, c], "g", ["b", "c"], ranks=[0, 1])  # rank 0 is free again
    assert [r.rank for r in results] == [0, 1] and results[0].generation == 2


# -- authentication and hostile input ---------------------------------------------------------


async def test_token_auth() -> None:
    async with Coordinator(token="s3cret") as coord:
        for token in ("wrong", None):
            with pytest.raises(AuthenticationError):
                await RendezvousClient.connect(coord.address, token=token, timeout=2)
        async with Coordinator() as open_coord:  # a client with a token refuses an unauthenticated server
            with pytest.raises(AuthenticationError):
                await RendezvousClient.connect(open_coord.address, token="s3cret", timeout=2)
        async with await RendezvousClient.connect(coord.address, token="s3cret") as good:
            assert (await good.join("g", world_size=1, timeout=1)).rank == 0


async def _raw_exchange(address: str, junk: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(junk)
        await writer.drain()
        async with asyncio.timeout(2):
            return await reader.read(-1)  # until the coordinator closes the connection
    finally:
        writer.close()


async def test_garbage_and_silent_clients_do_not_hurt_the_coordinator(coord: Coordinator, connect: Connect) -> None:
    host, port = coord.address.rsplit(":", 1)
    _, silent = await asyncio.open_connection(host, int(port))  # connects and says nothing
    try:
        http = await _raw_exchange(coord.address, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 10)
        assert b"bad magic" in http
        bad_msgpack = PREFIX.pack(MAGIC, VERSION, int(Kind.HELLO), 0, 4, 0) + b"\xc1\xc1\xc1\xc1"
        assert b"malformed HELLO header" in await _raw_exchange(coord.address, bad_msgpack)
        huge = PREFIX.pack(MAGIC, VERSION, int(Kind.HELLO), 0, 1 << 30, 0)
        assert b"exceeds the limit" in await _raw_exchange(coord.address, huge)
        wrong_kind = PREFIX.pack(MAGIC, VERSION, 99, 0, 0, 0)
        assert b"unknown frame kind" in await _raw_exchange(coord.address, wrong_kind)
        # a well-behaved client is served meanwhile
        a, b = await connect(), await connect()
        results = await join_all([a, b], "g", ["a", "b"])
        await a.kv_set("still", "alive")
        assert await b.kv_get("still", timeout=1) == "alive" and results[1].rank == 1
    finally:
        silent.close()


async def test_malformed_request_after_handshake_closes_only_that_client(coord: Coordinator, connect: Connect) -> None:
    rogue = await RpcClient.connect(coord.address)
    rogue.proto.transport.write(PREFIX.pack(MAGIC, VERSION, int(Kind.REQUEST), 0, 3, 0) + b"\x93\x01\x02")
    await until(lambda: rogue.closed)
    await rogue.close()
    client = await connect()
    assert (await client.join("g", world_size=1, timeout=1)).rank == 0


# -- addresses and the loopback rules ----------------------------------------------------------


async def test_peer_table_uses_the_seen_address(connect: Connect) -> None:
    client = await connect(local_host="127.0.0.2")
    result = await client.join("g", world_size=1, listen_port=4242, timeout=1)
    assert result.peers[0].host == "127.0.0.2" and result.peers[0].port == 4242
    assert client.local_address[0] == "127.0.0.2"


async def test_advertised_host_wins(connect: Connect) -> None:
    client = await connect()
    result = await client.join("g", world_size=1, advertise_host="10.20.30.40", listen_port=1, timeout=1)
    assert result.peers[0].host == "10.20.30.40"


def test_is_loopback() -> None:
    for host in (
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "[::1]",
        "localhost",
        "LOCALHOST",
        "::ffff:127.0.0.1",
        "foo.localhost",
    ):
        assert is_loopback(host), host
    for host in ("10.0.0.1", "172.17.0.2", "::ffff:10.0.0.1", "fe80::1", "rank-1", "coordinator"):
        assert not is_loopback(host), host
    from netcoll.mesh import auth

    assert is_loopback is auth.is_loopback  # one rule for secure-by-default and advertisements


def test_loopback_advertisement_from_another_host_is_refused() -> None:
    for advertised in ("127.0.0.1", "localhost", "::1"):
        with pytest.raises(RendezvousError, match=rf"peers on other hosts cannot reach {advertised}") as info:
            resolve_host("m", advertised, "10.0.0.5")
        assert "NETCOLL_ADVERTISE_HOST" in str(info.value)  # the variable that exists
    assert resolve_host("m", "127.0.0.1", "127.0.0.1") == "127.0.0.1"  # everyone is local: fine
    assert resolve_host("m", None, "10.0.0.5") == "10.0.0.5"
    assert resolve_host("m", None, "::ffff:10.0.0.5") == "10.0.0.5"
    assert resolve_host("m", "rank-3.netcoll", "10.0.0.5") == "rank-3.netcoll"
    with pytest.raises(RendezvousError, match="listen-on-all"):
        resolve_host("m", "0.0.0.0", "10.0.0.5")


def _member(member_id: str, host: str, rank: int | None = None) -> Member:
    return Member(member_id, rank, host, 29500, (host, 40000))


def test_mixed_loopback_group_rule() -> None:
    remote, local = _member("remote", "10.0.0.7"), _member("local", "127.0.0.1")
    newcomer = JoinRequest("g", 3, None, "new", 29500, None, 1.0)
    with pytest.raises(RendezvousError, match=r"'new' would be published as 127.0.0.1.*'remote'.*container"):
        check_join("g", 3, [remote], newcomer, "127.0.0.1")
    # a routable newcomer evicts the loopback members already waiting
    assert check_join("g", 3, [remote, local], newcomer, "10.0.0.8") == [local]
    assert check_join("g", 3, [local], newcomer, "127.0.0.1") == []


async def test_mixed_loopback_group_end_to_end(coord: Coordinator, connect: Connect) -> None:
    routable, local = await connect(), await connect()
    waiting = asyncio.create_task(routable.join("m", world_size=2, member_id="r", advertise_host="10.1.2.3", timeout=2))
    await until(lambda: pending_ids(coord, "m") == ["r"])
    with pytest.raises(RendezvousError, match=r"loopback address.*container"):
        await local.join("m", world_size=2, member_id="l", timeout=1)
    # the reverse order: the loopback member already waiting is the one refused
    evicted_client, r2 = await connect(), await connect()
    evicted = asyncio.create_task(evicted_client.join("n", world_size=2, member_id="l2", timeout=2))
    await until(lambda: pending_ids(coord, "n") == ["l2"])
    done = asyncio.create_task(r2.join("n", world_size=2, member_id="r2", advertise_host="10.1.2.4", timeout=2))
    err = await failing(evicted)
    assert isinstance(err, RendezvousError) and "'l2' would be published as 127.0.0.1" in str(err)
    assert pending_ids(coord, "n") == ["r2"]
    r3 = await connect()
    other = await r3.join("n", world_size=2, member_id="r3", advertise_host="10.1.2.5", timeout=2)
    assert [p.host for p in other.peers] == ["10.1.2.4", "10.1.2.5"] and (await done).rank == 0
    waiting.cancel()


# -- key-value store and barriers --------------------------------------------------------------


async def test_kv_store(coord: Coordinator, connect: Connect) -> None:
    a, b = await connect(), await connect()
    await join_all([a, b], "g", ["a", "b"])
    getter = asyncio.create_task(b.kv_get("later", timeout=2))
    await asyncio.sleep(0.05)
    value = {"bytes": b"\x00\xff" * 100, 1: [1.5, None, True], "big": b"x" * 200_000}
    await a.kv_set("later", value)
    assert await getter == value
    with pytest.raises(RendezvousTimeout, match=r"key 'never' of group 'g' was not set within 0\.1s"):
        await a.kv_get("never", timeout=0.1)
    assert sorted(await asyncio.gather(*(c.kv_add("n", 1) for c in [a, b] * 5))) == list(range(1, 11))
    assert await a.kv_add("n", -10) == 0
    with pytest.raises(TypeError, match="not an int"):
        await a.kv_add("later", 1)
    assert await a.kv_delete("n") is True and await a.kv_delete("n") is False
    await a.rpc.call("kv_set", {"group": "g", "key": "inline", "value": [1, "two"]})  # value as a param
    assert await b.kv_get("inline") == [1, "two"]
    outsider = await connect()
    with pytest.raises(RendezvousError, match="not a member of group 'g'"):
        await outsider.kv_get("later", timeout=0.1, group="g")
    with pytest.raises(RendezvousError, match="join a group first"):
        await outsider.kv_set("x", 1)


async def test_barrier_and_its_timeout(connect: Connect) -> None:
    clients = [await connect() for _ in range(3)]
    await join_all(clients, "g", ["a", "b", "c"])
    for _ in range(2):  # a barrier name can be reused once it completed
        await asyncio.gather(*(c.barrier("sync", timeout=1) for c in clients))
    with pytest.raises(RendezvousTimeout) as info:
        await asyncio.gather(*(c.barrier("partial", timeout=0.3) for c in clients[:2]))
    assert "barrier 'partial' of group 'g' did not complete within 0.3s" in str(info.value)
    assert "arrived ranks [0, 1], missing ranks [2]" in str(info.value)


# -- lifecycle ---------------------------------------------------------------------------------


async def test_member_lost_event_and_barrier_fails_fast(connect: Connect) -> None:
    clients = [await connect() for _ in range(3)]
    await join_all(clients, "g", ["a", "b", "c"])
    waiting = [asyncio.create_task(c.barrier("b", timeout=5)) for c in clients[:2]]
    await asyncio.sleep(0.05)
    clients[2].rpc.proto.abort()  # a crash, not a goodbye
    for client in clients[:2]:
        event = await asyncio.wait_for(client.events.get(), 2)
        assert event["topic"] == "member_lost" and event["rank"] == 2 and event["member_id"] == "c"
        assert event["group"] == "g"
    for task in waiting:
        err = await failing(task)
        assert isinstance(err, RendezvousError) and "rank 2 (member 'c') was lost" in str(err)


async def test_close_says_goodbye(coord: Coordinator, connect: Connect) -> None:
    a, b = await connect(), await connect()
    await join_all([a, b], "g", ["a", "b"])
    await b.close()
    event = await asyncio.wait_for(a.events.get(), 2)
    assert event["topic"] == "member_left" and event["member_id"] == "b"
    await a.close()
    await until(lambda: coord.status()["groups"] == [])


async def test_silent_member_is_dropped_after_missed_heartbeats(coord: Coordinator, connect: Connect) -> None:
    healthy = await connect(heartbeat=0.1)
    mute = await RpcClient.connect(coord.address, hello={"heartbeat": 0.05})  # promises pings, never sends
    try:
        params = {"group": "g", "world_size": 2, "rank": 1, "member_id": "mute", "listen_port": 1, "timeout": 2}
        mute_join = asyncio.create_task(mute.call("join", params))
        await healthy.join("g", world_size=2, rank=0, member_id="ok", timeout=2)
        await mute_join
        event = await asyncio.wait_for(healthy.events.get(), 2)
        assert event["topic"] == "member_lost" and event["rank"] == 1 and "no heartbeat" in event["reason"]
        await until(lambda: mute.closed)
        await asyncio.sleep(0.45)  # beyond 3 of its intervals, the pinging member is still there
        assert not healthy.closed
        assert [m["connected"] for m in coord.status()["groups"][0]["members"]] == [True, False]
    finally:
        await mute.close()


async def test_group_name_reuse_after_everyone_leaves(coord: Coordinator, connect: Connect) -> None:
    a, b = await connect(), await connect()
    first = await join_all([a, b], "g", ["a", "b"])
    await a.kv_set("k", 1)
    await a.leave()
    assert a.group is None
    event = await asyncio.wait_for(b.events.get(), 2)
    assert event["topic"] == "member_left" and event["rank"] == 0
    assert coord.status()["groups"][0]["state"] == "running"
    await b.leave()
    assert coord.status()["groups"] == []
    second = await join_all([a, b], "g", ["a", "b"])
    assert second[0].generation == first[0].generation + 1 and second[0].session != first[0].session
    with pytest.raises(RendezvousTimeout):  # the store belongs to one group instance
        await a.kv_get("k", timeout=0.1)
    status = await a.status()
    assert status["groups"][0]["generation"] == 2
    assert [m["member_id"] for m in status["groups"][0]["members"]] == ["a", "b"]


async def test_leave_while_pending_and_serve_forever() -> None:
    coord = Coordinator()
    server = asyncio.create_task(coord.serve_forever())
    await until(lambda: coord._rpc is not None)
    client = await RendezvousClient.connect(coord.address)
    try:
        pending = asyncio.create_task(client.join("g", world_size=2, member_id="x", timeout=2))
        await until(lambda: pending_ids(coord, "g") == ["x"])
        await client.leave(group="g")
        err = await failing(pending)
        assert isinstance(err, RendezvousError) and "left group 'g' before it completed" in str(err)
    finally:
        await client.close()
        await coord.close()
        await asyncio.wait_for(server, 2)


async def test_client_notices_a_dead_coordinator() -> None:
    coord = await Coordinator().start()
    client = await RendezvousClient.connect(coord.address, heartbeat=0.05)
    try:
        await coord.close()
        event = await asyncio.wait_for(client.events.get(), 2)
        assert event["topic"] == "coordinator_lost"
        with pytest.raises(ConnectionError):
            await client.status()
    finally:
        await client.close()


async def test_client_gives_up_on_a_coordinator_that_stops_answering() -> None:
    async def mute_server(proto: FramedProtocol) -> None:  # handshakes, then never answers a PING
        await server_handshake(proto, token=None, role="coordinator")
        while True:
            await proto.next_frame()

    server = Server(mute_server)
    host, port = await server.start("127.0.0.1", 0)
    try:
        client = await RendezvousClient.connect(f"{host}:{port}", heartbeat=0.05)
        event = await asyncio.wait_for(client.events.get(), 2)
        assert event["topic"] == "coordinator_lost" and "has not answered" in event["reason"]
        assert client.closed
        await client.close()
    finally:
        await server.close()


def test_wire_values_are_plain_msgpack() -> None:
    # JoinResult.from_wire accepts what the coordinator sends
    raw = {
        "rank": 1,
        "world_size": 2,
        "generation": 3,
        "session": "ab",
        "peers": [{"rank": 0, "host": "h", "port": 1, "member_id": "m"}],
    }
    assert JoinResult.from_wire(msgpack.unpackb(msgpack.packb(raw))).peers == (Peer(0, "h", 1, "m"),)
    with pytest.raises(RendezvousError, match="malformed join result"):
        JoinResult.from_wire({"rank": 1})
