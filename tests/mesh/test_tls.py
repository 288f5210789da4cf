"""Mutual TLS (issue 10): a throwaway CA made here (``cryptography``), an embedded
group over TLS links, and the refusals: a plaintext client, a certificate of
another CA, no client certificate, a server of another CA, bad files at startup;
secure by default for the embedded coordinator and peer port. Loopback only."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

import numpy as np
import pytest

import netcoll
from netcoll.limits import Limits
from netcoll.mesh.certs import TlsConfig, TlsConfigError
from netcoll.mesh.tcpmesh import Listener
from netcoll.rpc import RpcClient, RpcServer
from tests.support.tlsca import issue, make_ca

pytestmark = pytest.mark.tcp
TOKEN = "tls-member-s3cret"
#: refusals answer quickly: a short handshake deadline, a short failure delay
FAST = Limits(handshake_timeout_s=1.0, auth_fail_delay_s=0.2, auth_fail_log_interval_s=60.0)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsConfig]:
    d = tmp_path_factory.mktemp("pki")
    ca, other = make_ca(d, "ca"), make_ca(d, "other-ca")
    stranger = issue(other, d, "stranger")
    return {
        "server": TlsConfig(**issue(ca, d, "server")),
        "client": TlsConfig(**issue(ca, d, "client")),
        "stranger": TlsConfig(**stranger),  # of another CA, trusting that CA only
        "impostor": TlsConfig(**{**stranger, "ca": ca.path}),  # of another CA, trusting ours
    }


async def _echo(session: object, params: dict[str, object], payload: memoryview) -> object:
    return params


async def test_embedded_group_over_tls(pki: dict[str, TlsConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_TRANSPORT", "tls")  # else ranks on one host share memory (test_shm_links.py)
    async with netcoll.Coordinator(token=TOKEN, tls=pki["server"]) as coord:

        async def rank(i: int) -> tuple[np.ndarray, dict[int, dict[str, object]], str | None]:
            async with netcoll.connect(
                coord.address, world_size=3, rank=i, token=TOKEN, tls=pki["client"], timeout=30
            ) as comm:
                out = await comm.all_reduce(np.full(300_000, i + 1, np.float32))  # large: several TLS records
                small = await comm.all_reduce(np.array([i], np.int64))
                assert int(small[0]) == 3
                link = comm.transport.links[(i + 1) % 3]  # type: ignore[attr-defined]
                version = link.proto.transport.get_extra_info("ssl_object").version()
                return out, comm.link_stats(), version

        results = await asyncio.wait_for(asyncio.gather(*(rank(i) for i in range(3))), 60)
    for out, stats, version in results:
        np.testing.assert_array_equal(out, np.full(300_000, 6, np.float32))
        assert {s["kind"] for s in stats.values()} == {"tls"}
        assert version in ("TLSv1.2", "TLSv1.3")


async def test_flow_control_over_tls(pki: dict[str, TlsConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    """Credits and rendezvous work the same over TLS: with a 64 KiB window, 4 MiB sent before
    the receive is posted goes by RTS/CTS, and a burst of small eager frames is credited back."""
    monkeypatch.setenv("NETCOLL_TRANSPORT", "tls")  # else ranks on one host share memory (test_shm_links.py)
    async with netcoll.Coordinator(token=TOKEN, tls=pki["server"]) as coord:

        async def rank(i: int) -> dict[int, dict[str, object]]:
            async with netcoll.connect(
                coord.address, world_size=2, rank=i, token=TOKEN, tls=pki["client"], recv_window=64 << 10, timeout=30
            ) as comm:
                big = np.arange(1 << 20, dtype=np.float32)
                if i == 0:
                    await comm.send(big, 1)
                    for k in range(64):  # eager frames, more than the window holds in total
                        await comm.send(np.full(512, k, np.float32), 1, tag=1)
                else:
                    await asyncio.sleep(0.2)  # the sender gets there first
                    np.testing.assert_array_equal(await comm.recv(0), big)
                    for k in range(64):
                        assert float((await comm.recv(0, tag=1))[0]) == k
                await comm.barrier()
                return comm.link_stats()

        stats = await asyncio.wait_for(asyncio.gather(rank(0), rank(1)), 60)
    sender = stats[0][1]
    assert sender["kind"] == "tls" and int(sender["rendezvous"]) >= 1  # type: ignore[call-overload]
    assert int(stats[1][0]["credits_sent"]) >= 1  # type: ignore[call-overload]


async def _server(pki: dict[str, TlsConfig]) -> RpcServer:
    server = RpcServer({"echo": _echo}, token=TOKEN, tls=pki["server"], limits=FAST)
    await server.start("127.0.0.1", 0)
    return server


async def _failures(server: RpcServer, n: int) -> None:
    async with asyncio.timeout(10):
        while server._server.auth_failures < n:
            await asyncio.sleep(0.02)


async def test_tls_round_trip_and_refusals(pki: dict[str, TlsConfig], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "netcoll.transport")
    server = await _server(pki)
    address = f"127.0.0.1:{server.address[1]}"
    try:
        rpc = await RpcClient.connect(address, token=TOKEN, tls=pki["client"])
        assert await rpc.call("echo", {"x": 1}) == {"x": 1}
        await rpc.close()

        # a plaintext netcoll client: nobody speaks first, the client probes (mesh/sniff.py),
        # the TLS handshake fails on the probe at once, closed
        with pytest.raises(ConnectionError, match="does it require TLS"):
            await RpcClient.connect(address, token=TOKEN, timeout=5)
        await _failures(server, 1)
        assert "TLS handshake failed" in caplog.text

        # a certificate of another CA: refused by the server (logged once: rate-limited)
        with pytest.raises(ConnectionError, match="refused the TLS session"):
            await RpcClient.connect(address, token=TOKEN, tls=pki["impostor"], timeout=5)
        with pytest.raises(netcoll.AuthenticationError, match="certificate verify failed"):
            await RpcClient.connect(address, token=TOKEN, tls=pki["stranger"], timeout=5)  # refuses ours too
        await _failures(server, 3)

        # no client certificate at all
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.load_verify_locations(cafile=pki["client"].ca)
        with pytest.raises((ConnectionError, ssl.SSLError)):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.address[1], ssl=ctx)
            try:
                if not await asyncio.wait_for(reader.read(1), 5):
                    raise ConnectionResetError("closed")
            finally:
                writer.close()
        await _failures(server, 4)
        lines = [r.getMessage() for r in caplog.records if "failed handshake" in r.getMessage()]
        assert len(lines) == 1, lines  # one line per source per interval; the rest are counted
        async with asyncio.timeout(10):  # every slot and count is given back (after the failure delay)
            while server._server.sources:
                await asyncio.sleep(0.02)

        # the server's certificate is of another CA: the client refuses it
        stranger = RpcServer({"echo": _echo}, token=TOKEN, tls=pki["stranger"], limits=FAST)
        await stranger.start("127.0.0.1", 0)
        try:
            with pytest.raises(netcoll.AuthenticationError, match="certificate verify failed"):
                await RpcClient.connect(f"127.0.0.1:{stranger.address[1]}", token=TOKEN, tls=pki["client"])
        finally:
            await stranger.close()
    finally:
        await server.close()


async def test_tls_client_against_a_plaintext_server(pki: dict[str, TlsConfig]) -> None:
    server = RpcServer({"echo": _echo}, token=TOKEN, limits=FAST)
    await server.start("127.0.0.1", 0)
    try:
        with pytest.raises(netcoll.AuthenticationError, match=r"TLS handshake with .* failed"):
            await RpcClient.connect(f"127.0.0.1:{server.address[1]}", token=TOKEN, tls=pki["client"], timeout=5)
    finally:
        await server.close()


async def test_https_port_idle_handshakes_cannot_starve_it(pki: dict[str, TlsConfig]) -> None:
    """The HTTP port over TLS: connections still in (or never starting) the TLS handshake hold
    slots that idle eviction frees, so a GET /livez with a certificate is always answered."""
    from netcoll.cli.common import CliError
    from netcoll.cli.health import http_get
    from netcoll.service.http import HttpServer

    server = HttpServer(
        ready=lambda: (True, ""), metrics=lambda: "", tls=pki["server"], limits=Limits(http_max_conns=4)
    )
    host, port = await server.start("127.0.0.1", 0)
    idle = [await asyncio.open_connection(host, port) for _ in range(12)]  # plaintext, silent
    try:
        assert server.url.startswith("https://")
        status, body = await asyncio.to_thread(http_get, f"{server.url}/livez", 5.0, pki["client"])
        assert (status, body) == (200, "ok\n")
        with pytest.raises(CliError, match="TLS"):  # a certificate of another CA
            await asyncio.to_thread(http_get, f"{server.url}/livez", 5.0, pki["impostor"])
    finally:
        for _, writer in idle:
            writer.close()
        await server.close()


async def test_check_hostname(pki: dict[str, TlsConfig]) -> None:
    """With check_hostname the client also matches the address it dials against the server
    certificate's SANs (127.0.0.1 and localhost here; not 127.0.0.2)."""
    strict = TlsConfig(pki["client"].cert, pki["client"].key, pki["client"].ca, check_hostname=True)
    for host in ("127.0.0.1", "127.0.0.2"):
        server = RpcServer({"echo": _echo}, token=TOKEN, tls=pki["server"], limits=FAST)
        await server.start(host, 0)
        try:
            if host == "127.0.0.1":
                rpc = await RpcClient.connect(f"{host}:{server.address[1]}", token=TOKEN, tls=strict)
                assert await rpc.call("echo", {"h": 1}) == {"h": 1}
                await rpc.close()
            else:
                with pytest.raises(netcoll.AuthenticationError, match="IP address mismatch"):
                    await RpcClient.connect(f"{host}:{server.address[1]}", token=TOKEN, tls=strict)
        finally:
            await server.close()


def test_bad_files_are_a_config_error(pki: dict[str, TlsConfig], tmp_path: Path) -> None:
    good = pki["client"]
    with pytest.raises(TlsConfigError, match="no such file"):
        TlsConfig(cert=str(tmp_path / "nope.pem"), key=good.key, ca=good.ca)
    with pytest.raises(TlsConfigError, match="mismatch"):
        TlsConfig(cert=good.cert, key=pki["server"].key, ca=good.ca)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(TlsConfigError, match="TLS CA ca="):
        TlsConfig(cert=good.cert, key=good.key, ca=str(garbage))
    with pytest.raises(TlsConfigError, match="NETCOLL_TLS_KEY"):
        TlsConfig.from_env({"NETCOLL_TLS_CERT": good.cert, "NETCOLL_TLS_CA": good.ca})
    assert TlsConfig.from_env({}) is None
    with pytest.raises(TlsConfigError):
        netcoll.Client("127.0.0.1:1", tls={"cert": good.cert})
    # the project's typed configuration error (so the CLI exits 2), still a ValueError
    with pytest.raises(netcoll.ConfigError):
        TlsConfig.from_env({"NETCOLL_TLS_CERT": good.cert})
    assert issubclass(TlsConfigError, ValueError)


async def test_secure_by_default_embedded(pki: dict[str, TlsConfig]) -> None:
    """Binding 0.0.0.0 locally is fine here; nothing connects to it."""
    with pytest.raises(netcoll.InsecureListenerError, match="without credentials"):
        await netcoll.Coordinator(host="0.0.0.0").start()
    for kw in ({"insecure": True}, {"token": TOKEN}, {"tls": pki["server"]}):
        coord = await netcoll.Coordinator(host="0.0.0.0", **kw).start()  # type: ignore[arg-type]
        await coord.close()
    with pytest.raises(netcoll.InsecureListenerError):
        await Listener().start("0.0.0.0", 0)
    listener = Listener(tls=pki["server"])
    await listener.start("0.0.0.0", 0)
    await listener.close()
    with pytest.raises(ValueError, match="NETCOLL_TRANSPORT=tcp"):  # TLS never falls back to plain TCP
        from netcoll.links.factory import LinkConfig
        from netcoll.mesh.tcpmesh import TcpMesh

        TcpMesh(listener, rank=0, size=2, session="s", peers=[], links=LinkConfig(transport="tcp"))
