"""The seam between algorithms and transports.

A :class:`Transport` moves frames between world ranks and feeds a
:class:`~netcoll.transport.mailbox.Mailbox`. A :class:`Channel` is what one
algorithm run sees: ``send``/``recv`` of byte buffers to *group* ranks within
one operation. Algorithms import nothing else from here, and the same
algorithm code runs over :mod:`.memory` and :mod:`.tcp`.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Any

import numpy as np

from ..errors import CommunicatorClosed
from ..wire import Kind
from .mailbox import Mailbox, Operation


def as_bytes(x: np.ndarray | memoryview | bytes | bytearray) -> memoryview:
    """A flat unsigned-byte memoryview of a C-contiguous buffer, without copying."""
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ValueError("buffers passed to a channel must be C-contiguous")
        return memoryview(x.reshape(-1).view(np.uint8))
    mv = memoryview(x)
    return mv if (mv.format == "B" and mv.ndim == 1) else mv.cast("B")


class Transport(abc.ABC):
    """Moves frames between world ranks ``0..size-1``.

    ``send`` returns once the payload has been handed off: the caller may
    reuse its buffer immediately. Implementations apply backpressure by
    awaiting while too much data is in flight to a peer.
    """

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self.mailbox = Mailbox(rank)
        self.closed = False

    @abc.abstractmethod
    async def send(self, peer: int, kind: Kind, header: dict[str, Any], payload: memoryview | None = None) -> None:
        """Send one frame to world rank ``peer``."""

    async def abort(self, op: Operation, cause: str, reason: str, ranks: tuple[int, ...] = ()) -> None:
        """Tell every other live member of ``op`` that it failed here."""
        header = {"g": op.group, "q": op.seq, "reason": reason, "origin": self.rank, "cause": cause,
                  "ranks": list(ranks)}
        for peer in op.members:
            if peer != self.rank and peer not in self.mailbox.dead:
                try:
                    await self.send(peer, Kind.ABORT, header)
                except Exception:  # noqa: BLE001 - best effort: the peer may be gone too
                    pass

    def check_open(self) -> None:
        if self.closed:
            raise CommunicatorClosed("transport is closed")

    @abc.abstractmethod
    async def close(self) -> None:
        """Close every link; pending operations fail with PeerLost/CommunicatorClosed."""


class Channel:
    """One operation's view of the transport, addressed by group rank.

    Args:
        transport: the process's transport.
        op: the open operation (group, seq, fingerprint, members).
    """

    __slots__ = ("transport", "op", "members", "rank", "size", "_mailbox", "_head")

    def __init__(self, transport: Transport, op: Operation) -> None:
        self.transport = transport
        self.op = op
        self.members = op.members
        self.size = len(op.members)
        self.rank = op.rank_of[transport.rank]
        self._mailbox = transport.mailbox
        self._head = {"g": op.group, "q": op.seq, "f": op.fp}

    async def send(self, peer: int, data: np.ndarray | memoryview | bytes, *, step: int, chunk: int = 0,
                   meta: dict[str, Any] | None = None) -> None:
        """Send ``data`` (any C-contiguous buffer) to group rank ``peer``."""
        header = dict(self._head, s=step, c=chunk)
        if meta is not None:
            header["m"] = meta
        await self.transport.send(self.members[peer], Kind.DATA, header, as_bytes(data))

    def post(self, peer: int, *, step: int, chunk: int = 0,
             out: np.ndarray | memoryview | None = None) -> asyncio.Future[tuple[memoryview, dict[str, Any]]]:
        """Post a receive now (no await) and return its future of ``(payload,
        header)``. A receive posted before its message arrives gets the bytes
        written straight into ``out``. Awaiting the future is :meth:`recv_meta`."""
        return self._mailbox.take(self.op, (self.members[peer], step, chunk),
                                  None if out is None else as_bytes(out))

    async def recv(self, peer: int, *, step: int, chunk: int = 0,
                   out: np.ndarray | memoryview | None = None) -> memoryview:
        """Receive the matching message from group rank ``peer``. With ``out``
        the bytes land in it (sizes must match exactly) and a byte view of
        ``out`` is returned; without, a fresh writable buffer is returned."""
        payload, _ = await self._mailbox.take(
            self.op, (self.members[peer], step, chunk), None if out is None else as_bytes(out))
        return payload  # type: ignore[no-any-return]

    async def recv_meta(self, peer: int, *, step: int, chunk: int = 0,
                        out: np.ndarray | memoryview | None = None) -> tuple[memoryview, dict[str, Any] | None]:
        """Like :meth:`recv`, also returning the sender's ``meta`` (or None)."""
        payload, header = await self._mailbox.take(
            self.op, (self.members[peer], step, chunk), None if out is None else as_bytes(out))
        return payload, header.get("m")
