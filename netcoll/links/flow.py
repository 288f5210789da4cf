"""Credit-based flow control with a rendezvous path, sans-IO: the bookkeeping
of one link (both directions), no sockets, no asyncio, no frames sent here.

How a DATA payload of ``n`` bytes travels (``docs/protocol.md`` §4.1):

* **eager** when ``n`` fits the sender's credit: the sender spends ``n`` and
  sends the frame; the receiver checks that it fits what it granted
  (:meth:`Flow.charge`; more is a :class:`ProtocolError`) and may hold it
  until a receive is posted;
* **rendezvous** otherwise: the sender sends a header-only RTS and waits; the
  receiver answers CTS once a receive is posted for that slot (or CTS
  ``ok=false`` if the operation ended), and the DATA that follows a CTS
  (marked ``rz: id``) spends no credit: it goes into the posted buffer.

The receiver gives credit back with CREDIT frames once a payload no longer
occupies memory here — written straight into a posted buffer, or held and
then released by the mailbox — batched until at least a quarter of the
window is free, so small messages never cost a CREDIT frame each. Credits
alone would deadlock on head-of-line blocking (a receiver waiting for a
second message while the first holds the window); the rendezvous path needs
no credit, so every send completes once its receive is posted.

The MPI analogue is the eager/rendezvous protocol switch; the credit window
is HTTP/2's or NCCL's.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Final

from ..errors import ProtocolError

#: at most this many RTS from a peer may wait for a posted receive at once
MAX_PENDING_RTS: Final = 1 << 16
#: cleared rendezvous (CTS sent, DATA not yet seen) remembered per link; a
#: sender that gave up after its RTS leaves one behind, the oldest are forgotten
MAX_CLEARED: Final = 1 << 12


@dataclass(frozen=True, slots=True)
class FlowState:
    """A snapshot for stats."""

    credit: int  # eager bytes this side may still send
    peer_window: int  # the peer's receive window: the most credit there can be
    window: int  # this side's receive window
    unreturned: int  # eager bytes received and not yet given back
    pending_rts: int  # the peer's RTS waiting for a receive to be posted here


class Flow:
    """Flow-control state of one link.

    Args:
        window: bytes of eager DATA this side accepts before it has returned
            credit (announced to the peer in the handshake).
        peer_window: the peer's announced window (our initial credit).
    """

    def __init__(self, window: int, peer_window: int) -> None:
        if window < 1 or peer_window < 1:
            raise ValueError(f"receive windows must be positive, got {window} and {peer_window}")
        # sending side
        self.peer_window = peer_window
        self.credit = peer_window
        self._next_id = 0
        # receiving side
        self.window = window
        self.threshold = max(1, window // 4)  # return credit in batches of at least this
        self.unreturned = 0  # charged (eager) bytes not yet given back with CREDIT
        self.freed = 0  # of those, bytes no longer held here (sent back with the next CREDIT)
        self.uncharged_held = 0  # rendezvous payloads (no credit spent) that the mailbox holds
        self.pending: dict[int, int] = {}  # RTS id -> bytes, waiting for a posted receive
        self.cleared: collections.OrderedDict[int, int] = collections.OrderedDict()  # CTS sent

    # -- sending side ---------------------------------------------------------------
    def try_spend(self, n: int) -> bool:
        """Spend ``n`` bytes of credit for an eager DATA frame, if there is enough."""
        if n <= self.credit:
            self.credit -= n
            return True
        return False

    def new_rts(self) -> int:
        """An id for a request to send (unique on this link)."""
        self._next_id += 1
        return self._next_id

    def credited(self, n: int) -> None:
        """A CREDIT frame gave back ``n`` bytes."""
        if n <= 0 or self.credit + n > self.peer_window:
            raise ProtocolError(
                f"CREDIT of {n} bytes is more than was spent (credit {self.credit} of a {self.peer_window}-byte window)"
            )
        self.credit += n

    # -- receiving side --------------------------------------------------------------
    def charge(self, n: int) -> None:
        """An eager DATA frame of ``n`` bytes arrives: it must fit the window."""
        if self.unreturned + n > self.window:
            raise ProtocolError(
                f"eager DATA frame of {n} bytes exceeds the remaining receive window of "
                f"{self.window - self.unreturned} bytes (window {self.window}); larger "
                "payloads must be announced with RTS"
            )
        self.unreturned += n

    def free(self, n: int) -> int:
        """``n`` charged bytes no longer occupy memory here. Returns the credit
        to give back now (0: keep batching)."""
        self.freed += n
        if self.freed < self.threshold:
            return 0
        n, self.freed = self.freed, 0
        self.unreturned -= n
        return n

    def hold_uncharged(self, n: int) -> None:
        """A rendezvous payload of ``n`` bytes is now held by the mailbox."""
        self.uncharged_held += n

    def released(self, n: int) -> int:
        """The mailbox stopped holding a payload of ``n`` bytes (eager or
        rendezvous: it does not say). Rendezvous bytes are counted off first,
        so credit is never returned twice (at worst a little late). Returns
        the credit to give back now."""
        u = min(n, self.uncharged_held)
        self.uncharged_held -= u
        return self.free(n - u) if n > u else 0

    def rts(self, rid: int, n: int) -> None:
        """The peer asks to send ``n`` bytes (request ``rid``)."""
        if rid in self.pending or rid in self.cleared:
            raise ProtocolError(f"duplicate RTS id {rid}")
        if n <= 0:
            raise ProtocolError(f"RTS for {n} bytes")
        if len(self.pending) >= MAX_PENDING_RTS:
            raise ProtocolError(f"more than {MAX_PENDING_RTS} RTS waiting for receives")
        self.pending[rid] = n

    def answer(self, rid: int, ok: bool) -> bool:
        """A receive was posted for request ``rid`` (``ok``) or its operation
        ended. Returns whether a CTS is due (False once the request is gone)."""
        n = self.pending.pop(rid, None)
        if n is None:
            return False
        if ok:
            self.cleared[rid] = n
            if len(self.cleared) > MAX_CLEARED:
                self.cleared.popitem(last=False)
        return True

    def rendezvous_data(self, rid: object, n: int) -> None:
        """A DATA frame marked ``rz: rid`` arrives: it must follow our CTS."""
        want = self.cleared.pop(rid, None) if isinstance(rid, int) and not isinstance(rid, bool) else None
        if want is None:
            raise ProtocolError(f"DATA frame for rendezvous {rid!r}, which was not cleared to send")
        if want != n:
            raise ProtocolError(f"DATA frame of {n} bytes for rendezvous {rid}, which announced {want}")

    def state(self) -> FlowState:
        return FlowState(self.credit, self.peer_window, self.window, self.unreturned, len(self.pending))


__all__ = ["Flow", "FlowState", "MAX_PENDING_RTS", "MAX_CLEARED"]
