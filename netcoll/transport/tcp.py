"""TCP transport: a full mesh of framed, authenticated links between ranks.

One :class:`Listener` (one port) per process accepts every peer link and
routes it, by the session id in the peer's HELLO, to the :class:`TcpTransport`
of that rendezvous (a process may run several in turn, e.g. one per epoch).

Dialer rule: rank *i* dials every rank *j < i* and accepts from every
*j > i*, so each pair has exactly one connection and nobody races. The
acceptor refuses a second link from the same rank, ranks out of range, and
any rank that should have waited to be dialed.

A broken link fails the operations that involve the lost peer (see
:meth:`Mailbox.peer_lost`); an orderly close announces itself with BYE first.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np

from .. import wire
from ..errors import CommunicatorClosed, PeerLost, ProtocolError, RendezvousError
from ..wire import Frame, Kind
from .base import Transport
from .connection import FramedProtocol, Server, client_handshake, open_connection, server_handshake

CONNECT_RETRY = 0.05
FRESH_EMPTY_MIN = 64 * 1024
#: how long an incoming peer link waits for its session to be set up here
#: (the peer may have finished the rendezvous a moment before us)
SESSION_WAIT = 10.0


def _fresh(nbytes: int) -> memoryview | None:
    """A buffer for a payload nobody posted a receive for yet: uninitialized
    memory for large ones (``bytearray`` would zero it first, a wasted pass)."""
    return memoryview(np.empty(nbytes, dtype=np.uint8)) if nbytes >= FRESH_EMPTY_MIN else None


class Listener:
    """The process's single peer port."""

    def __init__(self, *, token: str | None = None, limits: wire.Limits = wire.DEFAULT_LIMITS) -> None:
        self.token = token
        self.limits = limits
        self._server = Server(self._on_accept, limits)
        self._meshes: dict[str, TcpTransport] = {}
        self._registered: dict[str, asyncio.Event] = {}
        self.address: tuple[str, int] = ("", 0)

    async def start(self, host: str = "0.0.0.0", port: int = 0) -> tuple[str, int]:
        self.address = await self._server.start(host, port)
        return self.address

    def register(self, session: str, mesh: TcpTransport) -> None:
        self._meshes[session] = mesh
        self._registered.setdefault(session, asyncio.Event()).set()

    def unregister(self, session: str) -> None:
        self._meshes.pop(session, None)
        self._registered.pop(session, None)

    async def close(self) -> None:
        await self._server.close()

    async def _on_accept(self, proto: FramedProtocol) -> None:
        found: list[TcpTransport] = []

        async def accept(hello: dict[str, Any]) -> dict[str, Any]:
            session, rank = hello.get("session"), hello.get("rank")
            if hello.get("role") != "peer" or not isinstance(session, str) or not isinstance(rank, int):
                raise ProtocolError("peer HELLO must carry role='peer', session and rank")
            event = self._registered.setdefault(session, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), SESSION_WAIT)
            except TimeoutError:
                self._registered.pop(session, None)
                raise RendezvousError(f"no group session {session!r} on this rank") from None
            mesh = self._meshes[session]
            mesh.check_incoming(rank)
            found.append(mesh)
            return {"rank": mesh.rank}

        hello = await server_handshake(proto, token=self.token, role="rank", accept=accept)
        found[0].attach(hello["rank"], proto)


class TcpTransport(Transport):
    """Links to every other rank of one rendezvous session.

    Args:
        listener: this process's peer port (already started).
        rank, size: this rank and the world size.
        session: the rendezvous session id (peers' HELLOs must name it).
        peers: ``(host, port)`` of every rank's listener, indexed by rank.
        token: shared secret for peer authentication.
    """

    def __init__(self, listener: Listener, *, rank: int, size: int, session: str,
                 peers: list[tuple[str, int]], token: str | None = None) -> None:
        super().__init__(rank, size)
        self.listener = listener
        self.session = session
        self.peers = peers
        self.token = token
        self.links: dict[int, FramedProtocol] = {}
        self._bye: set[int] = set()
        self._all_linked = asyncio.Event()
        self.mailbox.divert = self._divert
        if size == 1:
            self._all_linked.set()

    async def connect(self, timeout: float) -> None:
        """Dial lower ranks, wait for higher ranks to dial us; all within ``timeout``."""
        self.listener.register(self.session, self)
        dials = [asyncio.create_task(self._dial(j, timeout)) for j in range(self.rank)]
        try:
            async with asyncio.timeout(timeout):
                if dials:
                    await asyncio.gather(*dials)
                await self._all_linked.wait()
        except TimeoutError:
            missing = sorted(set(range(self.size)) - set(self.links) - {self.rank})
            raise RendezvousError(
                f"rank {self.rank} could not link to ranks {missing} within {timeout:g}s "
                f"(addresses {[f'{self.peers[m][0]}:{self.peers[m][1]}' for m in missing]}; "
                "check that they are reachable from here and not blocked by a firewall)") from None
        finally:
            for task in dials:
                task.cancel()

    async def _dial(self, peer: int, timeout: float) -> None:
        host, port = self.peers[peer]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                proto = await open_connection(host, port, limits=self.listener.limits)
                break
            except OSError:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(CONNECT_RETRY)
        try:
            welcome = await client_handshake(proto, token=self.token, role="peer",
                                             hello={"session": self.session, "rank": self.rank,
                                                    "size": self.size})
        except BaseException:
            proto.close()
            raise
        if welcome.get("rank") != peer:
            proto.close()
            raise RendezvousError(f"{host}:{port} answered as rank {welcome.get('rank')}, expected rank {peer}")
        self.attach(peer, proto)

    def check_incoming(self, peer: int) -> None:
        """Refuse an incoming link that breaks the dialer rule or duplicates one."""
        if self.closed:
            raise CommunicatorClosed("this rank is closing")
        if not self.rank < peer < self.size:
            raise RendezvousError(f"rank {peer} may not dial rank {self.rank} (world size {self.size}; "
                                  "higher ranks dial lower ones)")
        if peer in self.links:
            raise RendezvousError(f"rank {peer} is already linked to rank {self.rank}")

    def attach(self, peer: int, proto: FramedProtocol) -> None:
        self.links[peer] = proto
        mailbox = self.mailbox
        proto.decoder.sink = lambda kind, header, n: (mailbox.sink(peer, header, n) or _fresh(n)
                                                      if kind == Kind.DATA else None)
        proto.on_lost = functools.partial(self._on_lost, peer)
        proto.on_frame = functools.partial(self._on_frame, peer)
        while proto.queue:
            self._on_frame(peer, proto.queue.popleft())
        if proto.lost is not None:
            self._on_lost(peer, proto.lost)
        if len(self.links) == self.size - 1:
            self._all_linked.set()

    def _divert(self, peer: int) -> None:
        link = self.links.get(peer)
        if link is not None:
            link.decoder.divert()

    def _on_frame(self, peer: int, frame: Frame) -> None:
        kind = frame.kind
        if kind == Kind.DATA:
            self.mailbox.deliver(peer, frame.header, frame.payload)
        elif kind == Kind.ABORT:
            self.mailbox.on_abort(peer, frame.header)
        elif kind == Kind.BYE:  # the peer is leaving and reads until we close our side too
            self._bye.add(peer)
            self.links[peer].close()
        elif kind == Kind.PING:
            try:
                self.links[peer].write(Kind.PONG, {})
            except ConnectionError:
                pass  # the link is closing: its loss is reported on its own
        elif kind != Kind.PONG:
            self.links[peer].fail(ProtocolError(f"unexpected {kind.name} frame on a peer link"), tell_peer=True)

    def _on_lost(self, peer: int, exc: BaseException | None) -> None:
        if not self.closed:
            self.mailbox.peer_lost(peer, exc, graceful=peer in self._bye)

    async def send(self, peer: int, kind: Kind, header: dict[str, Any], payload: memoryview | None = None) -> None:
        link = self.links.get(peer)
        if link is None or link.lost is not None or link.transport is None or link.transport.is_closing():
            if self.closed:
                raise CommunicatorClosed("transport is closed")
            cause = self.mailbox.dead.get(peer) or (link.lost if link else None) or (
                "connection closing" if link else "not linked")
            raise PeerLost(f"no connection to rank {peer}: {cause}", ranks=(peer,))
        try:
            await link.send(kind, header, payload)
        except ConnectionError as exc:  # the link broke (or the peer left) under this send
            if self.closed:
                raise CommunicatorClosed("transport is closed") from None
            raise PeerLost(f"lost connection to rank {peer}: {exc}", ranks=(peer,)) from None

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.listener.unregister(self.session)
        self.mailbox.fail_all(lambda op: CommunicatorClosed(f"{op.where()}: communicator closed"))
        # Lingering close: say BYE, shut down our sending side, and keep reading
        # until the peer closes too. Closing with unread bytes would send a TCP
        # reset, which can destroy what we sent before the peer has read it.
        for link in self.links.values():
            if link.lost is None and link.transport is not None:
                try:
                    link.write(Kind.BYE, {})
                    if link.transport.can_write_eof():
                        link.transport.write_eof()
                    else:
                        link.close()
                except Exception:  # noqa: BLE001
                    link.close()
        waits = [link.closed for link in self.links.values()]
        if waits:
            done, pending = await asyncio.wait(waits, timeout=2.0)
            for link in self.links.values():
                if not link.closed.done():
                    link.abort()
