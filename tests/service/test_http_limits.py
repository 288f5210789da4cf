"""The health port keeps answering while idle or slow clients hold connections
(issue 10): a connection cap that closes the oldest idle connection rather than
refusing the new one, a per-request read timeout, and the bind address from
``--http-host`` / ``NETCOLL_HTTP_HOST``. Loopback only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from netcoll.config import CoordinatorConfig, RankConfig
from netcoll.limits import Limits
from netcoll.service.http import HttpServer

pytestmark = pytest.mark.tcp


async def _get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, data.partition(b"\r\n\r\n")[2]


@pytest.fixture
async def idle() -> AsyncIterator[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    yield conns
    for _, writer in conns:
        writer.transport.abort()
    await asyncio.sleep(0)


async def _serve(limits: Limits | None = None) -> tuple[HttpServer, int]:
    server = HttpServer(ready=lambda: (True, "ok"), metrics=lambda: "m 1\n", limits=limits)
    _, port = await server.start("127.0.0.1", 0)
    return server, port


async def test_livez_answers_while_many_idle_connections_are_open(
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
) -> None:
    server, port = await _serve()  # the default limits: 64 connections
    try:
        for i in range(100):  # idle clients: connected, sending nothing (or half a request line)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if i % 2:
                writer.write(b"GET /li")
            idle.append((reader, writer))
        await asyncio.sleep(0.1)
        for path in ("/livez", "/readyz", "/livez"):
            start = time.monotonic()
            assert await _get(port, path) == (200, b"ok\n")
            assert time.monotonic() - start < 1.0
        assert len(server._writers) <= 64
        assert server.evicted >= 100 - 64
        # the oldest idle clients were the ones closed
        reader, _ = idle[0]
        assert await asyncio.wait_for(reader.read(), 2.0) == b""
    finally:
        await server.close()


async def test_a_slow_request_times_out(idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    server, port = await _serve(Limits(http_timeout_s=0.3))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        idle.append((reader, writer))
        writer.write(b"GET /livez HTTP/1.1\r\n")  # never finishes the headers
        start = time.monotonic()
        data = await asyncio.wait_for(reader.read(), 3.0)
        assert data.startswith(b"HTTP/1.1 408 ")
        assert 0.25 < time.monotonic() - start < 2.0
    finally:
        await server.close()


async def test_a_small_cap_still_serves_health_checks(
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
) -> None:
    server, port = await _serve(Limits(http_max_conns=2))
    try:
        for _ in range(5):
            idle.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.05)
        assert await _get(port, "/livez") == (200, b"ok\n")
        assert len(server._writers) <= 2
    finally:
        await server.close()


def test_http_host_setting() -> None:
    assert RankConfig.load({}, {"NETCOLL_HTTP_HOST": "127.0.0.1"}).http_host == "127.0.0.1"
    assert CoordinatorConfig.load({}, {"NETCOLL_HTTP_HOST": "::1"}).http_host == "::1"
    assert RankConfig.load({"http_host": "127.0.0.2"}, {"NETCOLL_HTTP_HOST": "127.0.0.1"}).http_host == "127.0.0.2"
    assert RankConfig.load({}, {}).http_host is None  # serve binds the main listener's host then
