"""The TCP mesh: a full mesh of framed, authenticated links between ranks.

One :class:`Listener` (one port) per process accepts every peer link and
routes it, by the session id in the peer's HELLO, to the :class:`TcpMesh`
of that rendezvous (a process may run several in turn, e.g. one per epoch).

Dialer rule: rank *i* dials every rank *j < i* and accepts from every
*j > i*, so each pair has exactly one connection and nobody races. The
acceptor refuses a second link from the same rank, ranks out of range, and
any rank that should have waited to be dialed.

Each side announces its link capabilities (``link``: version, kinds, receive
window) in the HELLO / WELCOME of the peer handshake; the
:class:`~netcoll.links.factory.LinkFactory` picks the link kind for the pair
from both and makes the link that carries the pair's frames with flow
control: a :class:`~netcoll.links.tcp.TcpLink`, or, with TLS configured on the
listener, a :class:`~netcoll.links.tls.TlsLink` (TLS is then the only socket
kind offered: never a fallback to plain TCP; ``NETCOLL_TRANSPORT=tcp`` is
refused), or a :class:`~netcoll.links.shm.ShmLink` for a peer on this host.

Shared memory is proven, not guessed from host names: the dialer makes a
segment (:class:`~netcoll.links.shmring.Segment`) and offers its name and a
random nonce in its HELLO (``link.shm``, inside TLS when configured); the
acceptor offers SHM in its WELCOME only if it could map that file and read
the nonce there (then it unlinks the file at once). Each side announces SHM
only when it can make the link, so both pick the same kind; when they pick
another, both log why at INFO and ``link_stats()`` shows the kind used.
A broken link fails the operations that involve the lost peer (see
:meth:`Mailbox.peer_lost`); an orderly close announces itself with BYE first.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .. import wire
from ..errors import CommunicatorClosed, ProtocolError, RendezvousError
from ..links import cma, shm
from ..links.base import Link
from ..links.connection import FramedProtocol, open_connection
from ..links.factory import Capabilities, LinkConfig, LinkFactory
from ..links.shmring import SHM_DIR, Segment, auto_ring
from ..links.tcp import TcpLink
from ..links.tls import TlsLink
from . import auth
from .certs import TlsConfig
from .channel import Mesh
from .handshake import client_handshake, server_handshake
from .server import Server

log = logging.getLogger("netcoll.transport")

CONNECT_RETRY = 0.05
#: how long an incoming peer link waits for its session to be set up here
#: (the peer may have finished the rendezvous a moment before us)
SESSION_WAIT = 10.0


class Listener:
    """The process's single peer port."""

    def __init__(
        self,
        *,
        token: str | None = None,
        limits: wire.FrameLimits = wire.DEFAULT_LIMITS,
        tls: TlsConfig | None = None,
        insecure: bool = False,
    ) -> None:
        self.token = token
        self.limits = limits
        #: with TLS every peer link is a TLS link (peers must use TLS too; no plain TCP fallback)
        self.tls = tls
        self.insecure = insecure
        self._server = Server(self._on_accept, limits, tls=tls)
        self._meshes: dict[str, TcpMesh] = {}
        self._registered: dict[str, asyncio.Event] = {}
        self.address: tuple[str, int] = ("", 0)

    async def start(self, host: str = "0.0.0.0", port: int = 0) -> tuple[str, int]:
        """Listen; :class:`~netcoll.InsecureListenerError` for a non-loopback ``host``
        with neither a token nor TLS unless ``insecure`` (secure by default)."""
        auth.require_credentials("peer links", host, token=self.token, tls=self.tls, insecure=self.insecure)
        self.address = await self._server.start(host, port)
        return self.address

    def register(self, session: str, mesh: TcpMesh) -> None:
        self._meshes[session] = mesh
        self._registered.setdefault(session, asyncio.Event()).set()

    def unregister(self, session: str) -> None:
        self._meshes.pop(session, None)
        self._registered.pop(session, None)

    async def close(self) -> None:
        await self._server.close()

    async def _on_accept(self, proto: FramedProtocol) -> None:
        found: list[tuple[TcpMesh, Capabilities, str, Segment | None]] = []

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
            theirs = Capabilities.from_wire(hello.get("link"), f"rank {rank}")
            segment, link = mesh.accept_shm(rank, theirs)  # refuses a peer we share no kind with
            found.append((mesh, theirs, link["kind"], segment))
            return {"rank": mesh.rank, "link": link["caps"]}

        try:
            hello = await server_handshake(proto, token=self.token, role="rank", accept=accept)
            mesh, theirs, kind, segment = found[0]
            mesh.attach(mesh.make_link(hello["rank"], proto, theirs, kind, segment))
        except BaseException:
            for *_, segment in found:
                if segment is not None:
                    segment.close()
            raise


class TcpMesh(Mesh):
    """Links to every other rank of one rendezvous session.

    Args:
        listener: this process's peer port (already started).
        rank, size: this rank and the world size.
        session: the rendezvous session id (peers' HELLOs must name it).
        peers: ``(host, port)`` of every rank's listener, indexed by rank.
        token: shared secret for peer authentication.
        links: link settings (receive window, forced kind); default
            :meth:`LinkConfig.from_env` (``NETCOLL_RECV_WINDOW``, ``NETCOLL_TRANSPORT``).
    """

    def __init__(
        self,
        listener: Listener,
        *,
        rank: int,
        size: int,
        session: str,
        peers: list[tuple[str, int]],
        token: str | None = None,
        links: LinkConfig | None = None,
    ) -> None:
        super().__init__(rank, size)
        self.listener = listener
        self.session = session
        self.peers = peers
        self.token = token
        self.config = links if links is not None else LinkConfig.from_env()
        #: TLS is the listener's: with it, links are TLS links, never plain TCP
        self.tls = listener.tls
        kind = "tcp" if self.tls is None else "tls"
        if self.config.transport == "shm" and not shm.possible():
            raise ValueError(f"NETCOLL_TRANSPORT=shm, but this host has no {SHM_DIR} directory")
        self.factory = LinkFactory(self.config, offers=("shm", kind) if shm.possible() else (kind,))
        self.factory.register(kind, TcpLink if self.tls is None else TlsLink)
        self.factory.register("shm", shm.ShmLink)
        #: the ``link`` map this rank announces in its HELLO / WELCOME
        self.capabilities = self.factory.capabilities().to_wire()
        self._all_linked = asyncio.Event()
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
                "check that they are reachable from here and not blocked by a firewall)"
            ) from None
        finally:
            for task in dials:
                task.cancel()

    async def _dial(self, peer: int, timeout: float) -> None:
        host, port = self.peers[peer]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                proto = await open_connection(host, port, limits=self.listener.limits, tls=self.tls, timeout=timeout)
                break
            except OSError:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(CONNECT_RETRY)
        link: Link | None = None
        try:
            segment, caps = self._offer_shm(peer)
        except BaseException:
            proto.close()
            raise
        try:
            welcome = await client_handshake(
                proto,
                token=self.token,
                role="peer",
                hello={"session": self.session, "rank": self.rank, "size": self.size, "link": caps},
            )
            if welcome.get("rank") != peer:
                raise RendezvousError(f"{host}:{port} answered as rank {welcome.get('rank')}, expected rank {peer}")
            theirs = Capabilities.from_wire(welcome.get("link"), f"rank {peer}")
            kind = self.factory.choose(theirs, () if segment is not None else ("shm",))
            if segment is not None and kind != "shm":
                self._no_shm(peer, theirs.extra.get("shm_refused") or f"rank {peer} does not offer it")
            link = self.make_link(peer, proto, theirs, kind, segment)
        except BaseException:
            proto.close()
            raise
        finally:
            if segment is not None:
                segment.unlink()  # the peer has mapped it (or will not): nothing left to leak
                if link is None or link.kind != "shm":
                    segment.close()
        self.attach(link)

    def _offer_shm(self, peer: int) -> tuple[Segment | None, dict[str, Any]]:
        """A new segment for the link to ``peer`` and the ``link`` map offering it
        (no segment, and no SHM bit, when shared memory is off or impossible)."""
        if "shm" not in self.factory.offers:
            return None, self.capabilities
        segment, why = shm.make_segment(self.config.shm_bytes or auto_ring(self.size - 1))
        if segment is None:
            if self.config.transport == "shm":
                raise RendezvousError(f"NETCOLL_TRANSPORT=shm, but rank {self.rank} cannot use shared memory: {why}")
            self._no_shm(peer, why)
            return None, self.factory.capabilities(("shm",)).to_wire()
        return segment, {**self.capabilities, "shm": segment.offer()}

    def accept_shm(self, peer: int, theirs: Capabilities) -> tuple[Segment | None, dict[str, Any]]:
        """Map the segment ``peer`` offers, if any; the pair's kind and this side's
        ``link`` map for the WELCOME (ProtocolError: no kind in common)."""
        segment, why = shm.attach_segment(theirs, peer) if "shm" in self.factory.offers else (None, "")
        exclude = () if segment is not None else ("shm",)
        try:
            kind = self.factory.choose(theirs, exclude)
        except ProtocolError as exc:
            if segment is not None:
                segment.close()
            raise ProtocolError(f"{exc}{f'; shared memory with rank {peer}: {why}' if why else ''}") from None
        caps = self.factory.capabilities(exclude).to_wire()
        if why:
            caps["shm_refused"] = why
            self._no_shm(peer, why)
        return segment, {"kind": kind, "caps": caps}

    def _no_shm(self, peer: int, why: str) -> None:
        log.info("rank %d: no shared memory with rank %d, linking over the socket: %s", self.rank, peer, why)

    def check_incoming(self, peer: int) -> None:
        """Refuse an incoming link that breaks the dialer rule or duplicates one."""
        if self.closed:
            raise CommunicatorClosed("this rank is closing")
        if not self.rank < peer < self.size:
            raise RendezvousError(
                f"rank {peer} may not dial rank {self.rank} (world size {self.size}; higher ranks dial lower ones)"
            )
        if peer in self.links:
            raise RendezvousError(f"rank {peer} is already linked to rank {self.rank}")

    def make_link(
        self,
        peer: int,
        proto: FramedProtocol,
        theirs: Capabilities,
        kind: str | None = None,
        segment: Segment | None = None,
    ) -> Link:
        """The link to ``peer`` over ``proto``, of the kind both sides' capabilities
        pick (``kind``, when already chosen; ``segment``: the pair's shared memory)."""
        kind = kind or self.factory.choose(theirs, () if segment is not None else ("shm",))
        extra: dict[str, Any] = {}
        if kind == "shm":
            if segment is None:
                raise ProtocolError(f"an shm link to rank {peer} without a segment")
            extra["segment"] = segment
        return self.factory.make(
            kind,
            peer=peer,
            proto=proto,
            mailbox=self.mailbox,
            window=self.config.window,
            peer_window=theirs.window,
            **extra,
        )

    def attach(self, link: Link) -> None:
        super().attach(link)
        local = [other for other in self.links.values() if isinstance(other, shm.ShmLink)]
        lending = cma.lends(1 + len(local))  # (a peer on this host is one with a shared-memory link)
        for other in local:
            other.lending = lending
        if len(self.links) == self.size - 1:
            self._all_linked.set()

    async def close(self) -> None:
        if self.closed:
            return
        self.listener.unregister(self.session)
        await super().close()
