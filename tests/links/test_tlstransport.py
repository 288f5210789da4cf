"""TLS on the socket (:mod:`netcoll.links.tlstransport`): byte integrity of large
payloads and many buffers in flight through a full socket, the buffer-ownership
contract (``detach``), decrypted bytes OpenSSL holds across a paused read, the
close_notify goodbye, a peer lost mid-stream (at the transport and as
``PeerLost`` through a TLS link), a changed record, a handshake that never
comes, and a certificate of another CA still refused. Loopback only."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from netcoll import PeerLost
from netcoll.links import tlstransport
from netcoll.links.factory import LinkConfig
from netcoll.links.tlstransport import TlsTransport
from netcoll.mesh.certs import TlsConfig
from netcoll.testing.sockets import loopback_pair
from netcoll.wire import Kind
from tests.links.test_sockettransport import Sink, pattern
from tests.support.groups import tcp_mesh
from tests.support.tlsca import issue, make_ca

pytestmark = pytest.mark.tcp
BIG = 8 * 1024 * 1024  # far more than loopback socket buffers hold while the reader is paused


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsConfig]:
    d = tmp_path_factory.mktemp("pki")
    ca, other = make_ca(d, "ca"), make_ca(d, "other-ca")
    return {
        "server": TlsConfig(**issue(ca, d, "server")),
        "client": TlsConfig(**issue(ca, d, "client")),
        "stranger": TlsConfig(**issue(other, d, "stranger")),
    }


async def _sockets(small_buffers: bool) -> tuple[socket.socket, socket.socket]:
    client, server = await loopback_pair(nodelay=False)
    if small_buffers:
        for sock in (client, server):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    return client, server


@asynccontextmanager
async def tls_pair(
    pki: dict[str, TlsConfig], server_sink: Sink | None = None, *, small_buffers: bool = True
) -> AsyncIterator[tuple[Sink, Sink]]:
    """A client and a server :class:`Sink` joined by :class:`TlsTransport`\\ s."""
    raw_client, raw_server = await _sockets(small_buffers)
    client = tlstransport.wrap(raw_client, pki["client"].client_context(), server_side=False, server_hostname=None)
    server = tlstransport.wrap(raw_server, pki["server"].server_context(), server_side=True, server_hostname=None)
    try:
        await asyncio.gather(tlstransport.handshake(client, 10), tlstransport.handshake(server, 10))
        loop = asyncio.get_running_loop()
        sinks = Sink(), server_sink or Sink()
        TlsTransport(loop, client, sinks[0])
        TlsTransport(loop, server, sinks[1])
        yield sinks
    finally:
        for sink in locals().get("sinks", ()):
            if sink.transport is not None:
                sink.transport.abort()
        client.close()
        server.close()


async def test_large_payloads_and_many_buffers_in_flight_arrive_intact(pki: dict[str, TlsConfig]) -> None:
    async with tls_pair(pki) as (client, server):
        t = client.transport
        assert t is not None and server.transport is not None
        assert t.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        server.transport.pause_reading()
        big = pattern(BIG)
        parts = [pattern(100_000 + i, seed=i) for i in range(20)]
        done = [t.writev([b"HEAD", memoryview(big)])]
        for i, part in enumerate(parts):
            t.write(b"small %d" % i)  # copied: queued behind the buffers before it
            done.append(t.writev([memoryview(part)]))
        assert done[0] is not None and t.get_write_buffer_size() > 0  # the paused reader cannot take 8 MiB
        server.transport.resume_reading()
        await asyncio.wait_for(asyncio.gather(*(d for d in done if d is not None)), 30)
        expected = b"HEAD" + big.tobytes() + b"".join(b"small %d" % i + p.tobytes() for i, p in enumerate(parts))
        await server.until(len(expected))
        assert bytes(server.data) == expected
        assert t.get_write_buffer_size() == 0


async def test_detached_buffers_reach_the_wire_as_they_were(pki: dict[str, TlsConfig]) -> None:
    """A cancelled send stops guaranteeing its buffer: what is unsent is copied, and
    OpenSSL's retry of the record it stopped in gets the same bytes."""
    async with tls_pair(pki) as (client, server):
        t = client.transport
        assert t is not None and server.transport is not None
        server.transport.pause_reading()
        big = pattern(BIG)
        original = big.tobytes()
        done = t.writev([memoryview(big)])
        assert done is not None
        t.detach(done)
        big[:] = 0  # the caller reuses its buffer
        server.transport.resume_reading()
        await asyncio.wait_for(done, 30)
        await server.until(BIG)
        assert bytes(server.data) == original


class _PausingSink(Sink):
    """Hands out a small buffer and stops reading after the first bytes, while the
    rest of the record is decrypted inside OpenSSL (the socket will not signal it)."""

    def __init__(self) -> None:
        super().__init__()
        self.buf = bytearray(1000)
        self.paused = False

    def buffer_updated(self, nbytes: int) -> None:
        super().buffer_updated(nbytes)
        if nbytes and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()


async def test_bytes_openssl_holds_are_read_when_reading_resumes(pki: dict[str, TlsConfig]) -> None:
    async with tls_pair(pki, _PausingSink()) as (client, server):
        assert client.transport is not None and server.transport is not None
        message = pattern(10_000).tobytes()  # one TLS record
        client.transport.write(message)
        await server.until(1000)
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(server.data) == 1000  # paused
        server.transport.resume_reading()
        await server.until(len(message))
        assert bytes(server.data) == message


async def test_records_beyond_a_readable_events_budget_are_read(pki: dict[str, TlsConfig]) -> None:
    """More small records than two readable events read (:data:`READ_RECORDS` each), all
    in the socket at once: with read-ahead OpenSSL takes them all in its first read,
    so the socket signals nothing more, and ``pending()`` shows none of those not yet
    decrypted; reading goes on at the next loop turn until OpenSSL wants to read."""
    async with tls_pair(pki, small_buffers=False) as (client, server):
        assert client.transport is not None and server.transport is not None
        server.transport.pause_reading()
        messages = [b"record %04d;" % i for i in range(3 * tlstransport.READ_RECORDS)]  # ~8 KiB
        for message in messages:
            client.transport.write(message)  # one TLS record each
        assert client.transport.get_write_buffer_size() == 0
        await asyncio.sleep(0.05)  # all of them in the server's socket
        server.transport.resume_reading()
        expected = b"".join(messages)
        await server.until(len(expected), timeout=10)
        assert bytes(server.data) == expected


async def test_close_sends_close_notify_and_the_peer_sees_the_end(
    pki: dict[str, TlsConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An orderly close: everything queued, then close_notify both ways; neither side
    waits for its shutdown timer (made longer than the test's guard)."""
    monkeypatch.setattr(tlstransport, "SHUTDOWN_TIMEOUT", 120.0)
    async with tls_pair(pki) as (client, server):
        assert client.transport is not None and server.transport is not None
        server.transport.pause_reading()
        payload = pattern(BIG // 4)
        client.transport.write(memoryview(payload))
        client.transport.close()
        with pytest.raises(ConnectionResetError):
            client.transport.write(b"after close")
        server.transport.resume_reading()
        await server.until(len(payload))
        assert await asyncio.wait_for(server.lost, 30) is None
        assert await asyncio.wait_for(client.lost, 30) is None
        assert server.eof and bytes(server.data) == payload.tobytes()


async def test_a_close_finds_the_peers_goodbye_among_records_read_ahead(
    pki: dict[str, TlsConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peer sent records and its close_notify while this side was not reading; this
    side then closes: OpenSSL reads them all ahead in one read (the socket then signals
    nothing more) and its shutdown works on what it holds, so neither side waits for
    its shutdown timer (made longer than the test's guard)."""
    monkeypatch.setattr(tlstransport, "SHUTDOWN_TIMEOUT", 120.0)
    async with tls_pair(pki, small_buffers=False) as (client, server):
        assert client.transport is not None and server.transport is not None
        client.transport.pause_reading()
        for i in range(3 * tlstransport.READ_RECORDS):
            server.transport.write(b"record %04d;" % i)  # one TLS record each, ~8 KiB in all
        server.transport.close()  # its close_notify follows them
        await asyncio.sleep(0.05)  # all of it in the client's socket
        client.transport.close()
        assert await asyncio.wait_for(client.lost, 30) is None
        assert await asyncio.wait_for(server.lost, 30) is None


async def test_a_peer_lost_mid_stream_fails_the_pending_send(pki: dict[str, TlsConfig]) -> None:
    async with tls_pair(pki) as (client, server):
        assert client.transport is not None and server.transport is not None
        server.transport.pause_reading()
        done = client.transport.writev([memoryview(pattern(BIG))])
        assert done is not None
        server.transport.abort()  # unread bytes: the kernel resets the connection
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(done, 30)
        await asyncio.wait_for(client.lost, 30)
        assert client.transport.is_closing()


async def test_a_changed_record_fails_the_connection(pki: dict[str, TlsConfig]) -> None:
    """Bytes injected under TLS (an application-data record with a wrong tag) are
    refused by the record's MAC: the connection fails with the TLS error."""
    async with tls_pair(pki) as (client, server):
        assert client.transport is not None
        client.transport.write(b"genuine")
        await server.until(7)
        sock = client.transport.get_extra_info("socket")
        os.write(sock.fileno(), b"\x17\x03\x03\x00\x20" + bytes(range(32)))
        exc = await asyncio.wait_for(server.lost, 30)
        assert isinstance(exc, ssl.SSLError)
        assert bytes(server.data) == b"genuine"


async def test_a_handshake_that_never_comes_is_aborted(pki: dict[str, TlsConfig]) -> None:
    raw_client, raw_server = await _sockets(small_buffers=False)
    server = tlstransport.wrap(raw_server, pki["server"].server_context(), server_side=True, server_hostname=None)
    try:
        with pytest.raises(ConnectionAbortedError, match="did not finish"):
            await tlstransport.handshake(server, 0.2)  # a client that never speaks TLS
    finally:
        server.close()
        raw_client.close()


async def test_a_certificate_of_another_ca_is_refused(pki: dict[str, TlsConfig]) -> None:
    raw_client, raw_server = await _sockets(small_buffers=False)
    client = tlstransport.wrap(raw_client, pki["stranger"].client_context(), server_side=False, server_hostname=None)
    server = tlstransport.wrap(raw_server, pki["server"].server_context(), server_side=True, server_hostname=None)
    try:
        results = await asyncio.wait_for(
            asyncio.gather(
                tlstransport.handshake(client, 10), tlstransport.handshake(server, 10), return_exceptions=True
            ),
            30,
        )
        assert isinstance(results[0], ssl.SSLCertVerificationError)  # the client does not trust our server
        assert isinstance(results[1], (ssl.SSLError, ConnectionError))
    finally:
        client.close()
        server.close()


async def test_a_tls_link_lost_mid_message_is_peer_lost_on_both_sides(pki: dict[str, TlsConfig]) -> None:
    configs: list[LinkConfig | None] = [LinkConfig(transport="tls")] * 2
    async with tcp_mesh(2, configs=configs, tls=pki["server"]) as ts:
        link = ts[1].links[0]
        assert link.kind == "tls"
        op = ts[1].mailbox.open("g", 0, "fp", (0, 1), "test")
        taking = asyncio.ensure_future(ts[1].mailbox.take(op, (0, 0, 0), None))
        header = {"g": "g", "q": 0, "f": "fp", "s": 0, "c": 0}
        sending = asyncio.ensure_future(ts[0].send(1, Kind.DATA, header, memoryview(pattern(64 << 20))))
        async with asyncio.timeout(30):
            while link.proto.decoder.payload_target() is None:  # until the payload is part-way in
                await asyncio.sleep(0)
        link.abort()  # rank 1's end of the connection goes away part-way through the payload
        for fut in (sending, taking):
            with pytest.raises(PeerLost):
                await asyncio.wait_for(fut, 30)
        ts[1].mailbox.close(op)
