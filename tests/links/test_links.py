"""Per-peer links: the interface, capability negotiation in the peer handshake
(``NETCOLL_TRANSPORT=tcp`` included), the factory's choice, and the link kind
per peer in the mesh's stats. Loopback only."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import numpy as np
import pytest

from netcoll.comm import Communicator
from netcoll.errors import ProtocolError
from netcoll.links import Capabilities, Link, LinkConfig, LinkFactory, LinkStats, choose
from netcoll.links import factory as factory_mod
from netcoll.links.connection import COALESCE_MAX as EAGER_MAX  # the largest frame written without awaiting
from netcoll.links.framed import ABORT_REASON_MAX
from netcoll.links.memory import MemoryLink
from netcoll.links.shm import ShmLink
from netcoll.links.tcp import TcpLink
from netcoll.mesh import auth
from netcoll.mesh.channel import Mesh
from netcoll.mesh.inprocess import MemoryHub
from netcoll.mesh.tcpmesh import Listener, TcpMesh
from netcoll.wire import FrameDecoder, Kind, encode_header
from tests.support.groups import tcp_mesh

LOOPBACK = "127.0.0.1"
MIB = 1 << 20
_SESSIONS = itertools.count()


# --------------------------------------------------------------------------- the interface


def test_link_kinds_implement_the_interface() -> None:
    assert issubclass(TcpLink, Link) and issubclass(MemoryLink, Link)
    assert (TcpLink.kind, MemoryLink.kind) == ("tcp", "memory")
    hub = MemoryHub(2, window=2 * MIB)
    link = hub.meshes[0].links[1]
    assert isinstance(link, MemoryLink) and link.peer == 1 and link.usable
    stats = link.stats()
    assert isinstance(stats, LinkStats)
    assert stats.as_dict() == {
        "kind": "memory",
        "peer": 1,
        "frames_sent": 0,
        "bytes_sent": 0,
        "frames_received": 0,
        "bytes_received": 0,
        "unexpected_bytes": 0,
        "unexpected_peak": 0,
        "send_backlog": 0,
        "credit": 2 * MIB,
        "peer_window": 2 * MIB,
        "recv_window": 2 * MIB,
        "rendezvous": 0,
        "waiting": 0,
        "credits_sent": 0,
        "lost": None,
        "lane_sent": 0,
        "lane_received": 0,
        "bells": 0,
        "direct_sent": 0,
        "direct_received": 0,
        "direct_held": 0,
    }


async def test_memory_hub_links_every_pair_and_kill_breaks_them() -> None:
    hub = MemoryHub(3)
    for t in hub.meshes:
        assert sorted(t.link_stats()) == sorted(set(range(3)) - {t.rank})
        assert {s.kind for s in t.link_stats().values()} == {"memory"}
    hub.kill(2)
    assert hub.meshes[0].links[2].lost is not None and 2 in hub.meshes[0].mailbox.dead
    assert hub.meshes[0].links[1].lost is None
    assert not hub.meshes[1].links[2].usable


async def test_memory_link_close_is_an_orderly_leave() -> None:
    hub = MemoryHub(2)
    hub.meshes[0].links[1].close()
    assert hub.meshes[1].mailbox.departed == {0}  # BYE first: graceful, not a crash


async def test_a_rank_leaving_after_a_failure_says_which_in_its_bye() -> None:
    """A peer still waiting in an operation for a rank that closed (BYE) after its own
    failure learns that failure, not only that the rank left: the rank a crash took (rank
    2) is named on rank 0 even though rank 1's orderly leave is what rank 0 noticed first."""
    from netcoll.errors import PeerLost
    from netcoll.operation import Failure, Reason

    hub = MemoryHub(3)
    m0, m1 = hub.meshes[0].mailbox, hub.meshes[1].mailbox
    waiting = m0.open("g", 0, "fp", (0, 1, 2), "all_reduce")
    fut = m0.take(waiting, (1, 0, 0), None)
    failed = m1.open("g", 0, "fp", (0, 1, 2), "all_reduce")
    failed.fail(Failure(Reason.PEER_LOST, "all_reduce #0 failed: lost connection to rank 2: reset\x1b[2J", (2,)))
    m1.close(failed)
    assert m1.farewell() == {"why": "all_reduce #0 failed: lost connection to rank 2: reset\x1b[2J"}
    hub.meshes[1].links[0].close()
    assert m0.departed == {1}
    with pytest.raises(PeerLost) as got:
        await fut
    said = str(got.value)
    assert "lost connection to rank 1: it left after a failure there:" in said and "rank 2: reset" in said, said
    assert "\x1b" not in said  # the peer's words escaped
    ok = m1.open("h", 0, "fp", (1, 2), "all_reduce")
    m1.close(ok)  # an operation that succeeded since: nothing to tell
    assert m1.farewell() == {}


# --------------------------------------------------------------------------- capabilities and the factory


def test_capabilities_round_trip_and_refusals() -> None:
    caps = Capabilities(bits=factory_mod.TCP | factory_mod.SHM, window=8 * MIB, extra={"host": "h1"})
    wire_form = caps.to_wire()
    assert wire_form == {"host": "h1", "v": 1, "caps": 0b101, "window": 8 * MIB}
    assert Capabilities.from_wire(wire_form) == caps
    for bad in (
        None,
        "tcp",
        {"v": 1, "caps": 1},
        {"v": True, "caps": 1, "window": MIB},
        {"v": 1, "caps": 1, "window": 10},
        {"v": 0, "caps": 1, "window": MIB},
    ):
        with pytest.raises(ProtocolError):
            Capabilities.from_wire(bad, "rank 3")
    with pytest.raises(ProtocolError, match="rank 3 announced no link capabilities"):
        Capabilities.from_wire(None, "rank 3")


def test_choose_prefers_shared_memory_then_tls_then_tcp() -> None:
    every = Capabilities(bits=factory_mod.TCP | factory_mod.TLS | factory_mod.SHM)
    tcp_only = Capabilities(bits=factory_mod.TCP)
    assert choose(every, every) == "shm"
    assert choose(every, every, available=("tcp", "tls")) == "tls"
    assert choose(every, tcp_only) == choose(tcp_only, every) == "tcp"
    with pytest.raises(ProtocolError, match="no common link kind"):
        choose(tcp_only, Capabilities(bits=factory_mod.MEMORY))


def test_factory_forced_kind_is_all_it_announces() -> None:
    made: list[dict[str, Any]] = []
    f = LinkFactory(LinkConfig(transport="tcp"), offers=("shm", "tcp"))
    f.register("tcp", lambda **kw: made.append(kw) or "a tcp link")  # type: ignore[arg-type,func-returns-value]
    f.register("shm", lambda **kw: "an shm link")  # type: ignore[arg-type,return-value]
    assert f.capabilities().bits == factory_mod.TCP
    assert f.choose(Capabilities(bits=factory_mod.TCP | factory_mod.SHM)) == "tcp"
    assert f.make("tcp", peer=1) == "a tcp link" and made == [{"peer": 1}]  # type: ignore[comparison-overlap]
    free = LinkFactory(LinkConfig(), offers=("shm", "tcp"))
    free.register("tcp", TcpLink)
    assert free.capabilities().bits == factory_mod.TCP | factory_mod.SHM
    assert free.choose(Capabilities(bits=factory_mod.TCP | factory_mod.SHM)) == "tcp"  # no shm maker here
    with pytest.raises(ValueError, match="NETCOLL_TRANSPORT=tls"):
        LinkFactory(LinkConfig(transport="tls"), offers=("tcp",))
    with pytest.raises(ProtocolError):
        free.make("shm")


def test_link_config_from_the_environment() -> None:
    assert LinkConfig.from_env({}) == LinkConfig(window=64 * MIB, transport="auto")
    env = {"NETCOLL_RECV_WINDOW": "4M", "NETCOLL_TRANSPORT": "TCP"}
    assert LinkConfig.from_env(env) == LinkConfig(window=4 * MIB, transport="tcp")
    assert LinkConfig.from_env(env, window=MIB, transport="auto") == LinkConfig(window=MIB)  # arguments win
    for text, value in (("65536", 65536), ("64MiB", 64 * MIB), ("1g", 1 << 30), ("8 KiB", 8192)):
        assert LinkConfig.from_env({"NETCOLL_RECV_WINDOW": text}).window == value
    assert LinkConfig.from_env({"NETCOLL_RECV_WINDOW": "", "NETCOLL_TRANSPORT": ""}) == LinkConfig()
    with pytest.raises(ValueError, match="NETCOLL_RECV_WINDOW"):
        LinkConfig.from_env({"NETCOLL_RECV_WINDOW": "lots"})
    with pytest.raises(ValueError, match="NETCOLL_TRANSPORT"):
        LinkConfig.from_env({"NETCOLL_TRANSPORT": "carrier-pigeon"})
    with pytest.raises(ValueError, match="at least"):
        LinkConfig(window=10)


# --------------------------------------------------------------------------- over TCP


async def test_tcp_links_negotiate_windows_and_show_their_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_TRANSPORT", "tcp")  # ranks on one host would share memory (test_shm_links.py)
    configs = [LinkConfig(window=2 * MIB, transport="tcp"), LinkConfig(window=8 * MIB, transport="tcp"), None]
    async with tcp_mesh(3, configs=configs) as ts:
        for t in ts:
            stats = t.link_stats()
            assert sorted(stats) == sorted(set(range(3)) - {t.rank})
            assert all(s.kind == "tcp" and s.lost is None for s in stats.values())
            assert all(isinstance(link, TcpLink) for link in t.links.values())
        assert ts[0].link_stats()[1].credit == 8 * MIB  # the peer's window is our credit
        assert ts[1].link_stats()[0].credit == 2 * MIB
        assert ts[1].link_stats()[0].recv_window == 8 * MIB
        assert ts[2].link_stats()[0].recv_window == 64 * MIB  # the default


async def test_netcoll_transport_tcp_forces_tcp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_TRANSPORT", "tcp")
    monkeypatch.setenv("NETCOLL_RECV_WINDOW", "3M")
    async with tcp_mesh(2) as ts:
        assert ts[0].capabilities["caps"] == factory_mod.TCP
        assert [s.kind for t in ts for s in t.link_stats().values()] == ["tcp", "tcp"]
        assert ts[0].link_stats()[1].recv_window == 3 * MIB


async def test_link_stats_count_traffic_per_peer() -> None:
    async with tcp_mesh(2) as ts:
        comms = [Communicator(t) for t in ts]
        async with asyncio.timeout(10):
            ys = await asyncio.gather(*(c.all_reduce(np.ones(MIB // 4, np.float32)) for c in comms))
        assert all((y == 2).all() for y in ys)
        s0, s1 = ts[0].link_stats()[1], ts[1].link_stats()[0]
        assert s0.bytes_sent == s1.bytes_received > 0 and s1.bytes_sent == s0.bytes_received > 0
        assert s0.frames_sent >= 2 and s0.unexpected_bytes == s1.unexpected_bytes == 0


async def _received(t: TcpMesh, seq: int, peer: int) -> bytes:
    op = t.mailbox.open("g", seq, "fp", (0, 1), "test")
    try:
        async with asyncio.timeout(10):
            payload, _ = await t.mailbox.take(op, (peer, 0, 0), None)
        return bytes(payload)
    finally:
        t.mailbox.close(op)


@pytest.mark.parametrize("kind", ["tcp", "shm"])
async def test_small_sends_go_out_without_awaiting_unless_something_is_in_the_way(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The eager path (Link.send_nowait) sends a small DATA frame at once; with
    backpressure, too little credit or a ring message part-way it sends nothing
    and says so, and the awaited send() then does the work."""
    monkeypatch.setenv("NETCOLL_TRANSPORT", kind)
    monkeypatch.setenv("NETCOLL_RECV_WINDOW", "32K")  # less credit than an eager message may be
    async with tcp_mesh(2) as ts:
        link = ts[0].links[1]
        assert isinstance(link, TcpLink) and link.kind == kind
        head = {"g": "g", "q": 0, "f": "fp", "s": 0, "c": 0}
        assert ts[0].send_nowait(1, head, memoryview(b"now"))
        assert await _received(ts[1], 0, 0) == b"now"
        assert link.stats().frames_sent == 1 and link.stats().bytes_sent == 3

        link.proto.pause_writing()  # the socket's buffer is over its high-water mark
        head = dict(head, q=1)
        assert not ts[0].send_nowait(1, head, memoryview(b"later"))
        sending = asyncio.ensure_future(ts[0].send(1, Kind.DATA, head, memoryview(b"later")))
        await asyncio.sleep(0.05)
        assert not sending.done()  # send() waits for the buffer to drain
        link.proto.resume_writing()
        await asyncio.wait_for(sending, 5)
        assert await _received(ts[1], 1, 0) == b"later"

        credit = link.flow.credit
        assert credit + 1 <= EAGER_MAX
        assert not ts[0].send_nowait(1, dict(head, q=2), memoryview(bytes(credit + 1)))  # over the credit
        big = memoryview(bytes(EAGER_MAX + 1))
        assert not ts[0].send_nowait(1, dict(head, q=2), big)  # a large message is awaited
        if isinstance(link, ShmLink):
            async with link._lock:  # a ring message is part-way: small ones queue behind it
                assert not ts[0].send_nowait(1, dict(head, q=2), memoryview(b"behind"))
        assert link.flow.credit == credit and link.stats().frames_sent == 2  # nothing went out
        assert not ts[1].send_nowait(5, head, memoryview(b"x"))  # no such peer: send() says why


async def test_a_peer_without_link_capabilities_is_refused() -> None:
    listener = Listener(token=None)
    address = await listener.start(LOOPBACK, 0)
    mesh = TcpMesh(listener, rank=0, size=2, session="caps-test", peers=[address, address])
    connecting = asyncio.ensure_future(mesh.connect(5.0))
    try:
        reader, writer = await asyncio.open_connection(*address)
        decoder, frames = FrameDecoder(), []
        async with asyncio.timeout(5):
            while not frames:
                frames += decoder.feed(await reader.read(65536))
            assert frames[0].kind == Kind.CHALLENGE
            writer.write(
                encode_header(
                    Kind.HELLO,
                    {"role": "peer", "nonce": auth.new_nonce(), "session": "caps-test", "rank": 1, "size": 2},
                )
            )
            while chunk := await reader.read(65536):
                frames += decoder.feed(chunk)
        writer.close()
        [error] = [f for f in frames if f.kind == Kind.ERROR]
        assert error.header["type"] == "ProtocolError"
        assert "rank 1 announced no link capabilities" in error.header["message"]
        assert mesh.links == {}
    finally:
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        await mesh.close()
        await listener.close()


async def test_a_huge_abort_reason_is_trimmed_to_fit_a_control_frame() -> None:
    async with tcp_mesh(2) as ts:
        got: list[dict[str, Any]] = []
        ts[1].mailbox.on_abort = lambda src, header: got.append(header)  # type: ignore[method-assign]
        header = {"g": "g", "q": 5, "reason": "x" * 100_000, "origin": 0, "cause": "error", "ranks": list(range(5000))}
        await ts[0].send(1, Kind.ABORT, header)
        async with asyncio.timeout(5):
            while not got:
                await asyncio.sleep(0.01)
        assert len(got[0]["reason"]) == ABORT_REASON_MAX and got[0]["reason"].endswith("...")
        assert ts[0].links[1].usable and ts[1].links[0].usable


async def test_orderly_close_is_seen_as_a_graceful_leave() -> None:
    async with tcp_mesh(2) as ts:
        await ts[1].close()
        async with asyncio.timeout(5):
            while ts[0].links[1].lost is None:
                await asyncio.sleep(0.01)
        assert ts[0].mailbox.departed == {1}


def test_transport_is_the_generic_mesh() -> None:
    t = Mesh(0, 2)
    hub = MemoryHub(2)
    link = hub.meshes[0].links[1]
    t.attach(link)
    assert t.links == {1: link} and link.on_lost is not None
    assert list(t.link_stats()) == [1]


@pytest.mark.tcp
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_an_operation_moving_large_messages_over_tcp_holds_the_loop_from_polling(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On netcoll's loop, an operation that sends or posts a message of QUIET_MIN bytes or
    more over a TCP link holds the selector's polling off (once, however many messages)
    until it closes; smaller ones never do, nor do links over shared memory, whose
    polling serves their large transfers, nor anything on asyncio's own loop."""
    from netcoll import loop as nloop
    from netcoll.links import shm
    from netcoll.mesh.channel import QUIET_MIN

    if transport == "shm" and not shm.possible():
        pytest.skip("no /dev/shm here")
    monkeypatch.setenv("NETCOLL_TRANSPORT", transport)
    held: list[int] = []  # the selector's holds after each hold()
    hold = nloop.SpinSelector.hold

    def recording(self: nloop.SpinSelector) -> None:
        hold(self)
        held.append(self.holds)

    monkeypatch.setattr(nloop.SpinSelector, "hold", recording)

    async def main(nbytes: int) -> int:
        async with tcp_mesh(2) as ts:
            assert {s.kind for t in ts for s in t.link_stats().values()} == {transport}
            comms = [Communicator(t) for t in ts]
            try:
                x = np.ones(nbytes // 4, np.float32)
                async with asyncio.timeout(30):
                    for _ in range(2):
                        ys = await asyncio.gather(*(c.broadcast(x if c.rank == 0 else x * 0, 0) for c in comms))
                        assert all((y == 1).all() for y in ys)
                sel = nloop.spin_selector(asyncio.get_running_loop())
                return -1 if sel is None else sel.holds
            finally:
                for c in comms:
                    await c.close()

    assert nloop.run(main(QUIET_MIN // 2)) == 0 and held == []
    assert nloop.run(main(2 * QUIET_MIN)) == 0  # released as each operation closed
    assert held == ([] if transport == "shm" else [1, 2, 1, 2])  # each rank once per broadcast (one loop)
    held.clear()
    assert nloop.run(main(2 * QUIET_MIN), "asyncio") == -1 and held == []


@pytest.mark.tcp
def test_closing_a_transport_releases_the_holds_of_operations_still_open(monkeypatch: pytest.MonkeyPatch) -> None:
    from netcoll import loop as nloop
    from netcoll.mesh.channel import QUIET_MIN, Channel

    monkeypatch.setenv("NETCOLL_TRANSPORT", "tcp")

    async def main() -> tuple[int, int]:
        sel = nloop.spin_selector(asyncio.get_running_loop())
        assert sel is not None
        async with tcp_mesh(2) as ts:
            op = ts[0].mailbox.open("g", 1, "fp", (0, 1), "test")
            Channel(ts[0], op).post(1, step=0, out=np.empty(QUIET_MIN, np.uint8))
            held = sel.holds
            await ts[0].close()
            after = sel.holds
            ts[0].mailbox.close(op)  # (after the transport: nothing left to release)
            assert sel.holds == 0
            return held, after

    assert nloop.run(main()) == (1, 0)
