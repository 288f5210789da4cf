"""The asyncio floor for a small all_reduce: what any program that wakes an
asyncio loop per message pays on this machine (docs/performance.md).

P processes (a power of two), each one asyncio loop, do recursive-doubling
all_reduce of a 4-byte float32 over loopback TCP with the least machinery that
still works: an ``asyncio.Protocol`` per peer, a 16-byte struct header, a
future per receive, ``np.add``. No deadlines, flow control, failure handling,
checks or stats. netcoll's latency is compared with this, not with zero.

``--shm`` is the same over shared memory, with no system call per message: a
slot per ordered pair (and call parity) in one shared mapping, polled by the
loop's selector (netcoll's ``SpinSelector``, which yields the CPU between
polls) instead of sockets; a waiting loop sleeps at most 1 ms at a time
instead of being rung. The floor of netcoll's shared-memory lanes.

    python3 bench/floor.py --ranks 4 --iters 2000 [--shm]

Prints the median time per call of the slowest rank. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import multiprocessing as mp
import socket
import struct
import time
from typing import Any

import numpy as np

from netcoll.loop import SpinSelector

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

    async def exchange(p: int, n: int, out: np.ndarray) -> np.ndarray:
        fut = links[p].recv(n)
        links[p].transport.write(HEADER.pack(0, out.nbytes, n) + out.tobytes())
        return np.frombuffer(await fut, np.float32)

    await _timed(peers, exchange, iters, size, results)
    await asyncio.sleep(0.5)  # the peers finish their last calls before the connections go
    server.close()


def _main(r: int, size: int, iters: int, ports: Any, results: Any) -> None:
    asyncio.run(_rank(r, size, iters, ports, results))


SLOT = struct.Struct("<Qf")  # sequence number (0: empty), value; one 64-byte line per slot


class _Slots:
    """Rank ``r``'s slots in ``memory``: it writes (r, p, parity), reads (p, r, parity)."""

    def __init__(self, memory: mmap.mmap, r: int, size: int, peers: list[int]) -> None:
        self.memory, self.r, self.size, self.peers = memory, r, size, peers
        self.seen = {(p, parity): 0 for p in peers for parity in (0, 1)}
        self.waiters: dict[tuple[int, int], asyncio.Future[float]] = {}
        self.arrived: dict[tuple[int, int], float] = {}

    def at(self, src: int, dst: int, seq: int) -> int:
        return ((src * self.size + dst) * 2 + seq % 2) * 64

    def poll(self) -> bool:
        got = False
        for p in self.peers:
            for parity in (0, 1):
                seq, value = SLOT.unpack_from(self.memory, self.at(p, self.r, parity))
                if seq > self.seen[p, parity]:
                    self.seen[p, parity] = seq
                    fut = self.waiters.pop((p, seq), None)
                    if fut is None:
                        self.arrived[p, seq] = value
                    else:
                        fut.set_result(value)
                    got = True
        return got

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass


class _CappedSelector(SpinSelector):
    """Never blocks longer than 1 ms: nothing rings a sleeping rank here."""

    def _block(self, timeout: float | None) -> list[Any]:
        return super()._block(0.001 if timeout is None else min(timeout, 0.001))


def _shm_main(r: int, size: int, iters: int, memory: mmap.mmap, results: Any) -> None:
    peers = [r ^ (1 << k) for k in range(size.bit_length() - 1)]
    slots, selector = _Slots(memory, r, size, peers), _CappedSelector()
    selector.add_poller(slots)
    loop = asyncio.SelectorEventLoop(selector)

    async def exchange(p: int, n: int, out: np.ndarray) -> np.float32:
        fut = loop.create_future()
        if (p, n) in slots.arrived:
            fut.set_result(slots.arrived.pop((p, n)))
        else:
            slots.waiters[p, n] = fut
        SLOT.pack_into(memory, slots.at(r, p, n), n, float(out[0]))
        return np.float32(await fut)

    async def run() -> None:
        await _timed(peers, exchange, iters, size, results)
        await asyncio.sleep(0.5)

    try:
        loop.run_until_complete(run())
    finally:
        loop.close()


async def _timed(peers: list[int], exchange: Any, iters: int, size: int, results: Any) -> None:
    """Recursive doubling of a 4-byte float32 with ``exchange(peer, call, out)``
    (send ``out``, return the peer's value; ``call`` numbers the calls, from 1),
    timed; the median goes to ``results``."""
    x = np.ones(1, np.float32)
    out = np.empty_like(x)
    calls = 0

    async def all_reduce() -> None:
        nonlocal calls
        calls += 1
        out[:] = x
        for p in peers:
            np.add(out, await exchange(p, calls, out), out=out)

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4, help="processes, a power of two (default 4)")
    parser.add_argument("--iters", type=int, default=2000, help="timed calls (default 2000)")
    parser.add_argument("--shm", action="store_true", help="shared-memory slots polled by the loop, not TCP")
    args = parser.parse_args(argv)
    if args.ranks < 2 or args.ranks & (args.ranks - 1):
        parser.error("--ranks must be a power of two >= 2")
    ctx = mp.get_context("fork")  # the shared mapping is inherited
    ports = ctx.Array("i", args.ranks)
    memory = mmap.mmap(-1, args.ranks * args.ranks * 2 * 64)
    results: Any = ctx.Queue()
    target, shared = (_shm_main, memory) if args.shm else (_main, ports)
    procs = [ctx.Process(target=target, args=(r, args.ranks, args.iters, shared, results)) for r in range(args.ranks)]
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
    kind = " (shared memory)" if args.shm else ""
    print(
        f"asyncio floor{kind}, {args.ranks} processes, 4-byte all_reduce: median per call "
        f"{max(medians):.0f} µs (slowest rank; per rank {[round(m) for m in medians]})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
