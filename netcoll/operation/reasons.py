"""Every way an operation can end, as one typed value: :class:`Reason`, and
:class:`Failure` (the reason with its message and ranks), plus the states of
an operation's life."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import (
    CollectiveAborted,
    CollectiveCancelled,
    CollectiveClosed,
    CollectiveError,
    CollectiveTimeout,
    LimitExceeded,
    MismatchError,
    PeerLost,
)

if TYPE_CHECKING:
    from ..waits import Wait
    from .state import Operation


class State(enum.Enum):
    ISSUED = "issued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Reason(str, enum.Enum):
    """Why an operation failed. The values are the ``cause`` of ABORT frames."""

    PEER_LOST = "lost"  # a link to a member broke (or it left before sending its part)
    TIMEOUT = "timeout"  # the deadline passed; names whom we waited for
    MISMATCH = "mismatch"  # ranks called different collectives / shapes / sizes
    CANCELLED = "cancelled"  # Work.cancel() or the awaiting task was cancelled
    CLOSED = "closed"  # the communicator or mesh closed under it
    LIMIT = "limit"  # a peer declared more than a configured limit
    ABORTED = "aborted"  # another member failed it and told us why
    ERROR = "error"  # an unexpected error (a bug) in an algorithm


ERROR_CLASSES: dict[Reason, type[CollectiveError]] = {
    Reason.PEER_LOST: PeerLost,
    Reason.TIMEOUT: CollectiveTimeout,
    Reason.MISMATCH: MismatchError,
    Reason.CANCELLED: CollectiveCancelled,
    Reason.CLOSED: CollectiveClosed,
    Reason.LIMIT: LimitExceeded,
    Reason.ABORTED: CollectiveAborted,
    Reason.ERROR: CollectiveError,
}


def detail(message: str, where: str) -> str:
    """``message`` without the ``where`` it begins with (``"all_reduce #1 of group 'g'
    failed: lost ..."`` -> ``"lost ..."``), for text that names the operation already:
    a log line, another rank's reason inside an abort. Never "X failed: X failed: ...".
    """
    for prefix in (f"{where} failed: ", f"{where} "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


def reason_of(cause: str) -> Reason:
    """The :class:`Reason` an ABORT frame's ``cause`` names (unknown: ERROR)."""
    try:
        return Reason(cause)
    except ValueError:
        return Reason.ERROR


@dataclass(frozen=True, slots=True)
class Failure:
    """How an operation ended, as one value.

    Attributes:
        reason: the typed reason.
        message: the user-facing message (names the operation and the ranks).
        ranks: group ranks the failure is about (lost, missing, mismatching, cancelling).
        told: the other members already know (it came from one of them, or we
            told them), so no ABORT is sent for it.
        waiting: on a timeout reported by a peer, the group ranks *this* rank was
            itself waiting for (sent on, so the chain of waits can be explained).
        waits: on a timeout, what this rank and the others it heard from waited for
            (:class:`netcoll.waits.Wait`; the error carries them as ``.waits``).
    """

    reason: Reason
    message: str
    ranks: tuple[int, ...] = ()
    told: bool = False
    waiting: tuple[int, ...] = ()
    waits: tuple[Wait, ...] = ()

    def error(self, op: Operation) -> CollectiveError:
        exc = ERROR_CLASSES[self.reason](self.message, op=op.name, seq=op.seq, ranks=self.ranks)
        exc.reason = self.reason
        exc.waits = self.waits
        names = {w: op.me(w) for w in op.members}
        if any(w != r for w, r in names.items()):  # a sub-group (or a pair): its ranks are not the world's
            exc.world_ranks = {r: w for w, r in names.items()}
        return exc
