"""The zero-copy socket transport: byte integrity when the socket is full,
the buffer-ownership contract of ``writev``/``detach``/``write``, flow
control, and every way a connection ends."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from netcoll.links import dialer, readmark
from netcoll.links.listener import Listener
from netcoll.links.sockettransport import SocketTransport

BIG = 8 * 1024 * 1024  # far more than loopback socket buffers hold while the reader is paused


class Sink(asyncio.BufferedProtocol):
    """Collects every received byte; records the callbacks it gets."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.buf = bytearray(65536)
        self.transport: SocketTransport | None = None
        self.lost = asyncio.get_running_loop().create_future()
        self.eof = False
        self.events: list[str] = []
        self.waiters: list[tuple[int, asyncio.Future[None]]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.data += self.buf[:nbytes]
        for n, fut in list(self.waiters):
            if len(self.data) >= n and not fut.done():
                fut.set_result(None)

    def eof_received(self) -> bool:
        self.eof = True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    async def until(self, n: int, timeout: float = 20.0) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append((n, fut))
        self.buffer_updated(0)
        await asyncio.wait_for(fut, timeout)


async def pair(small_buffers: bool = True) -> tuple[Listener, Sink, Sink]:
    accepted: list[Sink] = []
    got = asyncio.Event()

    def factory() -> Sink:
        s = Sink()
        accepted.append(s)
        got.set()
        return s

    listener = Listener(factory)
    host, port = listener.start("127.0.0.1", 0)
    transport, client = await dialer.connect(host, port, Sink)
    await asyncio.wait_for(got.wait(), 5)
    server = accepted[0]
    if small_buffers:
        for t in (transport, server.transport):
            sock = t.get_extra_info("socket")  # type: ignore[union-attr]
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    return listener, client, server  # type: ignore[return-value]


def pattern(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


async def test_writev_sends_without_copying_and_completes_when_the_kernel_has_it() -> None:
    listener, client, server = await pair()
    try:
        server.transport.pause_reading()  # type: ignore[union-attr]
        head, payload = b"HEAD", pattern(BIG)
        done = client.transport.writev([head, memoryview(payload)])  # type: ignore[union-attr]
        assert done is not None  # the paused reader cannot take 8 MiB
        assert client.transport.get_write_buffer_size() > 0  # type: ignore[union-attr]
        await asyncio.sleep(0.05)
        assert not done.done()
        server.transport.resume_reading()  # type: ignore[union-attr]
        await asyncio.wait_for(done, 20)
        await server.until(BIG + 4)
        assert bytes(server.data) == head + payload.tobytes()
        assert client.transport.get_write_buffer_size() == 0  # type: ignore[union-attr]
    finally:
        listener.close()
        client.transport.abort()  # type: ignore[union-attr]


async def test_small_writev_completes_at_once() -> None:
    listener, client, server = await pair(small_buffers=False)
    try:
        assert client.transport.writev([b"ab", memoryview(b"cd"), b""]) is None  # type: ignore[union-attr]
        assert client.transport.writev([]) is None  # type: ignore[union-attr]
        await server.until(4)
        assert bytes(server.data) == b"abcd"
    finally:
        listener.close()
        client.transport.abort()  # type: ignore[union-attr]


async def test_detach_copies_the_unsent_rest_so_later_changes_never_reach_the_wire() -> None:
    listener, client, server = await pair()
    try:
        server.transport.pause_reading()  # type: ignore[union-attr]
        first = pattern(BIG, 1)
        client.transport.write(b"before")  # type: ignore[union-attr]
        payload = pattern(BIG, 2)
        expected = b"before" + b"H" + payload.tobytes()
        done = client.transport.writev([b"H", memoryview(payload)])  # type: ignore[union-attr]
        assert done is not None
        client.transport.detach(done)  # type: ignore[union-attr]
        payload[:] = 0  # the caller takes its buffer back
        later = client.transport.writev([memoryview(first)])  # type: ignore[union-attr]
        assert later is not None
        server.transport.resume_reading()  # type: ignore[union-attr]
        await asyncio.wait_for(asyncio.gather(done, later), 20)
        await server.until(len(expected) + BIG)
        assert bytes(server.data) == expected + first.tobytes()
    finally:
        listener.close()
        client.transport.abort()  # type: ignore[union-attr]


async def test_write_copies_what_the_socket_cannot_take() -> None:
    listener, client, server = await pair()
    try:
        server.transport.pause_reading()  # type: ignore[union-attr]
        buf = bytearray(pattern(BIG, 3).tobytes())
        expected = bytes(buf)
        client.transport.write(buf)  # type: ignore[union-attr]
        buf[:] = bytes(len(buf))  # write() promised the caller its buffer back at once
        server.transport.resume_reading()  # type: ignore[union-attr]
        await server.until(BIG)
        assert bytes(server.data) == expected
    finally:
        listener.close()
        client.transport.abort()  # type: ignore[union-attr]


async def test_flow_control_pauses_and_resumes_the_protocol() -> None:
    listener, client, server = await pair()
    try:
        t = client.transport
        t.set_write_buffer_limits(high=1024)  # type: ignore[union-attr]
        assert t.get_write_buffer_limits() == (256, 1024)  # type: ignore[union-attr]
        with pytest.raises(ValueError):
            t.set_write_buffer_limits(high=1, low=2)  # type: ignore[union-attr]
        server.transport.pause_reading()  # type: ignore[union-attr]
        t.write(pattern(BIG).tobytes())  # type: ignore[union-attr]
        assert client.events == ["pause"]
        server.transport.resume_reading()  # type: ignore[union-attr]
        await server.until(BIG)
        for _ in range(100):
            if client.events == ["pause", "resume"]:
                break
            await asyncio.sleep(0.01)
        assert client.events == ["pause", "resume"]
    finally:
        listener.close()
        client.transport.abort()  # type: ignore[union-attr]


async def test_close_sends_everything_queued_first() -> None:
    listener, client, server = await pair()
    try:
        server.transport.pause_reading()  # type: ignore[union-attr]
        payload = pattern(BIG, 4)
        done = client.transport.writev([memoryview(payload)])  # type: ignore[union-attr]
        client.transport.close()  # type: ignore[union-attr]
        assert client.transport.is_closing()  # type: ignore[union-attr]
        with pytest.raises(ConnectionResetError):
            client.transport.write(b"x")  # type: ignore[union-attr]
        with pytest.raises(ConnectionResetError):
            client.transport.writev([b"x"])  # type: ignore[union-attr]
        server.transport.resume_reading()  # type: ignore[union-attr]
        assert await asyncio.wait_for(client.lost, 20) is None
        assert done is not None and done.done() and done.exception() is None
        assert await asyncio.wait_for(server.lost, 20) is None
        assert server.eof and bytes(server.data) == payload.tobytes()
    finally:
        listener.close()


async def test_abort_drops_the_queue_and_fails_pending_writes() -> None:
    listener, client, server = await pair()
    try:
        server.transport.pause_reading()  # type: ignore[union-attr]
        done = client.transport.writev([memoryview(pattern(BIG))])  # type: ignore[union-attr]
        assert done is not None
        client.transport.abort()  # type: ignore[union-attr]
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(done, 5)
        assert await asyncio.wait_for(client.lost, 5) is None
        assert client.transport.get_write_buffer_size() == 0  # type: ignore[union-attr]
        server.transport.resume_reading()  # type: ignore[union-attr]
        await asyncio.wait_for(server.lost, 5)  # a reset or an EOF: either way it ends
    finally:
        listener.close()


async def test_write_eof_half_closes_and_the_other_side_still_talks() -> None:
    listener, client, server = await pair(small_buffers=False)
    try:
        client.transport.write(b"bye")  # type: ignore[union-attr]
        assert client.transport.can_write_eof()  # type: ignore[union-attr]
        client.transport.write_eof()  # type: ignore[union-attr]
        client.transport.write_eof()  # type: ignore[union-attr]  # idempotent
        with pytest.raises(RuntimeError):
            client.transport.write(b"late")  # type: ignore[union-attr]
        await asyncio.wait_for(server.lost, 5)  # EOF -> eof_received() False -> closed
        assert server.eof and bytes(server.data) == b"bye"
        assert await asyncio.wait_for(client.lost, 5) is None  # its EOF reached us
        assert client.eof
    finally:
        listener.close()


async def test_peer_reset_reports_an_error() -> None:
    listener, client, server = await pair(small_buffers=False)
    try:
        sock = server.transport.get_extra_info("socket")  # type: ignore[union-attr]
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        server.transport.abort()  # type: ignore[union-attr]  # linger 0: an RST
        await asyncio.sleep(0.05)
        for _ in range(50):  # writing into a reset connection fails sooner or later
            if client.lost.done():
                break
            try:
                client.transport.write(b"x" * 65536)  # type: ignore[union-attr]
            except ConnectionResetError:
                break
            await asyncio.sleep(0.01)
        exc = await asyncio.wait_for(client.lost, 5)
        assert exc is None or isinstance(exc, ConnectionError)
    finally:
        listener.close()


async def test_extra_info_and_protocol() -> None:
    listener, client, server = await pair(small_buffers=False)
    try:
        t = client.transport
        assert t.get_extra_info("peername")[:2] == server.transport.get_extra_info("sockname")[:2]  # type: ignore[union-attr]
        assert t.get_protocol() is client  # type: ignore[union-attr]
        assert t.is_reading()  # type: ignore[union-attr]
    finally:
        listener.close()
        client.transport.abort()  # type: ignore[union-attr]


async def test_connect_refused_and_by_name() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nobody listens here now
    with pytest.raises(OSError):
        await dialer.connect("127.0.0.1", port, Sink)
    listener = Listener(Sink)
    _, port = listener.start("127.0.0.1", 0)
    try:
        transport, proto = await dialer.connect("localhost", port, Sink)
        assert transport.get_extra_info("peername")[1] == port
        transport.abort()
        await asyncio.wait_for(proto.lost, 5)  # type: ignore[attr-defined]
    finally:
        listener.close()
        listener.close()  # idempotent


async def test_release_hands_over_the_socket_only_with_nothing_queued() -> None:
    """TLS wraps a released socket: the transport lets go without telling its protocol,
    and refuses while bytes it took are unsent (they would be lost)."""
    listener, client, server = await pair()
    try:
        t = client.transport
        assert t is not None and server.transport is not None
        server.transport.pause_reading()
        assert t.writev([memoryview(pattern(BIG))]) is not None
        with pytest.raises(RuntimeError, match="bytes queued"):
            t.release()
        other = server.transport
        sock = other.release()
        assert sock.fileno() != -1  # still open: the TLS layer takes it over
        await asyncio.sleep(0)
        assert not server.lost.done()  # the protocol was not told
        sock.close()
    finally:
        listener.close()
        client.transport.abort()  # type: ignore[union-attr]


class Due(Sink):
    """A Sink that expects ``total`` bytes (as a frame's payload is due) and, at every
    read, records the socket's SO_RCVLOWAT against what was still due then."""

    def __init__(self, total: int) -> None:
        super().__init__()
        self.total = total
        self.marks: list[tuple[int, int]] = []  # (SO_RCVLOWAT, bytes due) at each read

    def bytes_due(self) -> int:
        return self.total - len(self.data)

    def get_buffer(self, sizehint: int) -> bytearray:
        sock = self.transport.get_extra_info("socket")  # type: ignore[union-attr]
        self.marks.append((sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT), self.bytes_due()))
        return self.buf


@pytest.mark.parametrize("seed", range(6))
async def test_a_reader_waits_for_what_is_due_but_never_for_more(seed: int) -> None:
    """With ``bytes_due`` the transport lets the kernel wake it only once up to 256 KiB
    of the due bytes are in (SO_RCVLOWAT), never for more than is due: a payload
    dribbled in seeded pieces and pauses (the last ones far below the mark) still
    arrives whole."""
    rng = np.random.default_rng(seed)
    total = int(rng.integers(1, 4) * readmark.MAX + rng.integers(0, 50_000))
    payload = pattern(total, seed)
    accepted: list[Due] = []

    def factory() -> Due:
        accepted.append(Due(total))
        return accepted[-1]

    listener = Listener(factory)
    host, port = listener.start("127.0.0.1", 0)
    transport, _ = await dialer.connect(host, port, Sink)
    try:
        while not accepted or accepted[0].transport is None:
            await asyncio.sleep(0.001)
        server, sent = accepted[0], 0
        while sent < total:
            k = min(total - sent, int(rng.choice([1, 700, 9_000, 40_000, 300_000])))
            transport.write(payload[sent : sent + k].tobytes())
            sent += k
            await asyncio.sleep(float(rng.choice([0, 0, 0.001, 0.004])))
        await server.until(total, timeout=20)
        assert bytes(server.data) == payload.tobytes(), f"seed {seed}"
        assert all(mark <= max(due, 1) for mark, due in server.marks), f"seed {seed}: {server.marks}"
        assert any(mark > 1 for mark, _ in server.marks), f"seed {seed}: the mark was never raised"
        assert server.marks[-1][0] <= max(server.marks[-1][1], 1)
    finally:
        listener.close()
        transport.abort()


async def test_without_bytes_due_the_mark_stays_at_one() -> None:
    listener, client, server = await pair(small_buffers=False)
    try:
        client.transport.write(pattern(1 << 20).tobytes())  # type: ignore[union-attr]
        await server.until(1 << 20)
        sock = server.transport.get_extra_info("socket")  # type: ignore[union-attr]
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
    finally:
        listener.close()
        client.transport.abort()  # type: ignore[union-attr]
