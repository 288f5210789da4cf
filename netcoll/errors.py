"""Typed errors. Every failure a user can see is one of these (or a plain
``TypeError``/``ValueError`` for bad arguments, raised before any byte is sent).

Hierarchy::

    NetcollError
    ├── ProtocolError            malformed / oversize / unexpected bytes on a connection
    ├── AuthenticationError      token missing or wrong
    ├── RendezvousError          join refused (duplicate rank, world-size disagreement, ...)
    │   └── RendezvousTimeout    group never filled; lists who joined and who is missing
    │       └── RegroupTimeout   a regroup did not close in time; names the members that never called it
    ├── CollectiveError          a collective failed; carries .op, .seq, .ranks, .reason
    │   ├── CollectiveTimeout    deadline passed; .ranks = peers that never delivered
    │   ├── PeerLost             a connection to a peer broke; .ranks = the lost peers
    │   ├── MismatchError        ranks called different collectives/shapes/dtypes at one step
    │   ├── LimitExceeded        a peer declared more than a configured limit allows
    │   ├── CollectiveAborted    another rank failed this collective and told us why
    │   │   ├── CollectiveCancelled   the collective was cancelled (.ranks = the cancelling rank)
    │   │   ├── PartialExcluded      a partial all_reduce agreed without this rank (it was late)
    │   │   └── PartialMismatch      a partial all_reduce agreed on a rank whose data never reached this one
    │   └── CollectiveClosed     the communicator closed under the collective (also a CommunicatorClosed)
    ├── CommunicatorClosed       the communicator was closed
    └── ConfigError              a setting (flag or NETCOLL_* variable) is missing or invalid
                                 (also a ValueError); the message names it
        └── TlsConfigError       a TLS file or setting is unusable (netcoll.mesh.certs)

``CollectiveError.reason`` is the one typed value that says how an operation
ended (:class:`netcoll.operation.Reason`: peer lost, timeout, mismatch,
cancelled, closed, limit exceeded, aborted elsewhere, error); the class follows
from it. The failure rules themselves live in :mod:`netcoll.operation`.
"""

from __future__ import annotations

from typing import Any


class NetcollError(Exception):
    """Base class of every netcoll error."""


class ProtocolError(NetcollError):
    """Bytes on a connection broke the wire protocol (bad magic, version,
    oversize lengths, malformed header, unexpected frame kind)."""


class AuthenticationError(NetcollError):
    """The peer did not prove knowledge of the shared token."""


class InsecureListenerError(NetcollError, ValueError):
    """Refused to listen on a non-loopback address without credentials (no
    token and no TLS): pass a token or ``tls=``, listen on loopback, or
    ``insecure=True``."""


class RendezvousError(NetcollError):
    """The coordinator refused a join or a rendezvous request."""


class RendezvousTimeout(RendezvousError, TimeoutError):
    """A group did not fill before the deadline."""


class RegroupTimeout(RendezvousTimeout):
    """A ``regroup`` did not close before its timeout: the message names every live
    member that never called it (or, for a newcomer, that no regroup admitted it)."""


class CommunicatorClosed(NetcollError):
    """The communicator (or its mesh) has been closed."""


class ConfigError(NetcollError, ValueError):
    """Invalid or missing configuration; ``str()`` is one line naming the flag or
    environment variable at fault (e.g. ``NETCOLL_WORLD_SIZE`` not set)."""


class CollectiveError(NetcollError):
    """A collective call failed.

    Attributes:
        op: the collective's name (``"all_reduce"``...), or ``None``.
        seq: the collective's sequence number in its group, or ``None``.
        ranks: the ranks the failure is about (missing, lost, mismatching).
    """

    def __init__(
        self, message: str, *, op: str | None = None, seq: int | None = None, ranks: tuple[int, ...] | list[int] = ()
    ) -> None:
        super().__init__(message)
        self.op = op
        self.seq = seq
        self.ranks = tuple(ranks)
        #: how the operation ended (a :class:`netcoll.operation.Reason`); set by the operation
        self.reason: Any = None
        #: on a timeout, what this rank and those it heard from were waiting for
        #: (:class:`netcoll.waits.Wait`; a job's error merges every rank's)
        self.waits: tuple[Any, ...] = ()
        #: the rank of the communicator ``connect()`` made (its mesh's) of each rank
        #: ``ranks`` and ``waits`` name, where they differ (a sub-group's); empty: the same
        self.world_ranks: dict[int, int] = {}


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


class CollectiveCancelled(CollectiveAborted):
    """The collective was cancelled on ``ranks`` (a ``Work.cancel()`` or a
    cancelled awaiting task); every other rank of the group gets this."""


class PartialExcluded(CollectiveAborted):
    """A partial ``all_reduce`` (``partial=True``) was agreed without this rank: its
    contribution did not count, because the decision was made before it delivered
    (it was late, or its link failed). The others returned; ``ranks`` is the agreed
    contributors. Call ``regroup()`` (a lost link) or simply go on: the next
    collective includes this rank again."""


class PartialMismatch(CollectiveAborted):
    """A partial ``all_reduce`` was agreed on contributors one of which (``ranks``)
    never delivered to this rank before its link was lost: this rank cannot compute
    the agreed result, so it fails rather than return a different one."""


class LimitExceeded(CollectiveError):
    """A peer declared a size beyond a configured limit; nothing was allocated for it."""


class CollectiveClosed(CollectiveError, CommunicatorClosed):
    """The communicator (or its mesh) closed while the collective ran."""


__all__ = [
    "NetcollError",
    "ProtocolError",
    "AuthenticationError",
    "InsecureListenerError",
    "RendezvousError",
    "RendezvousTimeout",
    "RegroupTimeout",
    "CommunicatorClosed",
    "CollectiveError",
    "CollectiveTimeout",
    "PeerLost",
    "MismatchError",
    "CollectiveAborted",
    "CollectiveCancelled",
    "PartialExcluded",
    "PartialMismatch",
    "LimitExceeded",
    "CollectiveClosed",
    "ConfigError",
]
