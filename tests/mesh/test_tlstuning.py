"""The OpenSSL settings :mod:`netcoll.mesh.tlstuning` makes on every TLS context:
AES-128-GCM negotiated between two netcoll contexts, a peer with OpenSSL's
defaults still accepted either way round, verification unchanged, and nothing
set where the context's ``SSL_CTX`` cannot be found. Loopback only."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from netcoll.links import tlstransport
from netcoll.mesh import tlstuning
from netcoll.mesh.certs import TlsConfig
from tests.links.test_tlstransport import _sockets
from tests.support.tlsca import issue, make_ca

pytestmark = pytest.mark.tcp


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d, "ca")
    return {"server": issue(ca, d, "server"), "client": issue(ca, d, "client")}


def _plain(paths: dict[str, str], protocol: ssl._SSLMethod) -> ssl.SSLContext:
    """A context with OpenSSL's defaults (not tuned), verifying like netcoll's."""
    ctx = ssl.SSLContext(protocol)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(paths["cert"], paths["key"])
    ctx.load_verify_locations(cafile=paths["ca"])
    return ctx


async def _handshake(client_ctx: ssl.SSLContext, server_ctx: ssl.SSLContext) -> tuple[str, str]:
    """The cipher both ends negotiated, after a byte went each way."""
    raw_client, raw_server = await _sockets(small_buffers=False)
    client = tlstransport.wrap(raw_client, client_ctx, server_side=False, server_hostname=None)
    server = tlstransport.wrap(raw_server, server_ctx, server_side=True, server_hostname=None)
    try:
        await asyncio.wait_for(
            asyncio.gather(tlstransport.handshake(client, 10), tlstransport.handshake(server, 10)), 30
        )
        client_cipher, server_cipher = client.cipher(), server.cipher()
        assert client_cipher is not None and server_cipher is not None
        return client_cipher[0], server_cipher[0]
    finally:
        client.close()
        server.close()


def _known() -> bool:
    return tlstuning._libssl() is not None


async def test_two_netcoll_contexts_negotiate_aes_128_gcm(pki: dict[str, dict[str, str]]) -> None:
    if not _known():
        pytest.skip("this Python or OpenSSL is not one tlstuning knows: OpenSSL's defaults stay")
    server, client = TlsConfig(**pki["server"]), TlsConfig(**pki["client"])
    assert server.tuning == client.tuning == tlstuning.Tuning(suites=True, read_ahead=True)
    assert server.server_context().get_ciphers()[0]["name"] == "TLS_AES_128_GCM_SHA256"
    assert server.server_context().verify_mode == client.client_context().verify_mode == ssl.CERT_REQUIRED
    got = await _handshake(client.client_context(), server.server_context())
    assert got == ("TLS_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256")


@pytest.mark.parametrize("tuned", ["client", "server"])
async def test_a_peer_with_openssl_defaults_still_connects(pki: dict[str, dict[str, str]], tuned: str) -> None:
    server_ctx = _plain(pki["server"], ssl.PROTOCOL_TLS_SERVER)
    client_ctx = _plain(pki["client"], ssl.PROTOCOL_TLS_CLIENT)
    if tuned == "client":
        client_ctx = TlsConfig(**pki["client"]).client_context()
    else:
        server_ctx = TlsConfig(**pki["server"]).server_context()
    client_cipher, server_cipher = await _handshake(client_ctx, server_ctx)
    assert client_cipher == server_cipher and client_cipher in tlstuning.SUITES.split(":")


def test_nothing_is_set_where_the_ssl_ctx_is_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    before = [c["name"] for c in ctx.get_ciphers()]
    monkeypatch.setattr(tlstuning, "_pointer", lambda lib, ctx: None)
    assert tlstuning.tune(ctx) == tlstuning.NONE
    monkeypatch.setattr(tlstuning, "_libssl", lambda: None)
    assert tlstuning.tune(ctx) == tlstuning.NONE
    assert [c["name"] for c in ctx.get_ciphers()] == before
