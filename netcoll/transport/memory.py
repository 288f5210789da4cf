"""In-memory transport: N ranks as tasks in one event loop, for testing
algorithms and the Communicator without sockets.

Frames are delivered synchronously and in order per (src, dst) link, through
the same :class:`Mailbox` sink/deliver path the TCP transport uses (so posted
buffers receive payloads directly). ``send`` copies the payload, like a real
transport, so the sender may reuse its buffer. :meth:`MemoryHub.kill`
simulates a rank's process dying.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import CommunicatorClosed, PeerLost
from ..wire import Kind
from .base import Transport


class MemoryHub:
    """Creates and connects ``size`` :class:`MemoryTransport` objects."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.transports = [MemoryTransport(r, size, self) for r in range(size)]

    def kill(self, rank: int) -> None:
        """Drop rank ``rank`` as if its process died: its peers see the link break."""
        t = self.transports[rank]
        if t.closed:
            return
        t.closed = True
        t.mailbox.fail_all(lambda op: PeerLost(f"{op.where()}: this rank was killed", op=op.name,
                                               seq=op.seq, ranks=(op.rank_of[rank],)))
        for other in self.transports:
            if other is not t and not other.closed:
                other.mailbox.peer_lost(rank, ConnectionResetError("peer process died"))


class MemoryTransport(Transport):
    def __init__(self, rank: int, size: int, hub: MemoryHub) -> None:
        super().__init__(rank, size)
        self.hub = hub
        self.frames_sent = 0

    async def send(self, peer: int, kind: Kind, header: dict[str, Any], payload: memoryview | None = None) -> None:
        self.check_open()
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(f"no link from rank {self.rank} to rank {peer}")
        dst = self.hub.transports[peer]
        if dst.closed or peer in self.mailbox.dead:
            raise PeerLost(f"rank {peer} is gone", ranks=(peer,))
        self.frames_sent += 1
        if kind == Kind.DATA:
            nbytes = 0 if payload is None else payload.nbytes
            target = dst.mailbox.sink(self.rank, header, nbytes) if nbytes else None
            if target is None:
                target = memoryview(bytearray(nbytes))
            if nbytes:
                target[:] = payload  # type: ignore[index]
            dst.mailbox.deliver(self.rank, header, target)
        elif kind == Kind.ABORT:
            dst.mailbox.on_abort(self.rank, header)
        else:
            raise ValueError(f"memory transport carries DATA and ABORT frames, not {kind.name}")
        if self.frames_sent % 4 == 0:
            await asyncio.sleep(0)  # let other ranks run, like a real network would

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.mailbox.fail_all(lambda op: CommunicatorClosed(f"{op.where()}: transport closed"))
        for other in self.hub.transports:
            if other is not self and not other.closed:
                other.mailbox.peer_lost(self.rank, ConnectionResetError("peer closed its transport"))
