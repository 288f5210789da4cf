"""Direct DATA on shared-memory links (``netcoll/links/cma.py``): a large send of an
operation that only moves data is read by the peer straight out of the sender's
memory (one copy); reductions, small sends, ``NETCOLL_SHM_CMA=0`` and peers this
side cannot read use the ring. A peer lying about where its data is breaks the link."""

from __future__ import annotations

import asyncio
import errno
import random
from typing import Any

import numpy as np
import pytest

from netcoll.comm import Communicator
from netcoll.errors import ProtocolError
from netcoll.links import cma, shm
from netcoll.links.factory import LinkConfig
from netcoll.links.shm import ShmLink
from netcoll.mesh.channel import Channel
from netcoll.mesh.tcpmesh import TcpMesh
from netcoll.operation import state
from netcoll.wire import Kind
from tests.links.test_shm_links import broken, kinds, leftovers, mesh, on_comms, pattern
from tests.support.waiting import until

pytestmark = [
    pytest.mark.tcp,
    pytest.mark.skipif(not shm.possible() or not cma.enabled(), reason="no /dev/shm or no process_vm_readv here"),
]

MIB = 1 << 20


@pytest.fixture(autouse=True)
def no_leftovers() -> Any:
    assert leftovers() == []
    yield
    assert leftovers() == []


@pytest.fixture(autouse=True)
def lend_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lend whenever the peer reads us: by default a rank lends only while its host's
    ranks outnumber its cores (tested below), which these meshes may not."""
    monkeypatch.setenv("NETCOLL_SHM_CMA", "1")


async def exchange(ts: list[TcpMesh], name: str, data: np.ndarray, *, late: bool = False) -> np.ndarray:
    """Rank 0 sends ``data`` to rank 1 in an operation called ``name``; rank 1's
    receive is posted into a buffer (``late``: only after the data arrived, so it is held)."""
    ops = [t.mailbox.open("g", 0, "fp", (0, 1), name) for t in ts]
    out = np.zeros_like(data)
    try:

        async def receive() -> None:
            if late:
                await asyncio.sleep(0.2)
                got = await Channel(ts[1], ops[1]).recv(0, step=0)
                out[:] = np.frombuffer(got, data.dtype)
            else:
                await Channel(ts[1], ops[1]).recv(0, step=0, out=out)

        async with asyncio.timeout(30):
            await asyncio.gather(Channel(ts[0], ops[0]).send(1, data, step=0), receive())
    finally:
        for t, op in zip(ts, ops, strict=True):
            t.mailbox.close(op)
    return out


def direct(ts: list[TcpMesh]) -> tuple[int, int]:
    return ts[0].link_stats()[1].direct_sent, ts[1].link_stats()[0].direct_received


@pytest.mark.parametrize("late", [False, True])
async def test_a_large_send_that_only_moves_data_is_read_in_place(late: bool) -> None:
    """4 MiB of a broadcast: read by the receiver out of the sender's memory into
    the posted buffer (or a held one, when posted late), once; counted as direct."""
    async with mesh(2) as ts:
        assert kinds(ts) == {"shm"}
        data = pattern(4 * MIB, 1)
        assert np.array_equal(await exchange(ts, "broadcast", data, late=late), data)
        assert direct(ts) == (1, 1)
        s0, s1 = ts[0].link_stats()[1], ts[1].link_stats()[0]
        assert s0.bytes_sent == s1.bytes_received == 4 * MIB
        assert s1.unexpected_peak == (4 * MIB if late else 0) and s1.unexpected_bytes == 0
        assert s1.direct_held == (1 if late else 0)  # late: posted after the wait (cma.post_wait)


async def test_a_send_larger_than_the_window_is_cleared_first_then_read_in_place() -> None:
    async with mesh(2, LinkConfig(window=MIB)) as ts:
        data = pattern(8 * MIB, 2)
        assert np.array_equal(await exchange(ts, "all_gather", data, late=True), data)
        assert direct(ts) == (1, 1) and ts[0].link_stats()[1].rendezvous == 1


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("all_reduce", 4 * MIB),
        ("reduce_scatter", 4 * MIB),
        ("broadcast", cma.DIRECT_MIN - 8),
        ("send", cma.DIRECT_MAX + 8),
    ],
)
async def test_reductions_small_and_huge_sends_go_through_the_ring(name: str, size: int) -> None:
    async with mesh(2) as ts:
        data = np.resize(pattern(4096, 3), size)
        assert np.array_equal(await exchange(ts, name, data), data)
        assert direct(ts) == (0, 0)


async def test_no_direct_data_when_turned_off_or_the_peer_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """``NETCOLL_SHM_CMA=0``: no identity, the ring. A peer whose memory this side
    cannot read (the probe fails: another PID namespace, ptrace rules) is never told
    to send direct, and uses the ring too."""
    data = pattern(4 * MIB, 4)
    monkeypatch.setenv("NETCOLL_SHM_CMA", "0")
    async with mesh(2) as ts:
        assert all(isinstance(link, ShmLink) and link.segment.identity is None for t in ts for link in t.links.values())
        assert np.array_equal(await exchange(ts, "broadcast", data), data)
        assert direct(ts) == (0, 0)
    monkeypatch.delenv("NETCOLL_SHM_CMA")

    def refused(pid: int, remote: int, into: memoryview) -> None:
        raise OSError(errno.EPERM, "not permitted")

    monkeypatch.setattr(cma, "read", refused)
    async with mesh(2) as ts:
        assert np.array_equal(await exchange(ts, "broadcast", data), data)
        assert direct(ts) == (0, 0)


async def test_a_cancelled_lent_send_returns_at_once_and_the_link_carries_on() -> None:
    """Cancelled while the peer has not read it yet, a direct send raises at once; the
    buffer stays referenced until the peer has read it, and the link carries on."""
    async with mesh(2) as ts:
        data = pattern(4 * MIB, 5)
        src = data.copy()
        ops = [t.mailbox.open("g", 0, "fp", (0, 1), "broadcast") for t in ts]
        link = ts[0].links[1]
        assert isinstance(link, ShmLink)
        send = asyncio.ensure_future(Channel(ts[0], ops[0]).send(1, src, step=0))
        await asyncio.sleep(0)  # announced; the peer has not read it (this loop runs both)
        assert link._direct_done is not None and not send.done()
        send.cancel()
        with pytest.raises(asyncio.CancelledError):
            await send
        out = np.zeros_like(data)
        async with asyncio.timeout(10):
            await Channel(ts[1], ops[1]).recv(0, step=0, out=out)
            while link._direct_done is not None:
                await asyncio.sleep(0.001)
        assert np.array_equal(out, data)
        for t, op in zip(ts, ops, strict=True):
            t.mailbox.close(op)
        again = pattern(2 * MIB, 6)
        got = await exchange_seq(ts, 1, again)
        assert np.array_equal(got, again) and direct(ts) == (2, 2)


def wait_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """Direct DATA waits (almost) as long as it takes for its receive to be posted."""
    monkeypatch.setattr(cma, "post_wait", lambda n: 30.0)


async def test_direct_data_that_arrives_first_waits_for_its_receive_and_lands_in_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its receive not posted yet, direct DATA is not read into a buffer of its own (to be
    copied again later): it waits, and is read straight into the buffer posted then."""
    wait_long(monkeypatch)
    async with mesh(2) as ts:
        data = pattern(4 * MIB, 11)
        ops = [t.mailbox.open("g", 0, "fp", (0, 1), "all_gather") for t in ts]
        receiver = ts[1].links[0]
        assert isinstance(receiver, ShmLink)
        send = asyncio.ensure_future(Channel(ts[0], ops[0]).send(1, data, step=0))
        async with asyncio.timeout(10):
            while receiver._waiting is None:
                await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        assert not send.done() and receiver.direct_received == 0
        out = np.zeros_like(data)
        async with asyncio.timeout(10):
            await Channel(ts[1], ops[1]).recv(0, step=0, out=out)
            await send
        assert np.array_equal(out, data)
        s1 = ts[1].link_stats()[0]
        assert (s1.direct_received, s1.direct_held, s1.unexpected_peak) == (1, 0, 0)
        for t, op in zip(ts, ops, strict=True):
            t.mailbox.close(op)


async def test_direct_data_never_asked_for_is_read_when_its_operation_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver's operation ends without posting the receive: the waiting direct DATA
    is read then (and dropped, as late DATA is), the lent send returns, the link carries on."""
    wait_long(monkeypatch)
    async with mesh(2) as ts:
        ops = [t.mailbox.open("g", 0, "fp", (0, 1), "broadcast") for t in ts]
        receiver = ts[1].links[0]
        assert isinstance(receiver, ShmLink)
        send = asyncio.ensure_future(Channel(ts[0], ops[0]).send(1, pattern(2 * MIB, 12), step=0))
        await until(lambda: receiver._waiting is not None)  # the direct DATA arrived and waits
        assert not send.done()
        ts[1].mailbox.close(ops[1])  # never posted: the operation ends
        async with asyncio.timeout(5):
            await send
        ts[0].mailbox.close(ops[0])
        s1 = ts[1].link_stats()[0]
        assert (s1.direct_received, s1.direct_held, s1.unexpected_bytes) == (1, 1, 0)
        again = pattern(3 * MIB, 13)
        assert np.array_equal(await exchange_seq(ts, 1, again), again)
        assert direct(ts) == (2, 2)


async def test_data_behind_unread_direct_data_breaks_the_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sender's link is locked until its direct DATA is read: DATA behind it is a lie."""
    wait_long(monkeypatch)
    async with mesh(2) as ts:
        liar, victim = ts[1].links[0], ts[0].links[1]
        assert isinstance(liar, ShmLink) and isinstance(victim, ShmLink)
        liar.proto.write(Kind.DATA, {"g": "g", "q": 0, "s": 0, "c": 0, "f": "fp", "zv": [4096, 2 * MIB]})
        liar.proto.write(Kind.DATA, {"g": "g", "q": 0, "s": 1, "c": 0, "f": "fp"}, memoryview(b"abcd"))
        await broken(victim)
        assert isinstance(victim.lost, ProtocolError) and "not been read yet" in str(victim.lost), victim.lost


async def test_a_link_lost_while_direct_data_waits_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    wait_long(monkeypatch)
    async with mesh(2) as ts:
        reads: list[Any] = []
        monkeypatch.setattr(cma, "read", lambda *args: reads.append(args))
        liar, victim = ts[1].links[0], ts[0].links[1]
        assert isinstance(liar, ShmLink) and isinstance(victim, ShmLink)
        liar.proto.write(Kind.DATA, {"g": "g", "q": 0, "s": 0, "c": 0, "f": "fp", "zv": [4096, 2 * MIB]})
        async with asyncio.timeout(10):
            while victim._waiting is None:
                await asyncio.sleep(0.005)
        assert victim.mailbox.early_rts  # (its operation is not open here: it waits for that)
        liar.proto.abort()
        await broken(victim)
        await asyncio.sleep(0.05)
        assert not isinstance(victim.lost, ProtocolError), victim.lost
        assert (victim._waiting, victim._wait_timer, reads) == (None, None, [])
        assert victim.direct_received == 0 and not victim.mailbox.early_rts  # nothing left behind


async def exchange_seq(ts: list[TcpMesh], seq: int, data: np.ndarray) -> np.ndarray:
    ops = [t.mailbox.open("g", seq, "fp", (0, 1), "broadcast") for t in ts]
    out = np.zeros_like(data)
    try:
        async with asyncio.timeout(30):
            await asyncio.gather(
                Channel(ts[0], ops[0]).send(1, data, step=0), Channel(ts[1], ops[1]).recv(0, step=0, out=out)
            )
    finally:
        for t, op in zip(ts, ops, strict=True):
            t.mailbox.close(op)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
async def test_lent_reductions_fold_a_scratch_piece_at_a_time_with_the_same_bits(
    dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No reduction lends its sends, but a peer may (the protocol allows it): a direct
    payload posted with a fold is read a cache-sized piece at a time and reduced, with
    the bits of the in-memory transport (which never folds)."""
    from netcoll.ops import Fold
    from tests.support.worlds import memory_world

    folded: list[int] = []
    apply = Fold.apply

    def counting(self: Fold, data: memoryview) -> None:
        folded.append(data.nbytes)
        apply(self, data)

    n = 3 * (3 * MIB // 8) + 5  # 3 ranks, chunks of over 1 MiB
    rng = np.random.default_rng(8)
    xs = [(rng.standard_normal(n) * 1000).astype(dtype) for _ in range(3)]

    async def call(c: Communicator) -> np.ndarray:
        got: np.ndarray = await c.all_reduce(xs[c.rank], algorithm="ring")
        return got

    _, mem = memory_world(3)
    expected = await asyncio.gather(*(call(c) for c in mem))
    monkeypatch.setattr(state, "RING_ONLY", frozenset())
    monkeypatch.setattr(Fold, "apply", counting)
    async with mesh(3) as ts:
        got = await on_comms(ts, call, segment_bytes=8 * MIB)
        assert sum(s.direct_received for t in ts for s in t.link_stats().values()) > 0
    for a, b in zip(got, expected, strict=True):
        assert a.tobytes() == b.tobytes()
    assert max(folded) == cma.FOLD_PIECE


async def test_the_ring_all_reduce_lends_its_sends_and_folds_what_it_is_lent() -> None:
    """The ring all_reduce lends every send (``Channel.lend_from(0)``): a chunk it sends is
    not written again before a later step receives it. One direct message per rank and step;
    the reduce-scatter half's are folded a scratch piece at a time. Same bits as never lending."""
    from tests.support.worlds import memory_world

    P, n = 3, 3 * (3 * MIB // 8) + 5  # chunks of over 1 MiB, one segment each
    rng = np.random.default_rng(9)
    xs = [(rng.standard_normal(n) * 1000).astype(np.float64) for _ in range(P)]

    async def call(c: Communicator) -> np.ndarray:
        got: np.ndarray = await c.all_reduce(xs[c.rank], algorithm="ring")
        return got

    _, mem = memory_world(P)
    expected = await asyncio.gather(*(call(c) for c in mem))
    async with mesh(P) as ts:
        got = await on_comms(ts, call, segment_bytes=8 * MIB)
        received = [s.direct_received for t in ts for s in t.link_stats().values()]
        assert sum(received) == P * 2 * (P - 1), received
    for a, b in zip(got, expected, strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize(
    ("zv", "why"),
    [
        ("x", "malformed direct DATA location"),
        ([1, True], "malformed direct DATA location"),
        ([0, 100], "out of range"),
        ([(1 << 64) - 10, 100], "out of range"),
        ([4096, -1], "out of range"),
        ([4096, 100], "cannot read rank 1's direct DATA"),  # nothing is mapped at 4 KiB
    ],
)
async def test_bad_direct_data_breaks_the_link_with_a_protocol_error(zv: Any, why: str) -> None:
    async with mesh(2) as ts:
        liar, victim = ts[1].links[0], ts[0].links[1]
        assert isinstance(liar, ShmLink) and isinstance(victim, ShmLink)
        liar.proto.write(Kind.DATA, {"g": "g", "q": 0, "s": 0, "c": 0, "f": "fp", "zv": zv})
        await broken(victim)
        assert isinstance(victim.lost, ProtocolError) and why in str(victim.lost), victim.lost


async def test_a_read_done_for_nothing_lent_breaks_the_link() -> None:
    async with mesh(2) as ts:
        liar, victim = ts[1].links[0], ts[0].links[1]
        liar.proto.write(Kind.CREDIT, {"n": 0, "zd": 1})
        await broken(victim)
        assert isinstance(victim.lost, ProtocolError) and "no direct DATA" in str(victim.lost)


async def test_every_collective_that_moves_data_is_correct_with_direct_data() -> None:
    """4 ranks, 2.4 MB per rank: broadcast, all_gather, gather, scatter, all_to_all
    and send/recv lend their sends (read in place, counted); the reductions in
    between copy into the ring; every result is exact."""
    n = 600_000
    async with mesh(4) as ts:
        assert kinds(ts) == {"shm"}
        xs = [np.arange(n, dtype=np.float32) * (r + 1) for r in range(4)]
        rows = [np.stack([x + j for j in range(4)]) for x in xs]

        async def every(c: Communicator) -> None:
            r = c.rank
            np.testing.assert_array_equal(await c.broadcast(xs[r] if r == 1 else None, root=1), xs[1])
            np.testing.assert_array_equal(await c.all_reduce(xs[r]), sum(xs))
            np.testing.assert_array_equal(await c.all_gather(xs[r]), np.stack(xs))
            got = await c.gather(xs[r], root=3)
            if r == 3:
                np.testing.assert_array_equal(got, np.stack(xs))
            np.testing.assert_array_equal(await c.scatter(rows[0] if r == 0 else None, root=0), rows[0][r])
            np.testing.assert_array_equal(await c.all_to_all(rows[r]), np.stack([rows[j][r] for j in range(4)]))
            if r in (0, 3):
                send = c.send(xs[r], 3 - r)
                np.testing.assert_array_equal(await c.recv(3 - r), xs[3 - r])
                await send

        await on_comms(ts, every)
        sent = sum(s.direct_sent for t in ts for s in t.link_stats().values())
        received = sum(s.direct_received for t in ts for s in t.link_stats().values())
        assert sent == received > 0


@pytest.mark.parametrize("name", ["broadcast", "scatter", "scatter_out", "all_to_all", "all_to_all_pairwise"])
async def test_a_rank_lends_to_several_peers_at_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The root of a scatter, a tree broadcast's root with two children and every rank of the
    linear all_to_all lend their segments to every peer at once (``send_each``), so the
    peers read at the same time; over links that do not lend they send one after the other.
    The pairwise all_to_all, its every link lending, sends at once too (the same messages)."""
    in_flight: dict[int, int] = {}  # sending rank's mailbox -> its lent sends not read yet
    most: dict[int, int] = {}
    send_direct = ShmLink._send_direct

    async def counting(self: ShmLink, header: dict[str, Any], payload: memoryview) -> None:
        rank = self.mailbox.rank
        in_flight[rank] = in_flight.get(rank, 0) + 1
        most[rank] = max(most.get(rank, 0), in_flight[rank])
        try:
            await send_direct(self, header, payload)
        finally:
            in_flight[rank] -= 1

    monkeypatch.setattr(ShmLink, "_send_direct", counting)
    block = 2 * MIB
    rows = pattern(4 * block, 14).reshape(4, block)

    async def call(c: Communicator) -> np.ndarray:
        if name.startswith("all_to_all"):
            algo = "pairwise" if name.endswith("pairwise") else "linear"
            got: np.ndarray = await c.all_to_all(rows + c.rank, algorithm=algo)
        elif name.startswith("scatter"):
            out = np.empty(block, np.uint8) if name == "scatter_out" else None
            got = await c.scatter(rows if c.rank == 0 else None, root=0, out=out)
        else:
            got = await c.broadcast(rows[0] if c.rank == 0 else None, root=0, algorithm="tree")
        return got

    async with mesh(4) as ts:
        got = await on_comms(ts, call)
    for r, x in enumerate(got):
        if name.startswith("all_to_all"):
            assert np.array_equal(x, np.stack([rows[r] + k for k in range(4)]))
        else:
            assert np.array_equal(x, rows[0] if name == "broadcast" else rows[r])
    # the tree: 0 -> 1, 2; 2 -> 3. scatter: 0 -> 1, 2, 3. all_to_all: everyone -> the other three
    every = dict.fromkeys(range(4), 3)
    assert most == {"broadcast": {0: 2, 2: 1}, "all_to_all": every, "all_to_all_pairwise": every}.get(name, {0: 3})


def test_a_bad_netcoll_shm_cma_fails_before_any_link_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_SHM_CMA", "yes")
    with pytest.raises(ValueError, match="NETCOLL_SHM_CMA must be 0, 1 or auto, got 'yes'"):
        LinkConfig.from_env()
    monkeypatch.setenv("NETCOLL_SHM_CMA", "0")
    assert not cma.enabled() and not cma.lends(64)


@pytest.mark.parametrize(("cores", "lent"), [(2, False), (1, True)])
async def test_by_default_a_rank_lends_only_while_its_hosts_ranks_outnumber_its_cores(
    cores: int, lent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks on two cores keep the ring (its two copies run at once, one per core);
    on one core they lend. Either way each still reads what the other lends it."""
    monkeypatch.delenv("NETCOLL_SHM_CMA")
    monkeypatch.setattr(cma, "usable_cores", lambda: cores)
    async with mesh(2) as ts:
        links = [t.links[1 - r] for r, t in enumerate(ts)]
        assert all(isinstance(link, ShmLink) and link.lending is lent for link in links)
        assert all(link.segment.identity and link.segment.identity.peer_reads() for link in links)  # type: ignore[attr-defined]
        data = pattern(4 * MIB, 7)
        assert np.array_equal(await exchange(ts, "broadcast", data), data)
        assert direct(ts) == ((1, 1) if lent else (0, 0))


async def test_a_random_mix_of_direct_ring_lane_and_socket_messages_arrives_whole() -> None:
    """Messages on either side of every threshold (socket, lane, ring, direct from 1 MiB),
    in concurrent bursts both ways, received in a random order, some posted before their
    data, some held: every one arrives whole, and the links hold (a direct header that
    overtook a ring message part-way would break them)."""
    rng = random.Random(21)
    choices = [1, 900, shm.RING_MIN - 1, shm.RING_MIN, 300_000, cma.DIRECT_MIN - 1, cma.DIRECT_MIN, 3 * MIB + 5]
    sizes = [rng.choice(choices) for _ in range(48)]
    order = list(range(len(sizes)))
    rng.shuffle(order)
    async with mesh(2, LinkConfig(window=64 * MIB)) as ts:
        ops = [t.mailbox.open("g", 0, "fp", (0, 1), "all_to_all") for t in ts]
        chans = [Channel(t, op) for t, op in zip(ts, ops, strict=True)]

        async def sender(me: int) -> None:
            for burst in range(0, len(sizes), 8):
                sends = [
                    chans[me].send(1 - me, np.resize(pattern(4096, k + me), sizes[k]), step=me, chunk=k)
                    for k in range(burst, burst + 8)
                ]
                await asyncio.gather(*sends)

        async def receiver(me: int) -> list[int]:
            src = 1 - me
            futures = {k: chans[me].post(src, step=src, chunk=k) for k in order[:24]}
            await asyncio.sleep(0.05)
            futures.update({k: chans[me].post(src, step=src, chunk=k) for k in order[24:]})
            bad = []
            for k in order:
                payload, _ = await futures[k]
                if not np.array_equal(np.frombuffer(payload, np.uint8), np.resize(pattern(4096, k + src), sizes[k])):
                    bad.append(k)
            return bad

        try:
            async with asyncio.timeout(60):
                got = await asyncio.gather(sender(0), sender(1), receiver(0), receiver(1))
        finally:
            for t, op in zip(ts, ops, strict=True):
                t.mailbox.close(op)
        assert got[2:] == [[], []]
        lent = sum(1 for n in sizes if n >= cma.DIRECT_MIN)
        assert direct(ts) == (lent, lent)
        assert ts[1].link_stats()[0].direct_sent == lent
