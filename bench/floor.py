"""The asyncio floor for a small all_reduce: what any program that wakes an
asyncio loop per message pays on this machine (docs/performance.md).

P processes (a power of two), each one asyncio loop, do recursive-doubling
all_reduce of a 4-byte float32 over loopback TCP with the least machinery that
still works: an ``asyncio.Protocol`` per peer, a 16-byte struct header, a
future per receive, ``np.add``. No deadlines, flow control, failure handling,
checks or stats. netcoll's latency is compared with this, not with zero.

    python3 bench/floor.py --ranks 4 --iters 2000

Prints the median time per call of the slowest rank. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import socket
import struct
import time
from typing import Any

import numpy as np

HEADER = struct.Struct("!IIQ")  # tag, payload bytes, sequence number
WARMUP = 300


class Peer(asyncio.Protocol):
    """One peer's connection: frames in, a future per expected sequence number."""

    def __init__(self, accepted: bool = False) -> None:
        self.waiters: dict[int, asyncio.Future[bytes]] = {}
        self.arrived: dict[int, bytes] = {}
        self.buf = b""
        self.peer: int | None = None
        self.need_id = accepted  # an accepted connection starts with the dialer's rank
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        b = self.buf + data if self.buf else data
        if self.need_id:
            if len(b) < 4:
                self.buf = b
                return
            self.peer, b, self.need_id = struct.unpack("!I", b[:4])[0], b[4:], False
        pos = 0
        while len(b) - pos >= HEADER.size:
            _, n, seq = HEADER.unpack_from(b, pos)
            if len(b) - pos - HEADER.size < n:
                break
            payload = b[pos + HEADER.size : pos + HEADER.size + n]
            pos += HEADER.size + n
            fut = self.waiters.pop(seq, None)
            if fut is None:
                self.arrived[seq] = payload
            else:
                fut.set_result(payload)
        self.buf = b[pos:]

    def recv(self, seq: int) -> asyncio.Future[bytes]:
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        if seq in self.arrived:
            fut.set_result(self.arrived.pop(seq))
        else:
            self.waiters[seq] = fut
        return fut


async def _rank(r: int, size: int, iters: int, ports: Any, results: Any) -> None:
    loop = asyncio.get_running_loop()
    peers = [r ^ (1 << k) for k in range(size.bit_length() - 1)]
    accepted: list[Peer] = []

    def accept() -> Peer:
        accepted.append(Peer(accepted=True))
        return accepted[-1]

    server = await loop.create_server(accept, "127.0.0.1", 0)
    ports[r] = server.sockets[0].getsockname()[1]
    while 0 in list(ports):  # noqa: ASYNC110 - the other processes fill it in
        await asyncio.sleep(0.01)
    links: dict[int, Peer] = {}
    for p in peers:
        if p > r:
            _, proto = await loop.create_connection(Peer, "127.0.0.1", ports[p])
            proto.transport.write(struct.pack("!I", r))
            links[p] = proto
    while len(links) < len(peers):
        await asyncio.sleep(0.01)
        links.update({a.peer: a for a in accepted if a.peer is not None})
    x = np.ones(1, np.float32)
    out = np.empty_like(x)
    seq = 0

    async def all_reduce() -> None:
        nonlocal seq
        out[:] = x
        for p in peers:
            fut = links[p].recv(seq)
            links[p].transport.write(HEADER.pack(0, out.nbytes, seq) + out.tobytes())
            np.add(out, np.frombuffer(await fut, np.float32), out=out)
            seq += 1

    for _ in range(WARMUP):
        await all_reduce()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        await all_reduce()
        times.append(time.perf_counter() - t0)
    assert out[0] == size, out
    times.sort()
    results.put(times[len(times) // 2] * 1e6)
    await asyncio.sleep(0.5)  # the peers finish their last calls before the connections go
    server.close()


def _main(r: int, size: int, iters: int, ports: Any, results: Any) -> None:
    asyncio.run(_rank(r, size, iters, ports, results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4, help="processes, a power of two (default 4)")
    parser.add_argument("--iters", type=int, default=2000, help="timed calls (default 2000)")
    args = parser.parse_args(argv)
    if args.ranks < 2 or args.ranks & (args.ranks - 1):
        parser.error("--ranks must be a power of two >= 2")
    ports = mp.Array("i", args.ranks)
    results: Any = mp.Queue()
    procs = [mp.Process(target=_main, args=(r, args.ranks, args.iters, ports, results)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    try:
        medians = [results.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    print(
        f"asyncio floor, {args.ranks} processes, 4-byte all_reduce: median per call "
        f"{max(medians):.0f} µs (slowest rank; per rank {[round(m) for m in medians]})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
