"""Bounded receive memory: the credit window, the RTS/CTS rendezvous path, and
payload buffers that grow as bytes arrive.

Every link test runs over BOTH the in-process memory link and real loopback
TCP (the ``make_pair`` fixture), with a small receive window so the limits
are reached quickly. The bookkeeping itself (:class:`netcoll.links.flow.Flow`)
and the decoder's growing buffers are tested sans-IO at the end.
"""

from __future__ import annotations

import asyncio
import os
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from netcoll import wire
from netcoll.comm import Communicator
from netcoll.errors import CollectiveError, PeerLost, ProtocolError
from netcoll.links.flow import MAX_PENDING_RTS, Flow
from netcoll.links.framed import SYNC_MIN, FramedLink
from netcoll.links.memory import MemoryLink
from netcoll.links.tcp import TcpLink
from netcoll.mesh.channel import Channel, Mesh
from netcoll.mesh.inprocess import MemoryHub
from netcoll.operation import Reason
from netcoll.wire import CHUNK, FrameDecoder, FrameLimits, Kind, encode, encode_header
from tests.support import tcp_group
from tests.support.waiting import until

MIB = 1 << 20
GIB = 1 << 30


# --------------------------------------------------------------------------- two ranks, two ways


class Pair:
    """Ranks 0 and 1 in this event loop over one kind of link."""

    def __init__(self, kind: str, meshes: list[Mesh]) -> None:
        self.kind = kind
        self.meshes = meshes
        self.seq = 0

    def link(self, rank: int) -> FramedLink:
        """Rank ``rank``'s link to the other rank."""
        link = self.meshes[rank].links[1 - rank]
        assert isinstance(link, FramedLink)
        return link

    async def run(self, fns: list[Callable[[Channel], Awaitable[Any]]], *, timeout: float = 30.0) -> list[Any]:
        """``fns[r](channel)`` on rank r, each in one new operation; results by rank."""
        seq, self.seq = self.seq, self.seq + 1

        async def one(r: int) -> Any:
            t = self.meshes[r]
            op = t.mailbox.open("g", seq, "fp", (0, 1), "test")
            try:
                return await fns[r](Channel(t, op))
            finally:
                t.mailbox.close(op)

        tasks = [asyncio.ensure_future(one(r)) for r in range(2)]
        try:
            async with asyncio.timeout(timeout):
                return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _memory_pair(window: int) -> tuple[Pair, Callable[[], Awaitable[None]]]:
    hub = MemoryHub(2, window=window)

    async def close() -> None:
        for t in hub.meshes:
            await t.close()

    return Pair("memory", list(hub.meshes)), close


async def _tcp_pair(window: int, kind: str) -> tuple[Pair, Callable[[], Awaitable[None]]]:
    """Two authenticated TcpMeshes on loopback (:func:`tcp_group`), joined by
    ``kind`` links: ``"tcp"`` or ``"shm"``."""
    group = await tcp_group(2, token="flow-s3cret", links=kind, window=window)
    return Pair(kind, group.meshes), group.close


MakePair = Callable[[int], Awaitable[Pair]]


@pytest.fixture(params=["memory", "tcp", "shm"])
async def make_pair(request: pytest.FixtureRequest) -> AsyncIterator[MakePair]:
    """``await make_pair(window)``: ranks 0 and 1 whose receive windows are
    ``window`` bytes, over memory links, loopback TCP links and shared-memory links
    (closed after the test)."""
    closers: list[Callable[[], Awaitable[None]]] = []

    async def make(window: int) -> Pair:
        kind = request.param
        if kind == "memory":
            pair, close = await _memory_pair(window)
        else:
            pair, close = await _tcp_pair(window, kind)
        closers.append(close)
        return pair

    yield make
    for close in reversed(closers):
        await close()


def filled(n: int, value: int) -> np.ndarray:
    return np.full(n, value % 251, dtype=np.uint8)


def declare(link: FramedLink, header: dict[str, Any], nbytes: int) -> None:
    """Make ``link``'s peer see a DATA frame that *declares* ``nbytes`` of
    payload, bypassing the sender's flow control (what a broken or hostile
    peer could do): on TCP the frame's prefix and header go on the wire."""
    if isinstance(link, TcpLink):
        assert link.transport is not None
        link.transport.write(encode_header(Kind.DATA, header, nbytes) + b"\0" * 4096)
    else:
        assert isinstance(link, MemoryLink)
        fake = memoryview(np.broadcast_to(np.uint8(0), (nbytes,)))  # nbytes long, 1 byte of memory
        with pytest.raises(ConnectionError):
            link._deliver(Kind.DATA, header, fake)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --------------------------------------------------------------------------- the window bounds held bytes


async def test_a_sender_far_ahead_of_a_sleeping_receiver_stays_within_the_window(make_pair: MakePair) -> None:
    window, count = 8 * MIB, 200
    pair = await make_pair(window)
    sent = 0

    async def sender(ch: Channel) -> None:
        nonlocal sent
        for i in range(count):
            await ch.send(1, filled(MIB, i), step=i)
            sent += 1

    async def receiver(ch: Channel) -> int:
        await asyncio.sleep(0.5)
        ahead = sent
        for i in range(count):
            got = np.frombuffer(await ch.recv(0, step=i), np.uint8)
            assert got.nbytes == MIB and got[0] == i % 251 and (got == got[0]).all(), i
        return ahead

    _, ahead = await pair.run([sender, receiver])
    assert ahead <= window // MIB < count  # the sender waited for the sleeping receiver
    into = pair.link(1).stats()
    assert into.unexpected_peak <= window and into.unexpected_bytes == 0
    assert into.bytes_received == count * MIB
    out = pair.link(0).stats()
    assert out.rendezvous >= 1 and out.frames_sent >= count
    assert out.credit > 0 and out.waiting == 0


async def test_small_messages_do_not_cost_a_credit_frame_each(make_pair: MakePair) -> None:
    pair = await make_pair(64 * MIB)

    async def sender(ch: Channel) -> None:
        for i in range(500):
            await ch.send(1, filled(64, i), step=i)

    async def receiver(ch: Channel) -> None:
        for i in range(500):
            assert bytes(await ch.recv(0, step=i))[:1] == bytes([i % 251])

    await pair.run([sender, receiver])
    assert pair.link(1).stats().credits_sent == 0
    assert pair.link(0).stats().rendezvous == 0


async def test_credit_comes_back_in_batches_and_large_streams_never_rendezvous(make_pair: MakePair) -> None:
    """Receives posted ahead: payloads land in place, credit returns once a
    quarter of the window is free, and no segment waits for a round trip
    (the window is larger than what the kernel's socket buffers hold)."""
    window, count = 32 * MIB, 128
    pair = await make_pair(window)
    posted = asyncio.Event()

    async def sender(ch: Channel) -> None:
        await posted.wait()
        for i in range(count):
            await ch.send(1, filled(MIB, i), step=i)

    async def receiver(ch: Channel) -> None:
        outs = [np.empty(MIB, np.uint8) for _ in range(count)]
        futs = [ch.post(0, step=i, out=outs[i]) for i in range(count)]
        posted.set()
        for i, fut in enumerate(futs):
            await fut
            assert outs[i][0] == i % 251

    await pair.run([sender, receiver])
    into, out = pair.link(1).stats(), pair.link(0).stats()
    assert into.unexpected_peak == 0
    assert out.rendezvous == 0
    assert 0 < into.credits_sent <= count * MIB // (window // 4)


async def test_frames_arriving_together_are_accounted_one_by_one(make_pair: MakePair) -> None:
    """Several DATA frames in one read, some into posted buffers and some
    held: each is handled before the next one's header reaches the sink, so
    what is held and what is credited stay exact."""
    pair = await make_pair(MIB)
    headers = [{"g": "g", "q": 0, "s": s, "c": 0, "f": "fp"} for s in range(4)]
    payloads = [bytes([s]) * (100 + s) for s in range(4)]
    posted = asyncio.Event()

    async def sender(ch: Channel) -> None:
        await posted.wait()  # the receiver posts first
        link = pair.link(0)
        if isinstance(link, TcpLink):  # one write: the frames arrive in one read
            assert link.transport is not None
            link.transport.write(
                b"".join(bytes(p) for h, d in zip(headers, payloads, strict=True) for p in encode(Kind.DATA, h, d))
            )
        else:
            for h, d in zip(headers, payloads, strict=True):
                await link.send(Kind.DATA, h, memoryview(d))

    async def receiver(ch: Channel) -> list[bytes]:
        outs = {s: np.zeros(100 + s, np.uint8) for s in (1, 2)}
        futs = {s: ch.post(0, step=s, out=outs[s]) for s in (1, 2)}
        posted.set()
        for fut in futs.values():
            await fut
        link = pair.link(1)
        assert link.stats().unexpected_bytes == 100 + 103  # steps 0 and 3 are held
        got = {s: bytes(await ch.recv(0, step=s)) for s in (0, 3)}
        return [got[0], outs[1].tobytes(), outs[2].tobytes(), got[3]]

    _, got = await pair.run([sender, receiver])
    assert got == payloads
    link = pair.link(1)
    assert link.stats().unexpected_bytes == 0 and link.stats().unexpected_peak == 203
    assert link.flow.unreturned == link.flow.freed == sum(map(len, payloads))  # all free, batched for CREDIT


# --------------------------------------------------------------------------- rendezvous


async def test_a_message_larger_than_the_window_waits_for_its_receive_and_lands_in_place(make_pair: MakePair) -> None:
    pair = await make_pair(MIB)
    data = np.random.default_rng(1).integers(0, 256, 8 * MIB, dtype=np.uint8)
    done = asyncio.Event()

    async def sender(ch: Channel) -> None:
        await ch.send(1, data, step=0)
        done.set()

    async def receiver(ch: Channel) -> np.ndarray:
        await asyncio.sleep(0.3)
        assert not done.is_set()  # the send waits for this receive (CTS)
        out = np.zeros(8 * MIB, np.uint8)
        await ch.recv(0, step=0, out=out)
        return out

    _, out = await pair.run([sender, receiver])
    assert np.array_equal(out, data)
    assert pair.link(0).stats().rendezvous == 1
    into = pair.link(1).stats()
    assert into.unexpected_peak == 0 and into.bytes_received == 8 * MIB


async def test_a_synchronous_send_waits_for_its_receive_though_it_has_credit(make_pair: MakePair) -> None:
    """``Channel.sync_from``: sends of at least ``SYNC_MIN`` bytes wait for their receive (a
    rendezvous: the payload lands in place, nothing is held) though the window has room; smaller
    ones, and any send over shared memory (lent or copied through the ring), go eagerly."""
    pair = await make_pair(64 * MIB)
    big = np.random.default_rng(2).integers(0, 256, SYNC_MIN, dtype=np.uint8)
    small = big[: SYNC_MIN - 1]
    sent: list[str] = []

    async def sender(ch: Channel) -> None:
        ch.sync_from(1)
        await ch.send(1, big, step=0)  # before the synchronous steps: eager
        sent.append("early")
        await ch.send(1, small, step=1)
        sent.append("small")
        await ch.send(1, big, step=2)
        sent.append("big")

    async def receiver(ch: Channel) -> list[np.ndarray]:
        synced = pair.kind != "shm"
        # the sender got as far as it can without this receive (to the big synchronous send's
        # RTS, or over shared memory to the end), and what it sent eagerly is held here
        eager = 2 * SYNC_MIN - 1 if synced else 3 * SYNC_MIN - 1
        await until(lambda: pair.link(0).stats().waiting == 1 if synced else len(sent) == 3)
        await until(lambda: pair.link(1).stats().unexpected_bytes == eager)
        assert sent == (["early", "small"] if synced else ["early", "small", "big"])
        outs = [np.zeros(n, np.uint8) for n in (SYNC_MIN - 1, SYNC_MIN, SYNC_MIN)]
        for step, out in ((1, outs[0]), (2, outs[1]), (0, outs[2])):
            await ch.recv(0, step=step, out=out)
        return outs

    _, outs = await pair.run([sender, receiver])
    assert all(np.array_equal(o, d) for o, d in zip(outs, (small, big, big), strict=True))
    synced = pair.kind != "shm"
    assert pair.link(0).stats().rendezvous == (1 if synced else 0)
    assert pair.link(1).stats().unexpected_peak == (2 * SYNC_MIN - 1 if synced else 3 * SYNC_MIN - 1)


async def test_a_large_eager_payload_ahead_of_its_receive_is_held_in_one_buffer(
    make_pair: MakePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Larger than the decoder's pieces and within the window: it arrives before its
    receive is posted, into one buffer of its size (never pieces joined: a second copy),
    and is held, then handed over intact, both with and without an ``out`` buffer."""
    joined: list[int] = []
    real_join = wire.decoder._join

    def join(chunks: list[memoryview], size: int) -> memoryview:
        joined.append(size)
        return real_join(chunks, size)

    monkeypatch.setattr(wire.decoder, "_join", join)
    pair = await make_pair(64 * MIB)
    data = [np.random.default_rng(i).integers(0, 256, 3 * CHUNK + 5, dtype=np.uint8) for i in range(2)]

    async def sender(ch: Channel) -> None:
        for i, d in enumerate(data):
            await ch.send(1, d, step=i)

    async def receiver(ch: Channel) -> list[np.ndarray]:
        await until(lambda: pair.link(1).stats().bytes_received == sum(d.nbytes for d in data))  # both arrive first
        held = pair.link(1).stats().unexpected_bytes
        out = np.zeros_like(data[0])
        await ch.recv(0, step=0, out=out)
        fresh = np.frombuffer(await ch.recv(0, step=1), np.uint8)
        assert held == sum(d.nbytes for d in data)
        return [out, fresh]

    _, got = await pair.run([sender, receiver])
    assert all(np.array_equal(g, d) for g, d in zip(got, data, strict=True))
    assert joined == []
    into = pair.link(1).stats()
    assert into.unexpected_bytes == 0 and into.bytes_received == sum(d.nbytes for d in data)
    assert pair.link(0).stats().rendezvous == 0


async def test_rendezvous_into_a_receive_posted_without_a_buffer(make_pair: MakePair) -> None:
    pair = await make_pair(MIB)
    data = filled(3 * MIB, 7)

    async def sender(ch: Channel) -> None:
        await ch.send(1, data, step=0)
        await ch.send(1, filled(MIB // 2, 9), step=1)  # eager again: credit was not spent

    async def receiver(ch: Channel) -> tuple[bytes, bytes]:
        await asyncio.sleep(0.1)
        return bytes(await ch.recv(0, step=0)), bytes(await ch.recv(0, step=1))

    _, (a, b) = await pair.run([sender, receiver])
    assert a == data.tobytes() and b == filled(MIB // 2, 9).tobytes()
    assert pair.link(0).stats().rendezvous == 1
    assert pair.link(1).flow.uncharged_held == 0


async def test_two_concurrent_sends_received_second_first_do_not_deadlock(make_pair: MakePair) -> None:
    """The first send fills the window and is not received until the second
    is: with credits alone this deadlocks (head-of-line blocking)."""
    pair = await make_pair(MIB)

    async def sender(ch: Channel) -> None:
        await asyncio.gather(ch.send(1, filled(MIB, 1), step=0), ch.send(1, filled(MIB, 2), step=1))

    async def receiver(ch: Channel) -> list[int]:
        await asyncio.sleep(0.1)
        second = np.frombuffer(await ch.recv(0, step=1), np.uint8)
        first = np.frombuffer(await ch.recv(0, step=0), np.uint8)
        return [int(first[0]), int(second[0]), int(first.sum() // MIB), int(second.sum() // MIB)]

    _, got = await pair.run([sender, receiver], timeout=10)
    assert got == [1, 2, 1, 2]
    assert pair.link(0).stats().rendezvous == 1


async def test_two_ranks_each_issue_a_large_send_before_their_receive(make_pair: MakePair) -> None:
    pair = await make_pair(4 * MIB)
    size = 48 * MIB
    comms = [Communicator(t, timeout=60) for t in pair.meshes]

    async def rank(c: Communicator) -> bool:
        mine = filled(size, c.rank + 1)
        sending = c.send(mine, 1 - c.rank)  # issued: runs while this rank goes on to receive
        receiving = c.recv(1 - c.rank)
        await sending
        got = await receiving
        return bool(got.nbytes == size and got[0] == 2 - c.rank and (got == got[0]).all())

    async with asyncio.timeout(60):
        assert await asyncio.gather(*(rank(c) for c in comms)) == [True, True]
    for r in (0, 1):
        assert pair.link(r).stats().unexpected_peak <= 4 * MIB


async def test_a_send_waiting_for_clearance_fails_with_its_operation(make_pair: MakePair) -> None:
    """A send blocked on its RTS never outlives its operation."""
    pair = await make_pair(MIB)

    async def sender(ch: Channel) -> str:
        sending = asyncio.ensure_future(ch.send(1, filled(4 * MIB, 1), step=0))
        await until(lambda: pair.link(0).stats().waiting == 1)  # its RTS is out
        assert not sending.done()
        ch.op.fail_with(Reason.ERROR, "boom here")
        with pytest.raises(CollectiveError, match="boom here"):
            await sending
        return "failed"

    async def receiver(ch: Channel) -> None:
        await asyncio.sleep(0.3)  # never posts the receive

    assert await pair.run([sender, receiver], timeout=10) == ["failed", None]
    assert pair.link(0).stats().waiting == 0
    assert pair.link(1).flow.pending == {}  # answered (ok=false) when the receiver's operation closed


# --------------------------------------------------------------------------- refusing what the window forbids


async def test_a_data_frame_declaring_4_gib_is_refused_without_allocating(make_pair: MakePair) -> None:
    pair = await make_pair(64 * MIB)

    async def attacker(ch: Channel) -> None:
        before = rss()
        declare(pair.link(0), {"g": "g", "q": 0, "s": 0, "c": 0, "f": "fp"}, 4 * GIB)
        await asyncio.sleep(0.3)  # the victim reads what arrived
        assert rss() - before < 16 * MIB

    async def victim(ch: Channel) -> str:
        before = rss()
        with pytest.raises(PeerLost) as info:
            await ch.recv(0, step=0)
        assert rss() - before < 16 * MIB
        return str(info.value)

    _, message = await pair.run([attacker, victim], timeout=10)
    link = pair.link(1)
    assert isinstance(link.lost, ProtocolError), link.lost
    assert "exceeds the remaining receive window" in str(link.lost)
    assert "exceeds the remaining receive window" in message
    assert link.stats().lost is not None


async def test_a_rendezvous_data_frame_that_was_never_cleared_is_refused(make_pair: MakePair) -> None:
    pair = await make_pair(MIB)
    if pair.kind != "memory":  # (a shared-memory link's socket carries small DATA frames)
        link = pair.link(0)
        assert isinstance(link, TcpLink) and link.transport is not None
        header = {"g": "g", "q": 0, "s": 0, "c": 0, "f": "fp", "rz": 99}
        link.transport.write(b"".join(bytes(p) for p in encode(Kind.DATA, header, b"x" * 10)))
    else:
        with pytest.raises(ConnectionError):
            pair.link(0)._deliver(
                Kind.DATA, {"g": "g", "q": 0, "s": 0, "c": 0, "f": "fp", "rz": 99}, memoryview(b"x" * 10)
            )
    async with asyncio.timeout(5):
        while pair.link(1).lost is None:
            await asyncio.sleep(0.01)
    assert isinstance(pair.link(1).lost, ProtocolError) and "not cleared" in str(pair.link(1).lost)


# --------------------------------------------------------------------------- sans-IO: the bookkeeping


def test_flow_spends_and_refuses_beyond_the_window() -> None:
    f = Flow(window=1000, peer_window=400)
    assert f.try_spend(300) and not f.try_spend(101) and f.try_spend(100) and f.credit == 0
    f.credited(250)
    assert f.credit == 250
    with pytest.raises(ProtocolError, match="more than was spent"):
        f.credited(151)
    f.charge(600)
    f.charge(400)
    with pytest.raises(ProtocolError, match="remaining receive window of 0"):
        f.charge(1)


def test_flow_returns_credit_in_batches_of_a_quarter_window() -> None:
    f = Flow(window=1000, peer_window=1000)
    f.charge(1000)
    assert [f.free(100), f.free(100), f.free(100)] == [0, 0, 300]  # threshold 250
    assert f.unreturned == 700
    assert f.released(249) == 0 and f.released(1) == 250 and f.unreturned == 450


def test_flow_never_returns_credit_for_rendezvous_bytes() -> None:
    f = Flow(window=1000, peer_window=1000)
    f.charge(400)
    f.rts(1, 5000)
    assert f.answer(1, True)
    f.rendezvous_data(1, 5000)
    f.hold_uncharged(5000)
    assert f.released(400) == 0  # counted off the rendezvous bytes first...
    assert f.released(5000) == 400  # ...so the total given back is exactly what was charged
    assert f.unreturned == 0 and f.uncharged_held == 0


def test_flow_rts_bookkeeping() -> None:
    f = Flow(window=1000, peer_window=1000)
    f.rts(7, 10)
    with pytest.raises(ProtocolError, match="duplicate"):
        f.rts(7, 10)
    with pytest.raises(ProtocolError):
        f.rts(8, 0)
    assert f.answer(7, False) and not f.answer(7, True)  # answered once
    with pytest.raises(ProtocolError, match="not cleared"):
        f.rendezvous_data(7, 10)
    f.rts(9, 10)
    f.answer(9, True)
    with pytest.raises(ProtocolError, match="announced 10"):
        f.rendezvous_data(9, 11)
    with pytest.raises(ProtocolError, match="not cleared"):
        f.rendezvous_data(True, 10)
    for i in range(MAX_PENDING_RTS):
        f.rts(100 + i, 1)
    with pytest.raises(ProtocolError, match="waiting"):
        f.rts(10, 1)


# --------------------------------------------------------------------------- sans-IO: growing buffers


def test_decoder_grows_its_own_buffer_as_bytes_arrive() -> None:
    """A frame declaring 4 GiB costs at most a chunk beyond what has arrived."""
    dec = FrameDecoder()
    head = encode_header(Kind.EVENT, {"topic": "t"}, payload_len=4 * GIB)
    piece = bytes(range(256)) * (MIB // 256)
    tracemalloc.start()
    try:
        assert dec.feed(head) == []
        assert tracemalloc.get_traced_memory()[1] <= CHUNK + MIB // 8
        for _ in range(3):
            assert dec.feed(piece) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 3 * MIB + CHUNK + MIB // 8
    target = dec.payload_target()
    assert target is not None and 0 < target.nbytes <= CHUNK


def test_feed_each_hands_over_each_frame_before_the_next_sink() -> None:
    calls: list[str] = []

    def sink(kind: Kind, header: dict[str, Any], n: int) -> None:
        calls.append(f"sink {header['s']}")

    dec = FrameDecoder(sink=sink)
    stream = b"".join(
        bytes(p) for s in range(3) for p in encode(Kind.DATA, {"g": "g", "q": 0, "s": s, "c": 0, "f": "x"}, b"ab")
    )
    dec.feed_each(stream, lambda f: calls.append(f"frame {f.header['s']}"))
    assert calls == ["sink 0", "frame 0", "sink 1", "frame 1", "sink 2", "frame 2"]

    def boom(frame: Any) -> None:
        raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError):
        dec.feed_each(stream, boom)
    with pytest.raises(ProtocolError, match="broken"):
        dec.feed(stream)


def test_decoder_joins_chunks_direct_writes_and_feeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire.decoder, "CHUNK", 1000)
    payload = np.random.default_rng(3).integers(0, 256, 4567, dtype=np.uint8).tobytes()
    stream = b"".join(bytes(p) for p in encode(Kind.DATA, {"g": "g", "q": 1, "s": 0, "c": 0, "f": "x"}, payload))
    stream += b"".join(bytes(p) for p in encode(Kind.PING, {}))
    dec = FrameDecoder()
    head = len(stream) - len(payload) - 21
    assert dec.feed(stream[: head + 10]) == []
    got, pos, direct = [], head + 10, True
    while pos < len(stream):
        target = dec.payload_target()
        if direct and target is not None:
            assert target.nbytes <= 1000
            n = min(target.nbytes, 333)
            target[:n] = stream[pos : pos + n]
            frame = dec.payload_written(n)
            got += [frame] if frame is not None else []
        else:
            got += dec.feed(stream[pos : pos + 777])
            n = 777
        pos += n
        direct = not direct
    assert [f.kind for f in got] == [Kind.DATA, Kind.PING]
    assert bytes(got[0].payload) == payload and not got[0].payload.readonly
    assert dec.at_boundary


def test_divert_drops_the_rest_of_a_payload_without_allocating_it() -> None:
    out = np.zeros(3 * MIB, np.uint8)
    dec = FrameDecoder(sink=lambda kind, header, n: out)
    head = encode_header(Kind.DATA, {"g": "g", "q": 1, "s": 0, "c": 0, "f": "x"}, 3 * MIB)
    assert dec.feed(head + b"\1" * 100) == []
    dec.divert()
    rest = b"\2" * (3 * MIB - 100)
    tracemalloc.start()
    try:
        frames = dec.feed(rest)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MIB
    [frame] = frames
    assert frame.diverted and frame.payload.nbytes == 0
    assert out[:100].tolist() == [1] * 100 and not out[100:].any()  # nothing written after divert


def test_control_kinds_carry_no_payload_and_small_headers() -> None:
    for kind in wire.CONTROL_KINDS:
        prefix = wire.PREFIX.pack(wire.MAGIC, wire.VERSION, int(kind), 0, 10, 1)
        with pytest.raises(ProtocolError, match=f"{kind.name} frame payload"):
            FrameDecoder().feed(prefix)
        prefix = wire.PREFIX.pack(wire.MAGIC, wire.VERSION, int(kind), 0, 16 * 1024 + 1, 0)
        with pytest.raises(ProtocolError, match=f"{kind.name} frame header"):
            FrameDecoder().feed(prefix)
    with pytest.raises(ProtocolError, match="CREDIT frame header"):
        encode_header(Kind.CREDIT, {"n": 1, "pad": "x" * 20000})
    lim = FrameLimits(max_control_header=100)
    with pytest.raises(ProtocolError, match="ABORT frame header of 101"):
        wire.decode_prefix(wire.PREFIX.pack(wire.MAGIC, wire.VERSION, int(Kind.ABORT), 0, 101, 0), lim)
