"""CPU per byte of one loopback connection, TLS against plain TCP (issue 36.3): one
process sends ``--size`` messages to itself over a connected pair of netcoll
transports (``TlsTransport`` with the contexts netcoll makes, or ``SocketTransport``),
so its CPU time per message is one rank's send plus one rank's receive of it, with
no collective, no second process and no scheduling in between. CPU time (user +
system) is taken over ``--blocks`` blocks of ``--iters`` messages; the least block is
what the connection costs, since other work on a shared machine only adds to it.

    python3 -m bench.tls_connection                 # tcp and tls, 16 MiB, 8 blocks of 10
    python3 -m bench.tls_connection --kinds tls --size 64M

Needs ``cryptography`` (the ``test`` extra) for the throwaway CA. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile

from bench.tls import make_pki, negotiated
from netcoll.links import tlstransport
from netcoll.links.sockettransport import SocketTransport
from netcoll.mesh.certs import TlsConfig
from netcoll.sizes import format_size, parse_size
from netcoll.testing.sockets import loopback_pair


class _Receiver(asyncio.BufferedProtocol):
    """Reads every message straight into one buffer; ``done`` when one is whole."""

    def __init__(self, size: int) -> None:
        self.buf = memoryview(bytearray(size))
        self.got = 0
        self.done: asyncio.Future[None] | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buf[self.got :]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        if self.got == len(self.buf) and self.done is not None:
            self.got = 0
            self.done.set_result(None)


async def _connect(kind: str, size: int, pki: dict[str, str]) -> tuple[SocketTransport, _Receiver]:
    """The sending transport and the receiving protocol of one connection of ``kind``."""
    loop = asyncio.get_running_loop()
    client, server = await loopback_pair()
    sender, receiver = _Receiver(1), _Receiver(size)
    if kind == "tcp":
        out = SocketTransport(loop, client, sender)
        SocketTransport(loop, server, receiver)
    else:
        config = TlsConfig(pki["NETCOLL_TLS_CERT"], pki["NETCOLL_TLS_KEY"], pki["NETCOLL_TLS_CA"])
        c = tlstransport.wrap(client, config.client_context(), server_side=False, server_hostname=None)
        s = tlstransport.wrap(server, config.server_context(), server_side=True, server_hostname=None)
        await asyncio.gather(tlstransport.handshake(c, 30), tlstransport.handshake(s, 30))
        out = tlstransport.TlsTransport(loop, c, sender)
        tlstransport.TlsTransport(loop, s, receiver)
    out.set_write_buffer_limits(high=4 << 20)
    return out, receiver


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(kind: str, size: int, blocks: int, iters: int, pki: dict[str, str]) -> list[float]:
    """CPU milliseconds per message of each block (after one untimed message, checked
    to arrive intact)."""
    out, receiver = await _connect(kind, size, pki)
    data = memoryview(bytearray(os.urandom(1 << 20)) * max(1, size >> 20))[:size]
    loop = asyncio.get_running_loop()

    async def one() -> None:
        receiver.done = loop.create_future()
        sent = out.writev([data])
        if sent is not None:
            await sent
        await receiver.done

    try:
        await one()
        if receiver.buf != data:
            raise RuntimeError(f"the {kind} message arrived changed")
        per_block = []
        for _ in range(blocks):
            start = _cpu()
            for _ in range(iters):
                await one()
            per_block.append((_cpu() - start) / iters * 1e3)
        return per_block
    finally:
        out.abort()


def main() -> None:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kinds", default="tcp,tls", help="connections to measure, in turn (default tcp,tls)")
    ap.add_argument("--size", default="16M", help="message size (default 16M)")
    ap.add_argument("--blocks", type=int, default=8, help="timed blocks (default 8)")
    ap.add_argument("--iters", type=int, default=10, help="messages per block (default 10)")
    ns = ap.parse_args()
    size = parse_size(ns.size)
    with tempfile.TemporaryDirectory(prefix="netcoll-bench-tlsconn-") as d:
        pki = make_pki(d)
        print(f"TLS negotiates {negotiated(pki)}; load average {os.getloadavg()[0]:.2f}")
        for kind in ns.kinds.split(","):
            ms = asyncio.run(measure(kind, size, ns.blocks, ns.iters, pki))
            print(
                f"{kind}: CPU per {format_size(size)} message sent and received: "
                f"least {min(ms):.2f} ms, median {statistics.median(ms):.2f} ms (blocks of {ns.iters})"
            )


if __name__ == "__main__":
    main()
