"""The in-process mesh: N ranks as tasks in one event loop, for testing
algorithms and the Communicator without sockets.

Every pair of ranks is joined by a :class:`~netcoll.links.memory.MemoryLink`
pair: frames are delivered synchronously and in order per (src, dst) link,
through the same mailbox sink/deliver path and the same flow control as TCP
(so posted buffers receive payloads directly, and a rank's unexpected bytes
per peer stay under its receive window). ``send`` copies the payload, like a
real link, so the sender may reuse its buffer. :meth:`MemoryHub.kill`
simulates a rank's process dying.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import CommunicatorClosed, PeerLost
from ..links.factory import DEFAULT_WINDOW, LinkConfig, LinkFactory
from ..links.memory import MemoryLink
from ..wire import Kind
from .channel import Mesh


class MemoryHub:
    """Creates and connects ``size`` :class:`InProcessMesh` objects.

    Args:
        size: the number of ranks.
        window: every rank's receive window in bytes (default 64 MiB).
    """

    def __init__(self, size: int, *, window: int = DEFAULT_WINDOW) -> None:
        self.size = size
        self.config = LinkConfig(window=window)
        self.meshes = [InProcessMesh(r, size, self) for r in range(size)]
        self.decider = LocalDecider()  # (partial all_reduce: the ranks of this hub agree through it)
        for mesh in self.meshes:
            mesh.decider = self.decider
        factory = LinkFactory(self.config, offers=("memory",))  # in-process: NETCOLL_TRANSPORT does not apply
        factory.register("memory", MemoryLink)
        caps = factory.capabilities()
        kind = factory.choose(caps)
        for i in range(size):
            for j in range(i + 1, size):
                ti, tj = self.meshes[i], self.meshes[j]
                at_i = factory.make(kind, peer=j, mailbox=ti.mailbox, window=window, peer_window=caps.window)
                at_j = factory.make(kind, peer=i, mailbox=tj.mailbox, window=window, peer_window=caps.window)
                MemoryLink.join(at_i, at_j)  # type: ignore[arg-type]
                ti.attach(at_i)
                tj.attach(at_j)

    def kill(self, rank: int) -> None:
        """Drop rank ``rank`` as if its process died: its peers see the link break."""
        t = self.meshes[rank]
        if t.closed:
            return
        t.closed = True
        t.mailbox.fail_all(
            lambda op: PeerLost(
                f"{op.where()}: this rank was killed", op=op.name, seq=op.seq, ranks=(op.rank_of[rank],)
            )
        )
        t.sever(ConnectionResetError("peer process died"))


class LocalDecider:
    """The decider of a partial all_reduce (:data:`~.channel.Decide`) for ranks in one
    process: the first proposal for a ``(group id, seq)`` wins. Keeps the last
    :data:`KEPT` decisions; one asked after it forgot raises ``LookupError``."""

    KEPT = 4096

    def __init__(self) -> None:
        self.decided: dict[tuple[str, int], tuple[int, ...]] = {}
        self.floor: dict[str, int] = {}  # group id -> the highest seq forgotten

    async def __call__(self, group: str, seq: int, proposal: tuple[int, ...], timeout: float) -> tuple[int, ...]:
        if seq <= self.floor.get(group, -1):
            raise LookupError(f"the decision of {group!r} #{seq} was forgotten (over {self.KEPT} ago)")
        agreed = self.decided.setdefault((group, seq), tuple(proposal))
        if len(self.decided) > self.KEPT:
            (g, q), _ = next(iter(self.decided.items()))
            del self.decided[(g, q)]
            self.floor[g] = max(self.floor.get(g, -1), q)
        return agreed


class InProcessMesh(Mesh):
    def __init__(self, rank: int, size: int, hub: MemoryHub) -> None:
        super().__init__(rank, size)
        self.hub = hub
        self.frames_sent = 0

    async def send(self, peer: int, kind: Kind, header: dict[str, Any], payload: memoryview | None = None) -> None:
        self.check_open()
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"no link from rank {self.rank} to rank {peer}")
        if kind is not Kind.DATA and kind is not Kind.ABORT:
            raise ValueError(f"memory transport carries DATA and ABORT frames, not {kind.name}")
        if peer in self.mailbox.dead:
            raise PeerLost(f"rank {peer} is gone", ranks=(peer,))
        self.frames_sent += 1
        await super().send(peer, kind, header, payload)
        if self.frames_sent % 4 == 0:
            await asyncio.sleep(0)  # let other ranks run, like a real network would

    def sever(self, cause: BaseException) -> None:
        """Break every link of this rank without BYE: the peers see it lost."""
        for link in self.links.values():
            if isinstance(link, MemoryLink):
                link.sever(cause)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.mailbox.fail_all(lambda op: CommunicatorClosed(f"{op.where()}: transport closed"))
        self.sever(ConnectionResetError("peer closed its transport"))
