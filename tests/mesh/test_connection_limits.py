"""Connections cannot be used to exhaust a process (issue 10): per-source
connection limits, delayed and rate-limited logging of failed handshakes,
the idle timeout of RPC sessions, and an accept loop that does not spin when
the process is out of file descriptors. Loopback only (127.0.0.0/8)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from netcoll.errors import AuthenticationError
from netcoll.limits import Limits
from netcoll.links.connection import FramedProtocol, open_connection
from netcoll.mesh.handshake import client_handshake, server_handshake
from netcoll.mesh.server import RateLimitedLog, Server
from netcoll.rpc import RpcClient, RpcServer, Session
from netcoll.wire import Kind
from tests.support.waiting import until

pytestmark = pytest.mark.tcp

TOKEN = "limits-s3cret"
SRC_A, SRC_B = "127.0.0.2", "127.0.0.3"  # two loopback sources: the limits are per source


class _Held:
    """A server whose handler authenticates, then keeps the connection open."""

    def __init__(self, settings: Limits) -> None:
        self.server = Server(self.handle, settings=settings)
        self.port = 0

    async def handle(self, proto: FramedProtocol) -> None:
        await server_handshake(proto, token=TOKEN, role="test")
        while True:
            await proto.next_frame()

    async def __aenter__(self) -> _Held:
        _, self.port = await self.server.start("127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()


async def _dial(port: int, source: str) -> FramedProtocol:
    return await open_connection("127.0.0.1", port, local_host=source)


async def _first_frame(proto: FramedProtocol, timeout: float) -> Any:
    """The kind of the first frame, or the exception (e.g. a refusal) the connection ended with."""
    try:
        return (await asyncio.wait_for(proto.next_frame(), timeout)).kind
    except (ConnectionError, OSError) as exc:
        return exc


@pytest.fixture
async def protos() -> AsyncIterator[list[FramedProtocol]]:
    opened: list[FramedProtocol] = []
    yield opened
    for proto in opened:
        proto.abort()
    await asyncio.sleep(0)


async def test_unauthenticated_connections_per_source_wait_then_are_refused(protos: list[FramedProtocol]) -> None:
    settings = Limits(max_unauth_conns_per_source=2, max_conns_per_source=10, handshake_timeout_s=1.6)
    async with _Held(settings) as held:
        stalled = [await _dial(held.port, SRC_A) for _ in range(2)]  # take both handshake slots, answer nothing
        protos.extend(stalled)
        for proto in stalled:
            assert await _first_frame(proto, 2.0) == Kind.CHALLENGE
        third = await _dial(held.port, SRC_A)
        protos.append(third)
        # no handshake work for the third one while the source's slots are taken...
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(third.closed), 0.3)
        assert not third.queue
        # ...while another source is served at once, and completes its handshake
        other = await _dial(held.port, SRC_B)
        protos.append(other)
        await asyncio.wait_for(client_handshake(other, token=TOKEN, role="test"), 2.0)
        # the third gets a clear ERROR (and nothing else) after waiting half the handshake time
        got = await _first_frame(third, 3.0)
        assert isinstance(got, ConnectionError), got
        assert "too many connections still in the handshake from 127.0.0.2" in str(got)
        assert held.server.refused == 1


async def test_a_waiting_connection_proceeds_when_a_slot_frees(protos: list[FramedProtocol]) -> None:
    settings = Limits(max_unauth_conns_per_source=1, max_conns_per_source=10, handshake_timeout_s=5.0)
    async with _Held(settings) as held:
        first = await _dial(held.port, SRC_A)
        protos.append(first)
        assert await _first_frame(first, 2.0) == Kind.CHALLENGE
        second = await _dial(held.port, SRC_A)
        protos.append(second)
        hello = asyncio.ensure_future(client_handshake(second, token=TOKEN, role="test", timeout=5.0))
        await asyncio.sleep(0.2)
        assert not hello.done()  # queued behind the stalled first one
        first.abort()  # the slot frees: the queued connection is challenged and admitted at once
        await asyncio.wait_for(hello, 1.0)


async def test_a_burst_from_one_source_queues_instead_of_failing() -> None:
    """Many ranks on one host dial at once: beyond the handshake slots they wait briefly."""

    async def echo(session: Session, params: dict[str, Any], payload: memoryview) -> Any:
        return params

    server = RpcServer({"echo": echo}, token=TOKEN, limits=Limits(max_unauth_conns_per_source=2))
    _, port = await server.start("127.0.0.1", 0)
    try:
        start = time.monotonic()
        clients = await asyncio.gather(
            *(RpcClient.connect(f"127.0.0.1:{port}", token=TOKEN, local_host=SRC_A) for _ in range(30))
        )
        assert time.monotonic() - start < 2.0
        assert [await c.call("echo", {"i": i}) for i, c in enumerate(clients)] == [{"i": i} for i in range(30)]
        for c in clients:
            await c.close()
    finally:
        await server.close()


async def test_total_connections_per_source(protos: list[FramedProtocol]) -> None:
    settings = Limits(max_unauth_conns_per_source=2, max_conns_per_source=3)
    async with _Held(settings) as held:
        for _ in range(3):
            proto = await _dial(held.port, SRC_A)
            protos.append(proto)
            await asyncio.wait_for(client_handshake(proto, token=TOKEN, role="test"), 2.0)
        over = await _dial(held.port, SRC_A)
        protos.append(over)
        got = await _first_frame(over, 2.0)  # refused at once: the first and only frame is the ERROR
        assert isinstance(got, ConnectionError), got
        assert "too many connections from 127.0.0.2 (at most 3 per source address)" in str(got)
        # another source is not affected
        other = await _dial(held.port, SRC_B)
        protos.append(other)
        await asyncio.wait_for(client_handshake(other, token=TOKEN, role="test"), 2.0)
        # closing one makes room again
        protos[0].abort()
        for _ in range(100):
            if held.server.sources[SRC_A].total < 3:
                break
            await asyncio.sleep(0.02)
        again = await _dial(held.port, SRC_A)
        protos.append(again)
        await asyncio.wait_for(client_handshake(again, token=TOKEN, role="test"), 2.0)


# -- failed authentication: logged, rate-limited, delayed ----------------------------------------------
async def _wrong_token(port: int, source: str, hello: dict[str, Any] | None = None, role: str = "test") -> float:
    start = time.monotonic()
    proto = await _dial(port, source)
    try:
        with pytest.raises((AuthenticationError, ConnectionError)):
            await client_handshake(proto, token="wrong", role=role, hello=hello, timeout=5.0)
    finally:
        proto.abort()
    return time.monotonic() - start


def _auth_lines(caplog: pytest.LogCaptureFixture, source: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "netcoll.transport" and f"failed handshake from {source}:" in r.getMessage()
    ]


async def test_failed_auth_is_delayed_and_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="netcoll.transport")
    settings = Limits(auth_fail_delay_s=0.2, auth_fail_log_interval_s=1.5)
    async with _Held(settings) as held:
        took = [await _wrong_token(held.port, SRC_A) for _ in range(4)]
        assert min(took) >= 0.18, took  # each refusal waited auth_fail_delay_s
        lines = _auth_lines(caplog, SRC_A)
        assert len(lines) == 1 and "wrong token" in lines[0] and "more from this address" not in lines[0], lines
        await _wrong_token(held.port, SRC_B)  # per source: B gets its own line
        assert len(_auth_lines(caplog, SRC_B)) == 1
        await asyncio.sleep(1.6 - 0.2)  # the interval has passed: the next line counts what was suppressed
        await _wrong_token(held.port, SRC_A)
        lines = _auth_lines(caplog, SRC_A)
        assert len(lines) == 2 and "3 more from this address in the last 1.5s" in lines[1], lines
        assert held.server.auth_failures == 6


async def test_a_delayed_refusal_holds_nothing_else_up() -> None:
    """A client from the same source is served while a refusal waits out its delay. (The
    delay is long, under the refused client's own 5 s handshake timeout, so that the order
    does not depend on how fast this machine serves the other one; closing the server then
    ends the refusal. That the delay is applied: test_failed_auth_is_delayed_...)"""
    settings = Limits(auth_fail_delay_s=4.0)

    async def echo(session: Session, params: dict[str, Any], payload: memoryview) -> Any:
        return params

    server = RpcServer({"echo": echo}, token=TOKEN, limits=settings)
    _, port = await server.start("127.0.0.1", 0)
    try:
        failing = asyncio.ensure_future(_wrong_token(port, SRC_A))
        await until(lambda: server._server.auth_failures == 1)  # refused: now in its delay
        client = await RpcClient.connect(f"127.0.0.1:{port}", token=TOKEN, local_host=SRC_A)
        assert await client.call("echo", {"x": 1}) == {"x": 1}
        await client.close()
        assert not failing.done()
    finally:
        await server.close()
    assert await asyncio.wait_for(failing, 5.0) < 4.0  # ended by the close, not by its delay


async def test_untrusted_strings_are_escaped_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="netcoll.transport")
    async with _Held(Limits(auth_fail_delay_s=0.0)) as held:
        evil = "x\nWARNING forged line\x1b[31m" + "A" * 3000
        await _wrong_token(held.port, SRC_A, hello={"member_id": evil}, role="r\r\nole")
    (line,) = _auth_lines(caplog, SRC_A)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert "x\\nWARNING forged line\\x1b[31m" in line and "r\\r\\nole" in line
    assert len(line) < 1000


def test_rate_limited_log() -> None:
    limiter = RateLimitedLog(60.0, max_keys=2)
    assert limiter.allow("a") == 0 and limiter.allow("a") is None and limiter.allow("a") is None
    assert limiter.allow("b") == 0 and limiter.allow("c") == 0  # "a" is forgotten (at most 2 keys)
    assert limiter.allow("a") == 0


# -- the idle timeout of RPC sessions ------------------------------------------------------------
@pytest.fixture
async def rpc_server() -> AsyncIterator[tuple[RpcServer, int]]:
    async def echo(session: Session, params: dict[str, Any], payload: memoryview) -> Any:
        await asyncio.sleep(float(params.get("sleep", 0)))
        return params

    server = RpcServer({"echo": echo}, token=TOKEN, limits=Limits(idle_timeout_s=0.4))
    _, port = await server.start("127.0.0.1", 0)
    yield server, port
    await server.close()


async def test_idle_rpc_connection_is_closed(rpc_server: tuple[RpcServer, int]) -> None:
    _, port = rpc_server
    proto = await open_connection("127.0.0.1", port)
    try:
        welcome = await client_handshake(proto, token=TOKEN, role="client")
        assert welcome["idle_timeout"] == 0.4
        start = time.monotonic()
        with pytest.raises(ConnectionError, match=r"idle for 0\.4s"):
            await asyncio.wait_for(proto.next_frame(), 3.0)  # sends nothing: closed with an ERROR
        assert 0.35 < time.monotonic() - start < 2.0
    finally:
        proto.abort()


async def test_pings_and_requests_in_flight_keep_a_session_open(rpc_server: tuple[RpcServer, int]) -> None:
    _, port = rpc_server
    proto = await open_connection("127.0.0.1", port)
    try:
        await client_handshake(proto, token=TOKEN, role="client")
        for _ in range(4):  # 1.2 s of PINGs, every 0.3 s
            await proto.send(Kind.PING, {})
            assert (await asyncio.wait_for(proto.next_frame(), 2.0)).kind == Kind.PONG
            await asyncio.sleep(0.3)
        # a request that takes longer than the idle timeout is not cut off
        await proto.send(Kind.REQUEST, {"id": 1, "method": "echo", "params": {"sleep": 1.0}})
        reply = await asyncio.wait_for(proto.next_frame(), 3.0)
        assert reply.kind == Kind.RESPONSE and reply.header["ok"]
    finally:
        proto.abort()
    # RpcClient PINGs on its own (idle_timeout / 3, from the WELCOME): never idle in normal use
    client = await RpcClient.connect(f"127.0.0.1:{port}", token=TOKEN)
    try:
        await asyncio.sleep(1.2)
        assert not client.closed
        assert await client.call("echo", {"y": 2}) == {"y": 2}
    finally:
        await client.close()


# -- out of file descriptors: the accept loop backs off instead of spinning ----------------------
_EMFILE_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, logging, os, resource, sys, time
    from netcoll.links.listener import Listener

    warnings = []
    class Count(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())
    logging.getLogger("netcoll.transport").addHandler(Count())

    class Sink(asyncio.BufferedProtocol):
        accepted = 0
        def connection_made(self, transport):
            Sink.accepted += 1
        def get_buffer(self, n):
            return bytearray(1024)
        def buffer_updated(self, n):
            pass
        def connection_lost(self, exc):
            pass

    async def main():
        listener = Listener(Sink)
        host, port = listener.start("127.0.0.1", 0)
        print(port, flush=True)
        sys.stdin.readline()  # the test has connected: its connections wait in the backlog
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, soft), hard))
        held = []
        try:
            while True:
                held.append(os.dup(0))
        except OSError:
            pass
        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.sleep(2.0)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for _ in range(60):
            if Sink.accepted:
                break
            await asyncio.sleep(0.05)
        listener.close()
        print(json.dumps({"cpu": cpu, "wall": wall, "errors": listener.resource_errors,
                          "warnings": warnings, "accepted": Sink.accepted}), flush=True)

    asyncio.run(main())
    """
)


def test_out_of_file_descriptors_does_not_spin() -> None:
    import socket

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", _EMFILE_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    socks: list[socket.socket] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        for _ in range(3):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=30)
    finally:
        for s in socks:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["errors"] >= 1, result  # accept() did fail for lack of descriptors...
    assert result["cpu"] < 0.5, result  # ...and the loop slept through it instead of spinning
    assert len(result["warnings"]) == 1 and "cannot accept connections" in result["warnings"][0], result
    assert result["accepted"] >= 1, result  # and it accepts again once descriptors are free
