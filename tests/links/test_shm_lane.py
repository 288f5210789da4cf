"""The small-message lane of shared-memory links (netcoll/links/lane.py): the
ring of whole frames (order, wrapping, room, every bad record refused), the
sleep/bell handshake between two processes (no wake-up is ever lost), and on
real links: small frames through the lane only when the peer's loop polls it,
frames in the lane before a BYE still delivered, one bell for a sleeping
peer, and a lying lane breaking the link with a ProtocolError. The link tests
run on asyncio's loop and on netcoll's (tests/links/conftest.py)."""

from __future__ import annotations

import asyncio
import mmap
import multiprocessing as mp
import os
import random
import select
import struct
import time
from typing import Any

import numpy as np
import pytest

from netcoll.errors import ProtocolError
from netcoll.links import lane
from netcoll.links.factory import LinkConfig
from netcoll.links.lane import (
    LANE_BYTES,
    LANE_CONTROL,
    LANE_MAX_BYTES,
    LANE_RECORD_MAX,
    LANE_SPAN,
    LaneReader,
    LaneWriter,
)
from netcoll.links.shm import RING_MIN, ShmLink
from netcoll.loop import spin_selector
from netcoll.mesh.channel import Channel
from netcoll.wire import DEFAULT_LIMITS, Kind, encode_header
from tests.links.test_shm_links import broken, mesh, pattern, run

pytestmark = pytest.mark.skipif(not lane.supported(), reason="lanes are used on x86-64 only")

HEADER = {"g": "g", "q": 0, "s": 0, "c": 0, "f": "fp"}


def frame(i: int, n: int) -> tuple[bytes, memoryview]:
    payload = memoryview(bytes([i % 251]) * n)
    return encode_header(Kind.DATA, dict(HEADER, s=i), n), payload


def drain(reader: LaneReader) -> list[tuple[int, bytes]]:
    out = []
    for raw in reader.frames():
        _, header, payload = lane.parse(raw, DEFAULT_LIMITS)
        out.append((header["s"], bytes(payload)))
    return out


def lane_pair(memory: Any = None) -> tuple[LaneWriter, LaneReader, memoryview]:
    view = memoryview(bytearray(LANE_SPAN) if memory is None else memory)
    return LaneWriter(view), LaneReader(view), view


# --------------------------------------------------------------------------- the ring of frames


def test_a_writer_uses_the_lane_only_while_its_reader_polls_it() -> None:
    view = memoryview(bytearray(LANE_SPAN))
    writer = LaneWriter(view)
    assert not writer.polled()
    reader = LaneReader(view)
    assert writer.polled()
    head, payload = frame(0, LANE_RECORD_MAX - 30)
    assert not writer.put(head, payload)  # a record over the limit: the socket takes it
    assert writer.put(*frame(0, 100)) and len(drain(reader)) == 1
    reader.close()
    assert not writer.polled()


def test_a_lane_is_a_quarter_ring_and_takes_a_quarter_lane_record() -> None:
    assert lane.lane_bytes(4 << 20) == lane.lane_bytes(64 << 20) == LANE_MAX_BYTES == 1 << 20
    assert lane.lane_bytes(2 << 20) == 512 << 10
    assert lane.lane_bytes(64 << 10) == lane.lane_bytes(1 << 20) == LANE_BYTES
    assert LANE_RECORD_MAX == lane.record_max(LANE_BYTES) >= lane.record_bytes(RING_MIN + 4000)
    view = memoryview(bytearray(lane.lane_span(4 << 20)))
    writer, reader = LaneWriter(view), LaneReader(view)
    assert writer.record_max == (256 + 4) << 10
    head, payload = frame(3, 256 << 10)
    assert writer.put(head, payload)
    assert drain(reader) == [(3, bytes(payload))]
    assert not writer.put(*frame(4, (260 << 10) - 30))  # over a quarter lane and the header room
    for size in (LANE_BYTES - 4096, LANE_MAX_BYTES + 4096, LANE_BYTES + 100):
        with pytest.raises(ValueError, match="a lane holds"):
            LaneWriter(memoryview(bytearray(LANE_CONTROL + size)))


def test_frames_come_out_whole_and_in_order_across_many_laps() -> None:
    writer, reader, _ = lane_pair()
    rng = random.Random(7)
    sent: list[tuple[int, bytes]] = []
    got: list[tuple[int, bytes]] = []
    for i in range(3000):
        head, payload = frame(i, rng.choice([0, 1, 4, 1000, 8000, 30000]))
        while not writer.put(head, payload):  # full: the reader makes room
            assert reader.pending()
            got += drain(reader)
        sent.append((i, bytes(payload)))
        if rng.random() < 0.3:
            got += drain(reader)
    got += drain(reader)
    assert got == sent and not reader.pending()


def test_a_reader_that_stops_at_a_frame_leaves_it_in_the_lane() -> None:
    """What a link does with a frame that must wait: it closes the iterator while
    holding it; the frames before it are consumed, that one is read again next time."""
    writer, reader, _ = lane_pair()
    for i in range(4):
        assert writer.put(*frame(i, 100))
    frames = reader.frames()
    seen = [lane.parse(next(frames), DEFAULT_LIMITS)[1]["s"] for _ in range(3)]
    frames.close()  # holding frame 2
    assert seen == [0, 1, 2] and reader.pending()
    assert [s for s, _ in drain(reader)] == [2, 3] and not reader.pending()


def test_a_full_lane_refuses_a_frame_and_takes_it_once_the_reader_caught_up() -> None:
    writer, reader, _ = lane_pair()
    head, payload = frame(1, 16000)
    placed = 0
    while writer.put(head, payload):
        placed += 1
    assert placed == LANE_BYTES // lane.record_bytes(len(head) + 16000)
    assert len(drain(reader)) == placed
    assert writer.put(head, payload)


def test_a_sleeping_reader_is_rung_once_per_sleep() -> None:
    writer, reader, _ = lane_pair()
    head, payload = frame(0, 4)
    assert writer.put(head, payload) and not writer.should_ring()  # awake: it will poll
    reader.sleep()
    assert writer.put(head, payload) and writer.should_ring()
    assert writer.put(head, payload) and not writer.should_ring()  # already rung for this sleep
    reader.wake()
    assert writer.put(head, payload) and not writer.should_ring()
    reader.sleep()
    assert writer.put(head, payload) and writer.should_ring()


def _corrupt(view: memoryview, at: int, data: bytes, head: int) -> None:
    view[LANE_CONTROL + at : LANE_CONTROL + at + len(data)] = data
    struct.pack_into("<Q", view, 0, head)


@pytest.mark.parametrize(
    ("record", "head", "why"),
    [
        (b"", LANE_BYTES + 8, "lane head"),
        (struct.pack("<II", 12, 1), 24, "malformed lane record"),
        (struct.pack("<II", LANE_RECORD_MAX, 0), LANE_RECORD_MAX + 8, "malformed lane record"),
        (struct.pack("<II", 100, 0), 64, "malformed lane record"),  # beyond what was published
        (struct.pack("<II", 8, 0) + b"\0" * 8, 16, "shorter than a frame prefix"),
    ],
)
def test_a_record_that_cannot_be_one_is_a_protocol_error(record: bytes, head: int, why: str) -> None:
    _, reader, view = lane_pair()
    _corrupt(view, 0, record, head)
    with pytest.raises(ProtocolError, match=why):
        drain(reader)


@pytest.mark.parametrize(
    ("kind", "header", "extra", "why"),
    [
        (Kind.CREDIT, {"n": 5}, 0, "only give ring space back"),
        (Kind.CREDIT, {"n": 5, "z": 4096}, 0, "only give ring space back"),
        (Kind.CTS, {"id": 1, "ok": True}, 0, "CTS frame"),
        (Kind.DATA, dict(HEADER, z=[0, 4]), 4, "also carries a payload"),
        (Kind.DATA, dict(HEADER, rz=3), 0, "eager or a ring piece"),
        (Kind.DATA, dict(HEADER, q="x"), 0, "field 'q'"),
        (Kind.DATA, HEADER, 5, "of another length"),
    ],
)
def test_a_lane_frame_is_checked_as_a_socket_frame_is(kind: Kind, header: dict[str, Any], extra: int, why: str) -> None:
    raw = encode_header(kind, header, extra if "z" in header else 0) + b"\0" * extra
    with pytest.raises(ProtocolError, match=why):
        lane.parse(memoryview(raw), DEFAULT_LIMITS)


@pytest.mark.parametrize(
    ("kind", "header"),
    [
        (Kind.DATA, HEADER),
        (Kind.DATA, dict(HEADER, z=[0, 4096], zn=4096)),
        (Kind.DATA, dict(HEADER, z=[0, 4096], zn=4096, rz=7)),
        (Kind.CREDIT, {"n": 0, "z": 4096}),
    ],
)
def test_a_lane_carries_eager_data_ring_piece_headers_and_ring_credits(kind: Kind, header: dict[str, Any]) -> None:
    got_kind, got, payload = lane.parse(memoryview(encode_header(kind, header, 0)), DEFAULT_LIMITS)
    assert (got_kind, got, payload.nbytes) == (kind, header, 0)


def test_netcoll_shm_lane_turns_lanes_off_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NETCOLL_SHM_LANE", raising=False)
    assert lane.enabled()
    monkeypatch.setenv("NETCOLL_SHM_LANE", "0")
    assert not lane.enabled()
    monkeypatch.setenv("NETCOLL_SHM_LANE", "yes")
    with pytest.raises(ValueError, match="NETCOLL_SHM_LANE must be 0 or 1"):
        lane.enabled()


# --------------------------------------------------------------------------- no lost wake-up


def _write_all(memory: mmap.mmap, bell: int, count: int, seed: int) -> None:
    writer, rng = LaneWriter(memoryview(memory)), random.Random(seed)
    for i in range(count):
        head, payload = frame(i, rng.choice([4, 64, 3000]))
        while not writer.put(head, payload):
            os.sched_yield()
        if writer.should_ring():
            os.write(bell, b"!")
        for _ in range(rng.choice([0, 0, 0, 10, 200])):  # vary where the writer is when the reader sleeps
            pass
        if i % 64 == 63:  # now and then let the reader empty its lane and go to sleep
            time.sleep(0.0002)
    os._exit(0)


def test_a_reader_that_sleeps_between_frames_is_always_woken() -> None:
    """Two processes: the reader goes to sleep whenever its lane is empty, and
    must always be rung awake; a lost wake-up would leave it waiting 10 s."""
    count = 20_000
    memory = mmap.mmap(-1, LANE_SPAN)  # shared with the forked writer
    reader = LaneReader(memoryview(memory))
    bell_r, bell_w = os.pipe()
    proc = mp.get_context("fork").Process(target=_write_all, args=(memory, bell_w, count, 3))
    proc.start()
    try:
        got, sleeps = 0, 0
        while got < count:
            frames = drain(reader)
            assert [s for s, _ in frames] == list(range(got, got + len(frames)))
            got += len(frames)
            if frames or got == count:
                continue
            reader.sleep()
            if not reader.pending():
                sleeps += 1
                ready, _, _ = select.select([bell_r], [], [], 10.0)
                assert ready, f"lost wake-up after {got} frames (pending: {reader.pending()})"
                os.read(bell_r, 4096)
            reader.wake()
        assert sleeps > 100  # the handshake was exercised, not skipped
    finally:
        proc.join(10)
        if proc.is_alive():  # the reader gave up: the writer may be waiting for room
            proc.kill()
            proc.join()
        os.close(bell_r)
        os.close(bell_w)
        reader.close()


# --------------------------------------------------------------------------- on real links


def lanes_polled() -> bool:
    return spin_selector(asyncio.get_running_loop()) is not None


@pytest.mark.parametrize(
    ("ring", "eager", "pieces", "credits"),
    [
        # 4 MiB rings, 1 MiB lanes: eager payloads up to 256 KiB (with the header room); the
        # 300 000 bytes are one quarter-ring piece, and less than a quarter ring is given back
        (None, 7, 1, False),
        # the smallest lanes (256 KiB): eager up to 64 KiB, so every payload below RING_MIN; the
        # ring's pieces are 64 KiB (4 + 5), and its space comes back by a quarter
        (256 * 1024, 6, 9, True),
    ],
)
async def test_frames_go_through_the_lane_when_the_peer_polls_it(
    ring: int | None, eager: int, pieces: int, credits: bool
) -> None:
    """Eager DATA that fits, the headers of ring pieces, and the CREDITs that
    give ring space back: all through the lanes, none on the socket."""
    async with mesh(2, None if ring is None else LinkConfig(shm_bytes=ring)) as ts:
        a, b = ts[0].links[1], ts[1].links[0]
        assert isinstance(a, ShmLink) and isinstance(b, ShmLink)
        sizes = (4, 1000, 20_000, 48 * 1024, RING_MIN - 1, RING_MIN, 200_000, 300_000)
        for seq, n in enumerate(sizes):
            data = pattern(n, seq)
            res = await run(ts, [lambda ch, d=data: ch.send(1, d, step=0), lambda ch: ch.recv(0, step=0)], seq)
            assert np.array_equal(np.frombuffer(res[1], np.uint8), data)
        polled = lanes_polled()
        assert a.lane_sent == b.lane_received == (eager + pieces if polled else 0)
        assert a.stats().lane_sent == a.lane_sent and b.stats().lane_received == b.lane_received
        assert b.lane_sent == a.lane_received and (b.lane_sent > 0) == (polled and credits)
        assert a.stats().frames_sent >= eager + pieces  # the lane's frames are frames too


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("first", [False, True])
async def test_eager_data_in_a_polled_lane_is_folded_as_it_is_read(first: bool, dtype: str) -> None:
    """A receive posted with a fold gets a lane frame of LANE_FOLD_MIN bytes or
    more reduced straight out of the lane (its buffer left as it was), with the
    bits of a copy and then the reduction; a smaller one, or any frame on a loop
    that does not poll its lanes, fills the buffer and leaves the fold to the
    caller. The link says which payloads it folds (``fold_min_bytes``)."""
    from netcoll.links.shmlane import LANE_FOLD_MIN
    from netcoll.ops import BFLOAT16, Fold, ReduceOp, reduce_to

    dt = np.dtype(BFLOAT16) if dtype == "bfloat16" else np.dtype(dtype)

    async with mesh(2) as ts:
        a, b = ts[0].links[1], ts[1].links[0]
        assert isinstance(a, ShmLink) and isinstance(b, ShmLink)
        polled = lanes_polled()
        assert b.fold_min_bytes == (LANE_FOLD_MIN if polled else RING_MIN)
        assert ts[1].folds(0, LANE_FOLD_MIN) == polled and ts[1].folds(0, RING_MIN)
        rng = np.random.default_rng(3)
        item = dt.itemsize
        for seq, n in enumerate((LANE_FOLD_MIN // item - 1, LANE_FOLD_MIN // item, 48_000 // item)):
            theirs = rng.standard_normal(n).astype(dt)
            own = rng.standard_normal(n).astype(dt)
            landing, out = np.full(n, 7, dt), np.zeros(n, dt)
            fold = Fold(ReduceOp.SUM, out, own, incoming_first=first)
            posted = asyncio.Event()

            async def receive(
                ch: Channel, fold: Fold = fold, landing: np.ndarray = landing, posted: asyncio.Event = posted
            ) -> None:
                fut = ch.post(0, step=0, out=landing, fold=fold)
                posted.set()
                await fut

            async def send(ch: Channel, data: np.ndarray = theirs, posted: asyncio.Event = posted) -> None:
                await posted.wait()  # the receive is posted first
                await ch.send(1, data, step=0)

            before = b.lane_received
            await run(ts, [send, receive], seq)
            assert b.lane_received == before + polled
            expected = np.empty(n, dt)
            reduce_to(ReduceOp.SUM, expected, *((theirs, own) if first else (own, theirs)))
            if polled and theirs.nbytes >= LANE_FOLD_MIN:
                assert fold.complete and (landing == 7).all() and out.tobytes() == expected.tobytes()
            else:
                assert not fold.complete and np.array_equal(landing, theirs) and (out == 0).all()


async def test_lanes_are_not_used_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_SHM_LANE", "0")
    async with mesh(2) as ts:
        data = pattern(100, 1)
        res = await run(ts, [lambda ch: ch.send(1, data, step=0), lambda ch: ch.recv(0, step=0)], 0)
        assert np.array_equal(np.frombuffer(res[1], np.uint8), data)
        link = ts[0].links[1]
        assert isinstance(link, ShmLink) and link.lane_sent == 0


async def test_frames_left_in_the_lane_before_a_bye_are_still_delivered() -> None:
    async with mesh(2) as ts:
        sender, receiver = ts
        link = receiver.links[0]
        assert isinstance(link, ShmLink)
        selector = spin_selector(asyncio.get_running_loop())
        if selector is not None:  # its loop does not look at the lane before the BYE comes
            assert link._poll is not None
            selector.remove_poller(link._poll)
        data = [pattern(64, s) for s in range(5)]
        op = sender.mailbox.open("g", 0, "fp", (0, 1), "test")
        for s, d in enumerate(data):  # nothing is posted yet: the frames wait (in the lane, if polled)
            await Channel(sender, op).send(1, d, step=s)
        sender.mailbox.close(op)
        await sender.close()  # BYE right behind them; the receiver closes its end on it
        assert link.lost is not None and link.lane_received == (5 if selector is not None else 0)
        mine = receiver.mailbox.open("g", 0, "fp", (0, 1), "test")
        try:
            async with asyncio.timeout(5):
                got = await _recv_all(Channel(receiver, mine), len(data))
        finally:
            receiver.mailbox.close(mine)
        assert [bytes(r) for r in got] == [d.tobytes() for d in data]


async def _recv_all(ch: Any, n: int) -> list[Any]:
    return [await ch.recv(0, step=s) for s in range(n)]


async def test_a_sleeping_peer_is_rung_once_and_gets_its_frames() -> None:
    if not lanes_polled():
        pytest.skip("lanes are polled on netcoll's loop only")
    async with mesh(2) as ts:
        a, b = ts[0].links[1], ts[1].links[0]
        assert isinstance(a, ShmLink) and isinstance(b, ShmLink) and b._poll is not None
        b._poll.reader.sleep()  # as its loop does before blocking in epoll
        data = [pattern(10, s) for s in range(3)]
        fns = [lambda ch: _send_all(ch, data), lambda ch: _recv_all(ch, len(data))]
        res = await run(ts, fns, 0)
        assert [bytes(r) for r in res[1]] == [d.tobytes() for d in data]
        assert a.bells == a.stats().bells == 1 and a.lane_sent == 3


async def _send_all(ch: Any, data: list[np.ndarray]) -> None:
    for s, d in enumerate(data):
        await ch.send(1, d, step=s)


async def test_a_lying_lane_breaks_the_link_with_a_protocol_error() -> None:
    if not lanes_polled():
        pytest.skip("lanes are polled on netcoll's loop only")
    async with mesh(2) as ts:
        liar, victim = ts[0].links[1], ts[1].links[0]
        assert isinstance(liar, ShmLink) and isinstance(victim, ShmLink)
        out = liar.segment.lane_tx
        out[LANE_CONTROL : LANE_CONTROL + 8] = struct.pack("<II", 5, 7)
        struct.pack_into("<Q", out, 0, 16)
        await broken(victim)
        assert isinstance(victim.lost, ProtocolError) and "malformed lane record" in str(victim.lost)
        assert 0 in ts[1].mailbox.dead


async def test_a_ring_piece_header_in_the_lane_must_belong_to_the_message_arriving() -> None:
    """A lane is checked as the socket is: a ring piece of no message is a ProtocolError."""
    if not lanes_polled():
        pytest.skip("lanes are polled on netcoll's loop only")
    async with mesh(2) as ts:
        liar, victim = ts[0].links[1], ts[1].links[0]
        assert isinstance(liar, ShmLink) and isinstance(victim, ShmLink)
        assert liar._lane_put(encode_header(Kind.DATA, dict(HEADER, z=[0, 100]), 0), memoryview(b""))
        await broken(victim)
        assert isinstance(victim.lost, ProtocolError) and "belongs to no message" in str(victim.lost)


@pytest.mark.parametrize("refused", [64 * 1024, 0])
async def test_after_a_ring_header_on_the_socket_the_lane_waits_for_the_rest(
    monkeypatch: pytest.MonkeyPatch, refused: int
) -> None:
    """A ring message's piece at ``refused`` is announced on the socket (the lane
    refused it; the pieces after it follow it there), those before it in the lane;
    then eager DATA and another ring message. Eager DATA in the lane waits there
    while the ring message is part-way; the next ring message's headers stay on
    the socket until the reader has given back the space of the pieces announced
    there (else the reader would meet them in the lane first). Every byte arrives."""
    if not lanes_polled():
        pytest.skip("lanes are polled on netcoll's loop only")
    async with mesh(2, LinkConfig(shm_bytes=256 * 1024)) as ts:  # pieces of 64 KiB
        a, b = ts[0].links[1], ts[1].links[0]
        assert isinstance(a, ShmLink) and isinstance(b, ShmLink)
        put, frame_of = a._lane_put, b._lane_frame
        on_socket: list[int] = []
        waited: list[int] = []

        def refusing_put(head: bytes, payload: memoryview) -> bool:
            _, header, _ = lane.parse(memoryview(head + bytes(payload)), DEFAULT_LIMITS)
            pos = header.get("z", [-1])[0]
            if pos == refused and not on_socket:
                on_socket.append(pos)
                return False
            return put(head, payload)

        def counting_frame(raw: memoryview) -> bool:
            done = frame_of(raw)
            if not done:
                waited.append(raw.nbytes)
            return done

        monkeypatch.setattr(a, "_lane_put", refusing_put)
        monkeypatch.setattr(b, "_lane_frame", counting_frame)
        sent = [pattern(128 * 1024, 1), pattern(100, 2), pattern(128 * 1024, 3)]

        async def sender(ch: Channel) -> None:
            for k, data in enumerate(sent):
                await ch.send(1, data, step=0, chunk=k)

        async def receiver(ch: Channel) -> list[bytes]:
            return [bytes(await ch.recv(0, step=0, chunk=k)) for k in range(3)]

        _, got = await run(ts, [sender, receiver], 0)
        assert got == [data.tobytes() for data in sent]
        assert on_socket == [refused] and a._socket_upto in (128 * 1024, 256 * 1024)  # (the last, if early)
        if refused:
            assert waited  # the eager frame met the first message part-way
