"""The per-peer link interface (what Gloo calls a transport *pair*).

A :class:`Link` carries frames between this rank and one peer. Whatever it
runs over (a TCP or TLS connection, a shared-memory ring, an in-process pair),
it

* sends a frame with backpressure: :meth:`Link.send` returns when the caller
  may reuse the payload buffer, and a DATA payload waits for the receiver's
  credit or clearance (``netcoll.links.flow``), so a slow receiver slows the
  sender down instead of filling its memory;
* receives DATA into posted buffers through the mailbox (``sink`` /
  ``deliver``) and reports everything else it receives (ABORT, a lost
  connection, an orderly BYE) to the mailbox too;
* closes in order (:meth:`Link.close`: BYE, then the peer's EOF) or at once
  (:meth:`Link.abort`);
* describes itself with :meth:`Link.stats`.

The mesh (:class:`~netcoll.mesh.channel.Mesh`) holds one link per peer.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

from ..wire import Kind

#: ``on_lost(peer, cause, graceful)``: the link is gone (``graceful``: the peer said BYE first)
LostCallback = Callable[[int, BaseException, bool], None]


class Quiet(Protocol):
    """Holds a loop's polling off while held (:class:`netcoll.loop.SpinSelector`)."""

    def hold(self) -> None: ...

    def release(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LinkStats:
    """One link, as the mesh's ``link_stats()`` shows it."""

    kind: str  # "tcp", "memory", ...
    peer: int  # world rank at the other end
    frames_sent: int
    bytes_sent: int  # payload bytes
    frames_received: int
    bytes_received: int  # payload bytes
    unexpected_bytes: int  # held here for receives not posted yet
    unexpected_peak: int
    send_backlog: int  # bytes queued here that the other end has not taken yet
    credit: int  # eager DATA bytes this side may still send
    peer_window: int  # the peer's receive window
    recv_window: int  # this side's receive window
    rendezvous: int  # DATA frames sent after an RTS/CTS round trip
    waiting: int  # sends waiting for a CTS right now
    credits_sent: int  # CREDIT frames sent
    lost: str | None  # why the link is gone, or None
    lane_sent: int = 0  # shm: DATA frames sent through the shared-memory lane (no system call)
    lane_received: int = 0  # shm: ...received through it
    bells: int = 0  # shm: BELL frames rung for a peer asleep with frames in its lane
    direct_sent: int = 0  # shm: DATA payloads the peer read straight from this process (one copy)
    direct_received: int = 0  # shm: ...read here straight from the peer's memory
    direct_held: int = 0  # shm: ...of those, read into a buffer of their own (no receive posted in time)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Link(abc.ABC):
    """One peer's link. Subclasses set :attr:`kind`."""

    kind: ClassVar[str] = "?"

    def __init__(self, peer: int) -> None:
        self.peer = peer
        #: why the link is gone (None while it works)
        self.lost: BaseException | None = None
        #: set by the mesh: called once when the link is gone
        self.on_lost: LostCallback | None = None

    @property
    def usable(self) -> bool:
        """Whether a send may still go out (not lost, not closing)."""
        return self.lost is None

    def start(self) -> None:
        """Begin delivering received frames (called by the mesh once :attr:`on_lost` is set)."""
        return None

    @abc.abstractmethod
    async def send(self, kind: Kind, header: dict[str, Any], payload: memoryview | None = None) -> None:
        """Send one frame; return when ``payload`` may be reused. Raises
        ConnectionError if the link breaks (the mesh makes that PeerLost)."""

    @property
    def fold_min_bytes(self) -> int | None:
        """The smallest DATA payload this link reduces as it reads it, when its
        receive was posted with an :class:`~netcoll.ops.Fold` (None: it never
        does, and the algorithm reduces what it received). Shared memory folds
        each piece as it reads it out of the ring; TCP and TLS links fold large
        payloads a cache-sized piece at a time as they are read (``links/folding.py``);
        below this size folding would not pay."""
        return None

    def bulk_quiet(self) -> Quiet | None:
        """What to hold while an operation moves a large message over this link, so that
        the rank waits for it asleep instead of polling (netcoll's loop:
        :meth:`netcoll.loop.SpinSelector.hold`), or None. A socket's large transfers are
        the kernel's copies, from which a polling rank only takes CPU."""
        return None

    def lends(self, header: dict[str, Any], nbytes: int) -> bool:
        """Whether a DATA payload of ``nbytes`` with ``header`` would be *lent*: read by the
        peer in place, the send returning only once it has (shared memory: ``links/cma.py``).
        Sends that wait for their reader are best issued to several peers at once."""
        return False

    def send_nowait(self, header: dict[str, Any], payload: memoryview) -> bool:
        """Send a small DATA frame now, without awaiting, if nothing stands in
        the way (credit, an empty path to the socket); False: nothing was sent,
        use :meth:`send`. The eager path of every small message: it saves the
        coroutine layers of :meth:`send` (docs/performance.md)."""
        return False

    @abc.abstractmethod
    def released(self, nbytes: int) -> None:
        """The mailbox stopped holding a payload of ``nbytes`` received here
        that was not written into a posted buffer (flow control credits it)."""

    @abc.abstractmethod
    def divert(self) -> None:
        """The receive that the payload arriving now was being written into is
        gone: read the rest of it into a throw-away buffer."""

    @abc.abstractmethod
    def close(self) -> None:
        """Orderly close: say BYE, send nothing more, and wait for the peer's end."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Close at once; whatever is queued is dropped."""

    @abc.abstractmethod
    async def wait_closed(self) -> None:
        """Return when the link is fully closed."""

    @abc.abstractmethod
    def stats(self) -> LinkStats: ...


__all__ = ["Link", "LinkStats", "LostCallback"]
