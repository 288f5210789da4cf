"""A client at the wrong port is told what it met, at once (issue 38, item 4): a netcoll
client at an HTTP port, a plaintext client at a TLS port, ``netcoll health`` at an RPC or
a TLS port. The servers here keep their own deadlines long (60 s) and the client's is
30 s: without the probe (``netcoll.mesh.sniff``) each of these would end in a
timeout or a late, vague error, never in the message asserted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import netcoll
from netcoll.cli.common import CliError
from netcoll.cli.health import http_get
from netcoll.errors import ProtocolError
from netcoll.limits import Limits
from netcoll.links.connection import open_connection
from netcoll.mesh import sniff
from netcoll.mesh.certs import TlsConfig
from netcoll.mesh.handshake import client_handshake
from netcoll.rpc import RpcClient
from netcoll.service.http import HttpServer
from netcoll.wire import Kind
from tests.support.tlsca import issue, make_ca

pytestmark = pytest.mark.tcp
PATIENT = Limits(http_timeout_s=60.0, handshake_timeout_s=60.0)  # servers that would wait a long time
CLIENT_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsConfig]:
    d: Path = tmp_path_factory.mktemp("pki")
    ca = make_ca(d, "ca")
    return {"server": TlsConfig(**issue(ca, d, "server")), "client": TlsConfig(**issue(ca, d, "client"))}


def http_server(tls: TlsConfig | None = None) -> HttpServer:
    return HttpServer(ready=lambda: (True, "ok"), metrics=lambda: "", limits=PATIENT, tls=tls)


def test_the_first_bytes_name_the_protocol() -> None:
    assert sniff.protocol_of(b"HTTP/1.1 400 Bad Request\r\n") == sniff.HTTP
    assert sniff.protocol_of(b"\x15\x03\x03\x00\x02\x02\x46") == sniff.TLS  # an alert record
    assert sniff.protocol_of(b"\x16\x03\x01\x00\xa5") == sniff.TLS  # a handshake record
    assert sniff.protocol_of(b"NCOL\x01\x01") == sniff.NETCOLL
    assert sniff.protocol_of(b"SSH-2.0-OpenSSH") is None and sniff.rpc_met("x:1", b"SSH-2.0") is None


async def test_a_netcoll_client_at_an_http_port_is_told_so() -> None:
    server = http_server()
    host, port = await server.start("127.0.0.1", 0)
    try:
        with pytest.raises(ProtocolError) as info:
            await RpcClient.connect(f"{host}:{port}", timeout=CLIENT_TIMEOUT)
    finally:
        await server.close()
    assert f"server 127.0.0.1:{port} answered in HTTP: it is an HTTP port" in str(info.value)


async def test_a_plaintext_client_at_a_tls_port_is_told_so(pki: dict[str, TlsConfig]) -> None:
    async with netcoll.Coordinator(tls=pki["server"], limits=PATIENT) as coord:
        with pytest.raises((ProtocolError, ConnectionResetError)) as info:
            await RpcClient.connect(coord.address, timeout=CLIENT_TIMEOUT)
    assert "TLS" in str(info.value), info.value


async def test_a_plaintext_client_at_a_tls_http_port_is_told_so(pki: dict[str, TlsConfig]) -> None:
    server = http_server(pki["server"])
    host, port = await server.start("127.0.0.1", 0)
    try:
        with pytest.raises((ProtocolError, ConnectionResetError)) as info:
            await RpcClient.connect(f"{host}:{port}", timeout=CLIENT_TIMEOUT)
    finally:
        await server.close()
    assert "TLS" in str(info.value), info.value


async def test_health_at_a_tls_port_or_an_rpc_port_says_what_it_met(pki: dict[str, TlsConfig]) -> None:
    server = http_server(pki["server"])
    host, port = await server.start("127.0.0.1", 0)
    try:
        with pytest.raises(CliError) as info:
            await asyncio.to_thread(http_get, f"{host}:{port}", CLIENT_TIMEOUT)
        assert "TLS" in str(info.value) and "--tls-cert" in str(info.value), info.value
        status, _ = await asyncio.to_thread(http_get, f"{host}:{port}", CLIENT_TIMEOUT, pki["client"])
        assert status == 200
    finally:
        await server.close()
    async with netcoll.Coordinator(limits=PATIENT) as coord:
        with pytest.raises(CliError) as info:
            await asyncio.to_thread(http_get, coord.address, CLIENT_TIMEOUT)
    assert "answered in netcoll's RPC protocol, not HTTP: it is an RPC port" in str(info.value)


async def test_a_netcoll_server_ignores_the_probe() -> None:
    """The probe reaching a netcoll server (one slow to send its CHALLENGE) does no harm:
    here it comes before anything else, and the handshake still succeeds."""
    async with netcoll.Coordinator() as coord:
        host, _, port = coord.address.rpartition(":")
        proto = await open_connection(host, int(port))
        try:
            proto.write(Kind.PING, dict(sniff.PROBE))
            welcome = await client_handshake(proto, token=None, role="client", timeout=CLIENT_TIMEOUT)
        finally:
            proto.close()
        assert isinstance(welcome, dict)
        rpc = await RpcClient.connect(coord.address, timeout=CLIENT_TIMEOUT)  # and a client that probes works
        try:
            assert "groups" in await rpc.call("status")
        finally:
            await rpc.close()
