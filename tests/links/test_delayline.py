"""The emulated network delay (``NETCOLL_EMULATE_DELAY_US``, bench/netem.py on kernels
without netem): its setting, and that a delayed connection still delivers every byte in
order, its end after its data, pauses, bounded memory, TLS and whole collectives.

The delay itself is checked only from below (nothing arrives before it is due), which a
slow machine cannot make fail."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import netcoll
from netcoll.errors import ConfigError
from netcoll.links import delayline
from netcoll.mesh.certs import TlsConfig
from tests.links.test_sockettransport import Sink, pair, pattern
from tests.support.tlsca import issue, make_ca
from tests.support.worlds import connected_world

pytestmark = pytest.mark.tcp
DELAY_US = 30_000  # far above a loopback round trip, so "not before it is due" means something


@pytest.mark.parametrize(("text", "seconds"), [("", 0.0), ("  ", 0.0), ("0", 0.0), ("200", 2e-4), ("1000000", 1.0)])
def test_setting(text: str, seconds: float) -> None:
    assert delayline.configured({delayline.DELAY_ENV: text}) == seconds
    assert delayline.configured({}) == 0.0


@pytest.mark.parametrize("text", ["-1", "1000001", "1.5", "200us", "abc"])
def test_bad_setting_is_a_config_error_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError, match=delayline.DELAY_ENV):
        delayline.configured({delayline.DELAY_ENV: text})


def test_a_bad_setting_fails_where_links_are_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    from netcoll.links.factory import LinkConfig

    monkeypatch.setenv(delayline.DELAY_ENV, "soon")
    with pytest.raises(ConfigError, match=delayline.DELAY_ENV):
        LinkConfig.from_env()


class Stamped(Sink):
    """A Sink that notes when each byte count arrived, and reads through a small buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.buf = bytearray(1000)  # smaller than the line's reads: a release takes several
        self.stamps: list[tuple[float, int]] = []

    def buffer_updated(self, nbytes: int) -> None:
        self.stamps.append((time.monotonic(), len(self.data) + nbytes))
        super().buffer_updated(nbytes)


async def delayed_pair(monkeypatch: pytest.MonkeyPatch, us: int = DELAY_US) -> tuple[object, Sink, Stamped]:
    monkeypatch.setenv(delayline.DELAY_ENV, str(us))
    accepted: list[Stamped] = []
    got = asyncio.Event()

    def factory() -> Stamped:
        accepted.append(Stamped())
        got.set()
        return accepted[-1]

    from netcoll.links import dialer
    from netcoll.links.listener import Listener

    listener = Listener(factory)
    host, port = listener.start("127.0.0.1", 0)
    _, client = await dialer.connect(host, port, Sink)
    await asyncio.wait_for(got.wait(), 5)
    return listener, client, accepted[0]  # type: ignore[return-value]


async def test_bytes_arrive_whole_in_order_and_not_before_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    listener, client, server = await delayed_pair(monkeypatch)
    try:
        data = pattern(3 * 1024 * 1024 + 17)
        sent_at, offset = [], 0
        for size in (1, 999, 65536, 1 << 20, 7, len(data)):  # the last takes the rest
            piece = data[offset : offset + size]
            sent_at.append((time.monotonic(), offset + len(piece)))
            client.transport.write(piece.tobytes())  # type: ignore[union-attr]
            offset += len(piece)
            await asyncio.sleep(0.005)
        await server.until(len(data))
        assert bytes(server.data) == data.tobytes()
        for t_sent, end in sent_at:  # no byte of a piece was seen before that piece was due
            first_seen = min(t for t, n in server.stamps if n > end - 1)
            assert first_seen >= t_sent + DELAY_US / 1e6 - 0.002
    finally:
        listener.close()  # type: ignore[attr-defined]
        client.transport.close()  # type: ignore[union-attr]


async def test_the_end_comes_after_the_data(monkeypatch: pytest.MonkeyPatch) -> None:
    listener, client, server = await delayed_pair(monkeypatch)
    try:
        data = pattern(200_000, seed=1).tobytes()
        client.transport.write(data)  # type: ignore[union-attr]
        client.transport.close()  # type: ignore[union-attr]
        assert await asyncio.wait_for(server.lost, 10) is None
        assert server.eof and bytes(server.data) == data
    finally:
        listener.close()  # type: ignore[attr-defined]


async def test_pausing_holds_the_release_and_resuming_continues(monkeypatch: pytest.MonkeyPatch) -> None:
    listener, client, server = await delayed_pair(monkeypatch, us=1000)
    try:
        st = server.transport
        assert st is not None
        first = pattern(50_000, seed=2).tobytes()
        client.transport.write(first)  # type: ignore[union-attr]
        await server.until(1)
        st.pause_reading()
        seen = len(server.data)
        client.transport.write(b"more")  # type: ignore[union-attr]
        await asyncio.sleep(0.1)  # due long ago, but paused
        assert len(server.data) == seen and not st.is_reading()
        st.resume_reading()
        await server.until(len(first) + 4)
        assert bytes(server.data) == first + b"more"
    finally:
        listener.close()  # type: ignore[attr-defined]
        client.transport.close()  # type: ignore[union-attr]


async def test_a_connection_holds_at_most_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delayline, "HOLD_MAX", 256 * 1024)
    monkeypatch.setattr(delayline, "READ_BYTES", 64 * 1024)
    listener, client, server = await delayed_pair(monkeypatch, us=300_000)
    try:
        data = pattern(4 * 1024 * 1024, seed=3).tobytes()
        client.transport.write(data)  # type: ignore[union-attr]
        await asyncio.sleep(0.2)  # nothing due yet: the line fills, then stops reading
        line = server.transport._line  # type: ignore[union-attr]
        assert line is not None and 0 < line.held <= 256 * 1024
        assert not server.data
        await server.until(len(data), timeout=30)
        assert bytes(server.data) == data
    finally:
        listener.close()  # type: ignore[attr-defined]
        client.transport.close()  # type: ignore[union-attr]


async def test_no_line_without_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(delayline.DELAY_ENV, raising=False)
    listener, client, server = await pair(small_buffers=False)
    try:
        assert client.transport._line is None and server.transport._line is None  # type: ignore[union-attr]
    finally:
        listener.close()
        client.transport.close()  # type: ignore[union-attr]


async def test_collectives_over_delayed_links(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every frame (handshakes, credits, rendezvous, data) goes through the line: a 4-rank
    world connects and runs small and large collectives correctly, and a 4-byte all_reduce
    (two rounds of recursive doubling) takes at least two delays."""
    monkeypatch.setenv("NETCOLL_TRANSPORT", "tcp")
    monkeypatch.setenv(delayline.DELAY_ENV, "5000")
    monkeypatch.setenv("NETCOLL_RECV_WINDOW", "1M")  # large sends go by rendezvous (RTS/CTS) too
    async with connected_world(4, timeout=30) as comms:
        big = [np.full(1 << 20, c.rank + 1, np.float32) for c in comms]
        outs = await asyncio.gather(*(c.all_reduce(b) for c, b in zip(comms, big, strict=True)))
        for out in outs:
            np.testing.assert_array_equal(out, np.full(1 << 20, 10, np.float32))
        t0 = time.monotonic()
        small = await asyncio.gather(*(c.all_reduce(np.array([c.rank], np.int64)) for c in comms))
        assert time.monotonic() - t0 >= 2 * 0.005
        assert [int(s[0]) for s in small] == [6] * 4
        gathered = await asyncio.gather(*(c.all_gather(np.array([c.rank], np.int32)) for c in comms))
        for g in gathered:
            assert g.ravel().tolist() == [0, 1, 2, 3]


async def test_tls_over_a_delayed_connection(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """start_tls swaps the protocol above the line: the TLS handshake and records pass through it."""
    from pathlib import Path

    d = Path(str(tmp_path))
    ca = make_ca(d, "ca")
    server_tls, client_tls = TlsConfig(**issue(ca, d, "server")), TlsConfig(**issue(ca, d, "client"))
    monkeypatch.setenv("NETCOLL_TRANSPORT", "tls")
    monkeypatch.setenv(delayline.DELAY_ENV, "2000")
    async with netcoll.Coordinator(token="delayed-s3cret", tls=server_tls) as coord:

        async def rank(i: int) -> np.ndarray:
            async with netcoll.connect(
                coord.address, world_size=2, rank=i, token="delayed-s3cret", tls=client_tls, timeout=30
            ) as comm:
                return await comm.all_reduce(np.full(100_000, i + 1, np.float32))

        outs = await asyncio.wait_for(asyncio.gather(rank(0), rank(1)), 60)
    for out in outs:
        np.testing.assert_array_equal(out, np.full(100_000, 3, np.float32))


def test_a_bad_setting_fails_before_anything_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    from netcoll.links.listener import Listener

    monkeypatch.setenv(delayline.DELAY_ENV, "-5")
    with pytest.raises(ConfigError, match=delayline.DELAY_ENV):
        Listener(lambda: Sink()).start("127.0.0.1", 0)
