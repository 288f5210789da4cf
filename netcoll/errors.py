"""Typed errors. Every failure a user can see is one of these (or a plain
``TypeError``/``ValueError`` for bad arguments, raised before any byte is sent).

Hierarchy::

    NetcollError
    ├── ProtocolError            malformed / oversize / unexpected bytes on a connection
    ├── AuthenticationError      token missing or wrong
    ├── RendezvousError          join refused (duplicate rank, world-size disagreement, ...)
    │   └── RendezvousTimeout    group never filled; lists who joined and who is missing
    ├── CollectiveError          a collective failed; carries .op, .seq, .ranks
    │   ├── CollectiveTimeout    deadline passed; .ranks = peers that never delivered
    │   ├── PeerLost             a connection to a peer broke; .ranks = the lost peers
    │   ├── MismatchError        ranks called different collectives/shapes/dtypes at one step
    │   └── CollectiveAborted    another rank failed this collective and told us why
    └── CommunicatorClosed       the communicator was closed
"""

from __future__ import annotations


class NetcollError(Exception):
    """Base class of every netcoll error."""


class ProtocolError(NetcollError):
    """Bytes on a connection broke the wire protocol (bad magic, version,
    oversize lengths, malformed header, unexpected frame kind)."""


class AuthenticationError(NetcollError):
    """The peer did not prove knowledge of the shared token."""


class RendezvousError(NetcollError):
    """The coordinator refused a join or a rendezvous request."""


class RendezvousTimeout(RendezvousError, TimeoutError):
    """A group did not fill before the deadline."""


class CommunicatorClosed(NetcollError):
    """The communicator (or its transport) has been closed."""


class CollectiveError(NetcollError):
    """A collective call failed.

    Attributes:
        op: the collective's name (``"all_reduce"``...), or ``None``.
        seq: the collective's sequence number in its group, or ``None``.
        ranks: the ranks the failure is about (missing, lost, mismatching).
    """

    def __init__(self, message: str, *, op: str | None = None, seq: int | None = None,
                 ranks: tuple[int, ...] | list[int] = ()) -> None:
        super().__init__(message)
        self.op = op
        self.seq = seq
        self.ranks = tuple(ranks)


class CollectiveTimeout(CollectiveError, TimeoutError):
    """The collective's deadline passed; ``ranks`` never delivered."""


class PeerLost(CollectiveError, ConnectionError):
    """The connection to ``ranks`` broke while (or before) the collective ran."""


class MismatchError(CollectiveError):
    """Ranks called different collectives, shapes, dtypes, ops or roots at the
    same step. The message names both calls."""


class CollectiveAborted(CollectiveError):
    """Another rank failed this collective and aborted it everywhere; the
    message carries that rank's reason."""


__all__ = [
    "NetcollError", "ProtocolError", "AuthenticationError", "RendezvousError",
    "RendezvousTimeout", "CommunicatorClosed", "CollectiveError", "CollectiveTimeout",
    "PeerLost", "MismatchError", "CollectiveAborted",
]
