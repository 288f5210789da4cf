"""Shared-memory links between ranks on one host, over real loopback TCP
connections: chosen automatically, every collective correct, messages larger
than the ring and the window, concurrent and cancelled sends, a lying peer,
the visible fallback to TCP, forced kinds, and no file left in /dev/shm by any
of it (a peer killed mid-transfer: test_shm_kill.py)."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from netcoll.comm import Communicator
from netcoll.errors import ProtocolError, RendezvousError
from netcoll.links import shm
from netcoll.links.factory import LinkConfig
from netcoll.links.shm import RING_MIN, ShmLink
from netcoll.links.shmring import SHM_DIR, Segment
from netcoll.loop import spin_selector
from netcoll.mesh.certs import TlsConfig
from netcoll.mesh.channel import Channel
from netcoll.mesh.tcpmesh import Listener, TcpMesh
from netcoll.wire import Kind
from tests.support.groups import tcp_mesh
from tests.support.tlsca import issue, make_ca
from tests.support.waiting import until

pytestmark = [pytest.mark.tcp, pytest.mark.skipif(not shm.possible(), reason="no /dev/shm here")]

LOOPBACK = "127.0.0.1"
TOKEN = "shm-s3cret"
KIB, MIB = 1 << 10, 1 << 20
_SESSIONS = itertools.count()


def leftovers(pid: int | None = None) -> list[str]:
    """Segment files of process ``pid`` (default: this one) still in /dev/shm."""
    prefix = f"netcoll-{os.getpid() if pid is None else pid}-"
    return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefix))


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    assert leftovers() == []
    yield
    assert leftovers() == []


@pytest.fixture(autouse=True)
def ring_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the ring: no direct DATA (it has tests of its own, test_shm_direct.py)."""
    monkeypatch.setenv("NETCOLL_SHM_CMA", "0")


def mesh(n: int, config: LinkConfig | None = None, tls: TlsConfig | None = None) -> Any:
    """``n`` ranks in this loop, linked over loopback (shared memory where it works)."""
    return tcp_mesh(n, token=TOKEN, configs=[config] * n, tls=tls, timeout=15)


def kinds(meshes: list[TcpMesh]) -> set[str]:
    return {s.kind for t in meshes for s in t.link_stats().values()}


async def run(meshes: list[TcpMesh], fns: list[Any], seq: int, timeout: float = 30.0) -> list[Any]:
    """``fns[r](channel)`` on rank r in operation ``seq``; results by rank."""

    async def one(r: int) -> Any:
        t = meshes[r]
        op = t.mailbox.open("g", seq, "fp", tuple(range(len(meshes))), "test")
        try:
            return await fns[r](Channel(t, op))
        finally:
            t.mailbox.close(op)

    async with asyncio.timeout(timeout):
        return list(await asyncio.gather(*(one(r) for r in range(len(fns)))))


async def broken(link: Any, timeout: float = 5.0) -> None:
    """Wait until ``link`` is lost (a lying peer broke it)."""
    async with asyncio.timeout(timeout):
        while link.lost is None:
            await asyncio.sleep(0.01)


async def on_comms(ts: list[TcpMesh], fn: Any, **kwargs: Any) -> list[Any]:
    """``fn(communicator)`` on every rank of ``ts`` at once (communicators made with
    ``kwargs``, closed after); the results by rank."""
    comms = [Communicator(t, **kwargs) for t in ts]
    try:
        return list(await asyncio.wait_for(asyncio.gather(*(fn(c) for c in comms)), 60))
    finally:
        for c in comms:
            await c.close()


def pattern(n: int, salt: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * 7 + salt) % 251).astype(np.uint8)


# --------------------------------------------------------------------------- the choice


async def test_ranks_on_one_host_link_over_shared_memory_and_leave_no_file() -> None:
    async with mesh(3) as ts:
        assert kinds(ts) == {"shm"}
        assert all(isinstance(link, ShmLink) for t in ts for link in t.links.values())
        assert leftovers() == []  # unlinked in the handshake, while still mapped
        link = ts[1].links[0]
        assert isinstance(link, ShmLink) and link.segment.ring == 4 * MIB


async def test_fallback_to_tcp_when_the_segment_cannot_be_opened(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The acceptor looks in another directory, as a container without shared IPC would."""
    monkeypatch.setattr(Segment, "attach", functools.partial(Segment.attach.__func__, Segment, directory=str(tmp_path)))  # type: ignore[attr-defined]
    caplog.set_level(logging.INFO, "netcoll.transport")
    async with mesh(2) as ts:
        assert kinds(ts) == {"tcp"}
        comms = [Communicator(t) for t in ts]
        ys = await asyncio.wait_for(asyncio.gather(*(c.all_reduce(np.ones(MIB, np.float32)) for c in comms)), 30)
        assert all((y == 2).all() for y in ys)
        for c in comms:
            await c.close()
    said = [r.getMessage() for r in caplog.records if "no shared memory" in r.getMessage()]
    assert any(m.startswith("rank 0: no shared memory with rank 1") and "cannot open" in m for m in said), said
    assert any(m.startswith("rank 1: no shared memory with rank 0") and "cannot open" in m for m in said), said


async def test_fallback_to_tcp_when_no_segment_can_be_made(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(shm, "make_segment", lambda ring: (None, "cannot make a segment: No space left on device"))
    caplog.set_level(logging.INFO, "netcoll.transport")
    async with mesh(3) as ts:
        assert kinds(ts) == {"tcp"}
    said = [r.getMessage() for r in caplog.records if "no shared memory" in r.getMessage()]
    assert "rank 2: no shared memory with rank 0, linking over the socket: cannot make a segment: No space" in " ".join(
        said
    ), said
    assert any(m.startswith("rank 0: no shared memory with rank 2") and "does not offer it" in m for m in said)


async def test_netcoll_transport_tcp_forces_tcp_and_makes_no_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    monkeypatch.setattr(shm, "make_segment", lambda ring: made.append(ring) or (None, "not called"))
    monkeypatch.setenv("NETCOLL_TRANSPORT", "tcp")
    async with mesh(2) as ts:
        assert kinds(ts) == {"tcp"} and made == []


async def test_netcoll_transport_shm_forces_shm_and_fails_clearly_when_impossible(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NETCOLL_TRANSPORT", "shm")
    async with mesh(2) as ts:
        assert kinds(ts) == {"shm"}
    monkeypatch.setattr(Segment, "attach", functools.partial(Segment.attach.__func__, Segment, directory=str(tmp_path)))  # type: ignore[attr-defined]
    with pytest.raises((ProtocolError, RendezvousError), match="shared memory with rank 1: cannot open"):
        async with mesh(2, LinkConfig(transport="shm")):
            pass
    monkeypatch.setattr(shm, "possible", lambda: False)
    with pytest.raises(ValueError, match="NETCOLL_TRANSPORT=shm, but this host has no /dev/shm"):
        TcpMesh(Listener(), rank=0, size=1, session="x", peers=[(LOOPBACK, 1)])
    monkeypatch.setattr(shm, "possible", lambda: True)
    monkeypatch.setattr(shm, "make_segment", lambda ring: (None, "/dev/shm is full"))
    with pytest.raises(RendezvousError, match="NETCOLL_TRANSPORT=shm, but rank 1 cannot use shared memory"):
        async with mesh(2, LinkConfig(transport="shm")):
            pass


async def test_with_tls_ranks_on_one_host_still_share_memory_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segment's name and nonce travel inside TLS; the bulk bytes never leave
    the host. ``NETCOLL_TRANSPORT=tls`` keeps every byte on TLS."""
    tls = TlsConfig(**issue(make_ca(tmp_path), tmp_path, "node"))
    async with mesh(2, tls=tls) as ts:
        assert kinds(ts) == {"shm"}
        link = ts[0].links[1]
        assert isinstance(link, ShmLink) and link.transport is not None
        assert link.transport.get_extra_info("ssl_object") is not None  # control frames: TLS
        data = pattern(3 * MIB, 7)
        got = await run(ts, [lambda ch: ch.send(1, data, step=0), lambda ch: ch.recv(0, step=0)], 0)
        assert np.array_equal(np.frombuffer(got[1], np.uint8), data)
    monkeypatch.setenv("NETCOLL_TRANSPORT", "tls")
    async with mesh(2, tls=tls) as ts:
        assert kinds(ts) == {"tls"}


# --------------------------------------------------------------------------- data


@pytest.mark.parametrize("n", [1, 1000, RING_MIN // 4 + 3, 300_000])
async def test_every_collective_is_correct_over_shared_memory(n: int) -> None:
    async with mesh(4, LinkConfig(shm_bytes=256 * KIB)) as ts:
        assert kinds(ts) == {"shm"}
        comms = [Communicator(t) for t in ts]
        size = len(comms)
        xs = [np.arange(n, dtype=np.float32) * (r + 1) for r in range(size)]
        rows = [np.stack([x + j for j in range(size)]) for x in xs]
        total = sum(xs)

        async def every(c: Communicator) -> None:
            r = c.rank
            np.testing.assert_array_equal(await c.all_reduce(xs[r]), total)
            got = await c.reduce(xs[r], root=2)
            if r == 2:
                np.testing.assert_array_equal(got, total)
            np.testing.assert_array_equal(await c.broadcast(xs[r] if r == 1 else None, root=1), xs[1])
            np.testing.assert_array_equal(await c.all_gather(xs[r]), np.stack(xs))
            got = await c.gather(xs[r], root=3)
            if r == 3:
                np.testing.assert_array_equal(got, np.stack(xs))
            np.testing.assert_array_equal(await c.scatter(rows[0] if r == 0 else None, root=0), rows[0][r])
            np.testing.assert_array_equal(await c.reduce_scatter(rows[r]), sum(rows)[r])
            np.testing.assert_array_equal(await c.all_to_all(rows[r]), np.stack([rows[j][r] for j in range(size)]))
            if r in (0, 3):
                other = 3 - r
                send = c.send(xs[r], other)
                np.testing.assert_array_equal(await c.recv(other), xs[other])
                await send
            await c.barrier()

        try:
            await asyncio.wait_for(asyncio.gather(*(every(c) for c in comms)), 60)
        finally:
            for c in comms:
                await c.close()
        if n * 4 >= RING_MIN:
            assert ts[0].link_stats()[1].bytes_sent > 0


@pytest.mark.parametrize(
    ("algo", "size"), [("ring", 3), ("tree", 3), ("doubling", 3), ("halving", 3), ("halving", 4), ("doubling", 4)]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16])
async def test_reductions_fold_straight_out_of_the_ring_with_the_same_bits(
    dtype: Any, algo: str, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """all_reduce by every algorithm, reduce by ring and by tree, and reduce_scatter
    by ring and by halving, over shared memory reduce each piece as it is read out
    of the ring (no copy into scratch first; the tree: its first child's; doubling:
    the higher rank of each pair, whose accumulator is not being sent), and the
    results have the very bits of the in-memory transport, which never folds: the
    same order of operations on every element. 3 ranks have an extra rank for
    doubling and halving; with 4, halving's reduce_scatter reduces from the input
    itself in its first round."""
    from netcoll.ops import Fold
    from tests.support.worlds import memory_world

    folded: list[int] = []
    apply = Fold.apply

    def counting(self: Fold, data: memoryview) -> None:
        folded.append(data.nbytes)
        apply(self, data)

    monkeypatch.setattr(Fold, "apply", counting)
    n = 3 * 200_000 + 1  # uneven chunks, segments of several ring pieces
    rng = np.random.default_rng(7)
    xs = [(rng.standard_normal(n) * 1000).astype(dtype) for _ in range(size)]
    rows = [np.concatenate([x, x[: -n % size]]).reshape(size, -1) for x in xs]

    async def calls(c: Communicator) -> list[np.ndarray]:
        r = c.rank
        got = [
            await c.all_reduce(xs[r], algorithm=algo),
            await c.all_reduce(xs[r].copy(), out=None, algorithm=algo),
        ]
        if algo in ("ring", "halving"):  # (the tree's folds are counted alone)
            got.append(await c.reduce_scatter(rows[r], algorithm=algo))
        if algo in ("ring", "tree"):
            red = await c.reduce(xs[r], root=1, algorithm=algo)
            if r == 1:
                got.append(red)
        return got

    _, mem = memory_world(size)
    expected = await asyncio.gather(*(calls(c) for c in mem))
    assert folded == []  # in memory: no ring, nothing folded
    async with mesh(size, LinkConfig(shm_bytes=256 * KIB)) as ts:
        assert kinds(ts) == {"shm"}
        got = await on_comms(ts, calls, segment_bytes=256 * KIB)
    for mine, theirs in zip(got, expected, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert folded and max(folded) == 64 * KIB  # a quarter ring at a time


async def test_messages_larger_than_the_ring_and_the_window_go_by_rendezvous_into_place() -> None:
    """8 MiB through a 64 KiB ring with a 1 MiB window, sent before the receive is
    posted: RTS, CTS, then 512 pieces straight into the posted buffer."""
    async with mesh(2, LinkConfig(window=MIB, shm_bytes=64 * KIB)) as ts:
        data = pattern(8 * MIB, 1)
        out = np.zeros_like(data)

        async def sender(ch: Channel) -> None:
            await ch.send(1, data, step=0)

        async def receiver(ch: Channel) -> memoryview:
            await asyncio.sleep(0.2)  # the sender gets there first
            return await ch.recv(0, step=0, out=out)

        _, got = await run(ts, [sender, receiver], 0)
        assert np.shares_memory(np.frombuffer(got, np.uint8), out) and np.array_equal(out, data)
        s0, s1 = ts[0].link_stats()[1], ts[1].link_stats()[0]
        assert s0.kind == "shm" and s0.rendezvous == 1 and s0.bytes_sent == s1.bytes_received == 8 * MIB
        assert s1.unexpected_peak == 0


async def test_the_pieces_placed_together_go_out_in_one_write_and_come_back_in_one_credit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 1 MiB message through an empty 1 MiB ring is four quarter-ring pieces:
    their headers leave in one socket write (one wake-up of the reader, not
    four), and the reader gives the space back in one CREDIT, not one per quarter.
    (Without lanes: through them, the headers and the CREDIT need no write at all.)"""
    monkeypatch.setenv("NETCOLL_SHM_LANE", "0")
    async with mesh(2, LinkConfig(window=16 * MIB, shm_bytes=MIB)) as ts:
        link0, link1 = ts[0].links[1], ts[1].links[0]
        assert isinstance(link0, ShmLink) and isinstance(link1, ShmLink)
        batches: list[int] = []
        credits: list[Any] = []
        write_headers = link0.proto.write_headers
        emit = link1._emit

        def counting_write(kind: Kind, headers: list[dict[str, Any]]) -> None:
            batches.append(len(headers))
            write_headers(kind, headers)

        def counting_emit(kind: Kind, header: dict[str, Any]) -> None:
            if kind is Kind.CREDIT and "z" in header:
                credits.append(header["z"])
            emit(kind, header)

        monkeypatch.setattr(link0.proto, "write_headers", counting_write)
        monkeypatch.setattr(link1, "_emit", counting_emit)
        data = pattern(MIB, 3)
        out = np.zeros_like(data)

        async def sender(ch: Channel) -> None:
            await ch.send(1, data, step=0)

        async def receiver(ch: Channel) -> memoryview:
            return await ch.recv(0, step=0, out=out)

        await run(ts, [sender, receiver], 0)
        assert np.array_equal(out, data)
        assert batches == [4]
        for _ in range(3):
            await asyncio.sleep(0)  # the report goes after the frames of its read
        assert credits == [MIB]


async def test_held_messages_and_a_burst_of_concurrent_sends_arrive_whole() -> None:
    """Eager messages of every size, sent at once (the ring lock keeps each one's
    pieces together), received in reverse order: held, then copied out."""
    sizes = [3, RING_MIN - 1, RING_MIN, 100_000, 700_000, 5, 2 * MIB + 1, RING_MIN + 1]
    async with mesh(2, LinkConfig(window=16 * MIB, shm_bytes=128 * KIB)) as ts:

        async def sender(ch: Channel) -> None:
            await asyncio.gather(*(ch.send(1, pattern(n, k), step=0, chunk=k) for k, n in enumerate(sizes)))

        async def receiver(ch: Channel) -> list[bool]:
            await until(lambda: ts[1].link_stats()[0].unexpected_bytes == sum(sizes))  # every one held first
            got = [await ch.recv(0, step=0, chunk=k) for k in reversed(range(len(sizes)))][::-1]
            return [
                np.array_equal(np.frombuffer(g, np.uint8), pattern(n, k))
                for k, (g, n) in enumerate(zip(got, sizes, strict=True))
            ]

        _, ok = await run(ts, [sender, receiver], 0)
        assert all(ok), ok
        s1 = ts[1].link_stats()[0]
        assert s1.unexpected_peak == sum(sizes) and s1.unexpected_bytes == 0
        assert ts[0].link_stats()[1].credit == 16 * MIB - sum(sizes)  # < a quarter window: not given back yet


async def test_a_random_mix_through_lane_ring_and_socket_arrives_whole() -> None:
    """Messages of random sizes on either side of every threshold (the socket below
    RING_MIN, a 1 MiB lane up to 256 KiB while the peer polls it, the ring above
    and whenever the lane is full), in concurrent bursts, received in a random
    order: some posted before their message arrives, some after (held)."""
    rng = random.Random(12)
    choices = [1, 900, RING_MIN - 1, RING_MIN, 200_000, (256 << 10) - 200, (256 << 10) + 10, 600_000]
    sizes = [rng.choice(choices) for _ in range(120)]
    order = list(range(len(sizes)))
    rng.shuffle(order)
    async with mesh(2, LinkConfig(window=64 * MIB)) as ts:

        async def sender(ch: Channel) -> None:
            for burst in range(0, len(sizes), 12):
                sends = [ch.send(1, pattern(sizes[k], k), step=0, chunk=k) for k in range(burst, burst + 12)]
                await asyncio.gather(*sends)

        async def receiver(ch: Channel) -> list[int]:
            futures = {k: ch.post(0, step=0, chunk=k) for k in order[:60]}  # posted before their data
            await asyncio.sleep(0.05)
            futures.update({k: ch.post(0, step=0, chunk=k) for k in order[60:]})  # many held by now
            bad = []
            for k in order:
                payload, _ = await futures[k]
                if not np.array_equal(np.frombuffer(payload, np.uint8), pattern(sizes[k], k)):
                    bad.append(k)
            return bad

        _, bad = await run(ts, [sender, receiver], 0, timeout=60)
        assert bad == []
        a = ts[0].links[1]
        assert isinstance(a, ShmLink) and a.stats().bytes_sent == sum(sizes)
        if spin_selector(asyncio.get_running_loop()) is not None:  # the peer polls: some went by the lane
            assert 0 < a.lane_sent < len(sizes)


async def test_a_cancelled_send_finishes_with_a_copy_of_its_rest() -> None:
    """Cancelled while it waits for ring space, a send lets its caller reuse the
    buffer at once; the receiver still gets the bytes as they were."""
    async with mesh(2, LinkConfig(shm_bytes=64 * KIB)) as ts:
        data = pattern(MIB, 3)
        src = data.copy()
        out = np.zeros_like(data)

        async def sender(ch: Channel) -> None:
            task = asyncio.ensure_future(ch.send(1, src, step=0))
            await asyncio.sleep(0)  # it wrote what fits in the ring and waits for room
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            src[:] = 0  # the caller's buffer is its own again

        async def receiver(ch: Channel) -> None:
            await ch.recv(0, step=0, out=out)

        await run(ts, [sender, receiver], 0)
        assert np.array_equal(out, data)
        followup = pattern(300_000, 4)  # the link carries on
        got = await run(ts, [lambda ch: ch.send(1, followup, step=0), lambda ch: ch.recv(0, step=0)], 1)
        assert np.array_equal(np.frombuffer(got[1], np.uint8), followup)


async def test_a_receive_that_ends_mid_message_gets_no_more_bytes_and_the_link_carries_on() -> None:
    """The receiver's operation closes while the pieces of a message arrive: the
    rest is read from the ring and dropped (its buffer is the caller's again)."""
    async with mesh(2, LinkConfig(shm_bytes=64 * KIB)) as ts:
        link = ts[1].links[0]
        assert isinstance(link, ShmLink)
        data = pattern(2 * MIB, 5)
        out = np.zeros_like(data)
        ops = [t.mailbox.open("g", 0, "fp", (0, 1), "test") for t in ts]
        recv = Channel(ts[1], ops[1]).post(0, step=0, out=out)
        send = asyncio.ensure_future(Channel(ts[0], ops[0]).send(1, data, step=0))
        async with asyncio.timeout(10):
            while link._in is None or link._in.got < 64 * KIB:
                await asyncio.sleep(0)
            got = link._in.got
            ts[1].mailbox.close(ops[1])  # ends the receive: its buffer is the caller's again
            assert recv.done() and link._in.target is None
            await send
            while link._in is not None:
                await asyncio.sleep(0.001)
        assert np.array_equal(out[:got], data[:got]) and not out[got:].any()
        ts[0].mailbox.close(ops[0])
        assert link.stats().unexpected_bytes == 0
        followup = pattern(300_000, 6)
        res = await run(ts, [lambda ch: ch.send(1, followup, step=0), lambda ch: ch.recv(0, step=0)], 1)
        assert np.array_equal(np.frombuffer(res[1], np.uint8), followup)


# --------------------------------------------------------------------------- a lying peer


@pytest.mark.parametrize(
    ("header", "why"),
    [
        ({"z": [1 << 40, 100], "zn": 100}, "ring piece at"),
        ({"z": [0, 300 * KIB], "zn": 300 * KIB}, "outside the"),
        ({"z": [0, 100], "zn": 50}, "more than the 50 bytes"),
        ({"z": [0, 100]}, "belongs to no message"),
        ({"z": "x", "zn": 1}, "malformed ring piece"),
        ({"z": [0, 100], "zn": True}, "malformed ring message length"),
    ],
)
async def test_bad_ring_references_break_the_link_with_a_protocol_error(header: dict[str, Any], why: str) -> None:
    async with mesh(2, LinkConfig(shm_bytes=256 * KIB)) as ts:
        liar, victim = ts[1].links[0], ts[0].links[1]
        assert isinstance(liar, ShmLink) and isinstance(victim, ShmLink)
        liar.proto.write(Kind.DATA, {"g": "g", "q": 0, "s": 0, "c": 0, "f": "fp", **header})
        await broken(victim)
        assert isinstance(victim.lost, ProtocolError) and why in str(victim.lost), victim.lost
        assert 1 in ts[0].mailbox.dead


async def test_a_ring_credit_beyond_what_was_sent_breaks_the_link() -> None:
    async with mesh(2) as ts:
        liar, victim = ts[1].links[0], ts[0].links[1]
        assert isinstance(liar, ShmLink)
        liar.proto.write(Kind.CREDIT, {"n": 0, "z": 4096})
        await broken(victim)
        assert isinstance(victim.lost, ProtocolError) and "ring position 4096" in str(victim.lost)
