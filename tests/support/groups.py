"""Groups of ranks in this event loop over the in-process mesh or real
loopback TCP: what the ``make_group`` fixture hands out (every algorithm and
link test runs over both)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

from netcoll.comm import Communicator
from netcoll.links import LinkConfig
from netcoll.mesh.certs import TlsConfig
from netcoll.mesh.channel import Channel, Mesh
from netcoll.mesh.inprocess import MemoryHub
from netcoll.mesh.tcpmesh import Listener, TcpMesh
from netcoll.wire import Kind

#: the link kinds :func:`make_group` runs a test over (its ids); a test may add "shm"
#: (``@pytest.mark.parametrize("make_group", ALL_LINKS, indirect=True)``): a socket mesh
#: whose links are shared memory, as netcoll picks them on one host
TRANSPORTS = ("memory", "tcp")
ALL_LINKS = (*TRANSPORTS, "shm")
LOOPBACK = "127.0.0.1"  # tests talk to loopback only
_SESSIONS = itertools.count()


class Group:
    """``size`` ranks in this event loop, linked by one kind of link
    (``"memory"`` or ``"tcp"``): what an algorithm test runs on.

    :meth:`run` opens one operation on every rank (or on ``ranks``) and runs
    ``fn(channel)`` on each concurrently; :meth:`kill` makes a rank's process
    die as its peers see it; :meth:`count_frames` counts the DATA frames each
    rank sends. Make groups with the :func:`make_group` fixture, which closes
    them after the test.
    """

    def __init__(
        self,
        kind: str,
        meshes: list[Mesh],
        *,
        kill: Callable[[int], None],
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self.kind = kind
        self.meshes = meshes
        self.size = len(meshes)
        self.seq = 0
        self._kill = kill
        self._close = close
        self._comms: list[Communicator] = []

    async def run(
        self, fn: Callable[[Channel], Awaitable[Any]], *, ranks: list[int] | None = None, timeout: float = 20.0
    ) -> list[Any]:
        """``fn(ch)`` on every rank in ``ranks`` (default: all), each with a
        :class:`Channel` of one new operation; the results in rank order."""
        seq, self.seq = self.seq, self.seq + 1
        members = tuple(range(self.size))

        async def one(r: int) -> Any:
            t = self.meshes[r]
            op = t.mailbox.open("g", seq, "fp", members, "test")
            try:
                return await fn(Channel(t, op))
            finally:
                t.mailbox.close(op)

        tasks = [asyncio.ensure_future(one(r)) for r in (range(self.size) if ranks is None else ranks)]
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def kill(self, rank: int) -> None:
        """Rank ``rank``'s process dies: its links break without a goodbye,
        so every operation that includes it fails on its peers. (Over TCP the
        group must be made with ``killable=True``.)"""
        self._kill(rank)

    def count_frames(self) -> list[int]:
        """From now on, count the DATA frames each rank sends; returns the
        live per-rank counts."""
        counts = [0] * self.size
        for r, t in enumerate(self.meshes):
            send = t.send

            async def counted(
                peer: int,
                kind: Kind,
                header: dict[str, Any],
                payload: memoryview | None = None,
                *,
                r: int = r,
                send: Any = send,
            ) -> None:
                if kind == Kind.DATA:
                    counts[r] += 1
                await send(peer, kind, header, payload)

            def counted_nowait(
                peer: int, header: dict[str, Any], payload: memoryview, *, r: int = r, nowait: Any = t.send_nowait
            ) -> bool:
                sent: bool = nowait(peer, header, payload)
                counts[r] += sent
                return sent

            t.send = counted  # type: ignore[method-assign]
            t.send_nowait = counted_nowait  # type: ignore[method-assign]
        return counts

    def communicators(self, **kw: Any) -> list[Communicator]:
        """A :class:`Communicator` on every rank (closed with the group)."""
        comms = [Communicator(t, **kw) for t in self.meshes]
        self._comms += comms
        return comms

    async def close(self) -> None:
        for comm in self._comms:
            await comm.close()
        await self._close()


def memory_group(size: int) -> Group:
    hub = MemoryHub(size)

    async def close() -> None:
        for t in hub.meshes:
            await t.close()

    return Group("memory", list(hub.meshes), kill=hub.kill, close=close)


class _Cable:
    """A loopback TCP relay between one dialing rank and one listening rank,
    which :meth:`cut` breaks like a dead host: both sockets reset, no BYE."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.is_cut = False
        self.address: tuple[str, int] = ("", 0)
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._handlers: set[asyncio.Task[Any]] = set()  # one per accepted connection
        self._pumps: set[asyncio.Task[None]] = set()  # two per handler: one each way

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, LOOPBACK, 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = (host, port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._writers.append(writer)
        up_writer: asyncio.StreamWriter | None = None
        try:
            if self.is_cut:
                return
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            self._writers.append(up_writer)
            if self.is_cut:  # cut while it dialed
                return
            pumps = [
                asyncio.ensure_future(self._pump(reader, up_writer)),
                asyncio.ensure_future(self._pump(up_reader, writer)),
            ]
            self._pumps.update(pumps)
            try:
                await asyncio.gather(*pumps, return_exceptions=True)
            finally:
                self._pumps.difference_update(pumps)
        except OSError:
            pass
        finally:
            self._handlers.discard(handler)
            for w in (writer, up_writer):
                if w is not None:
                    if self.is_cut:
                        w.transport.abort()
                    else:
                        w.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 18):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()  # pass a half-close on: the peer's orderly close waits for it

    def cut(self) -> None:
        self.is_cut = True
        for writer in self._writers:
            writer.transport.abort()
        for pump in list(self._pumps):
            pump.cancel()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await asyncio.gather(*self._handlers, return_exceptions=True)


async def tcp_group(
    size: int,
    *,
    killable: bool = False,
    token: str | None = None,
    timeout: float = 10.0,
    links: str = "tcp",
    window: int | None = None,
) -> Group:
    """``size`` ranks over real loopback sockets: one :class:`Listener` per rank,
    as in a process, and a :class:`TcpMesh` mesh of one session whose links
    are ``links``: ``"tcp"``, or ``"shm"`` (what netcoll picks on one host: shared
    memory, its socket for small frames and wake-ups). ``killable``: every link runs
    through a :class:`_Cable`, so :meth:`Group.kill` can cut a rank's links the way
    a dying host does (the relays cost time, so only groups that kill ranks have them).
    ``window``: each link's receive window (default: netcoll's)."""
    transport = "tcp" if links == "tcp" else "auto"
    config = LinkConfig(transport=transport) if window is None else LinkConfig(window=window, transport=transport)
    listeners = [Listener(token=token) for _ in range(size)]
    meshes: list[TcpMesh] = []
    cables: dict[tuple[int, int], _Cable] = {}

    async def close() -> None:
        await asyncio.gather(*(t.close() for t in meshes), return_exceptions=True)
        for cable in cables.values():
            await cable.close()
        for listener in listeners:
            await listener.close()

    def kill(rank: int) -> None:
        if not killable:
            raise RuntimeError("make the group with killable=True to kill a rank over TCP")
        for (a, b), cable in cables.items():
            if rank in (a, b):
                cable.cut()

    try:
        addresses = [await listener.start(LOOPBACK, 0) for listener in listeners]
        session = f"test-{next(_SESSIONS)}"
        for r in range(size):
            peers = list(addresses)
            for j in range(r) if killable else ():  # rank r dials each lower rank j through cable (r, j)
                cable = cables[(r, j)] = _Cable(addresses[j])
                await cable.start()
                peers[j] = cable.address
            meshes.append(
                TcpMesh(listeners[r], rank=r, size=size, session=session, peers=peers, token=token, links=config)
            )
        await asyncio.gather(*(t.connect(timeout) for t in meshes))
    except BaseException:
        await close()
        raise
    kinds = {link.kind for t in meshes for link in t.links.values()}
    if kinds - {links}:  # (a test of one kind of link must not silently run on another)
        await close()
        raise RuntimeError(f"asked for {links} links, got {', '.join(sorted(kinds))}")
    return Group(links, list(meshes), kill=kill, close=close)


class MakeGroup(Protocol):
    """The type of the :func:`make_group` fixture."""

    def __call__(self, size: int, *, killable: bool = False) -> Awaitable[Group]: ...


@asynccontextmanager
async def tcp_mesh(
    n: int,
    *,
    token: str | None = "links-s3cret",
    configs: list[LinkConfig | None] | None = None,
    tls: TlsConfig | None = None,
    timeout: float = 10.0,
) -> AsyncIterator[list[TcpMesh]]:
    """``n`` TcpMeshes in this loop, one Listener each, linked over loopback
    (``configs[r]``: rank r's link settings, None for the default from the
    environment; ``tls``: every listener's)."""
    listeners = [Listener(token=token, tls=tls) for _ in range(n)]
    meshes: list[TcpMesh] = []
    try:
        addresses = [await listener.start(LOOPBACK, 0) for listener in listeners]
        session = f"links-{next(_SESSIONS)}"
        for r in range(n):
            meshes.append(
                TcpMesh(
                    listeners[r],
                    rank=r,
                    size=n,
                    session=session,
                    peers=addresses,
                    token=token,
                    links=(configs or [None] * n)[r],
                )
            )
        async with asyncio.timeout(timeout):
            await asyncio.gather(*(t.connect(10.0) for t in meshes))
        yield meshes
    finally:
        await asyncio.gather(*(t.close() for t in meshes), return_exceptions=True)
        for listener in listeners:
            await listener.close()
