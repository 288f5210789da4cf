"""Receive-side demultiplexing shared by every transport (no sockets here).

Incoming DATA frames are keyed by ``(group, seq)`` — one *operation* — and,
inside it, by ``(src, step, chunk)``. A collective opens its operation with
:meth:`Mailbox.open`, posts receive buffers, and closes it when done.

Rules:

1. A frame whose operation is open and whose slot has a posted buffer is
   written straight into that buffer (the transport asks :meth:`sink` for it
   before reading the payload).
2. A frame for an operation not yet opened is stashed, and checked when the
   operation opens; a frame for an operation that was opened and has since
   closed is dropped (operations of a group open in ``seq`` order on every
   rank, so ``seq < next_seq[group]`` and not open means finished).
3. Every frame carries the sender's call fingerprint; a difference from ours
   fails the operation with :class:`MismatchError` naming both calls.
4. An ABORT frame fails the operation (or marks it, if not yet opened). An
   ABORT for an operation that already *succeeded* here (a broadcast root
   finishes before its receivers notice a mismatch) fails the group's next
   operation instead, so no rank carries on alone.
5. A crashed peer fails every open operation it is a member of, and every
   later operation that includes it fails at open. A peer that closed in
   order (BYE) fails only receives from it that have not arrived: what it
   sent before leaving is still delivered.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Callable

from ..errors import CollectiveAborted, CollectiveError, MismatchError, PeerLost

SlotKey = tuple[int, int, int]  # (src world rank, step, chunk)
SUCCEEDED_KEPT = 64  # recent successful operations remembered per group (for late aborts)


#: the error of a finished operation (``take`` after ``close`` is a bug in the caller)
_CLOSED = CollectiveError("the operation was already closed")


class Operation:
    """One collective (or one point-to-point message) in flight on this rank."""

    __slots__ = ("group", "seq", "fp", "members", "name", "rank_of", "arrived", "posted",
                 "error", "reports", "_loop")

    def __init__(self, group: str, seq: int, fp: str, members: tuple[int, ...], name: str,
                 rank_of: dict[int, int] | None = None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.group, self.seq, self.fp, self.members, self.name = group, seq, fp, members, name
        self.rank_of = rank_of if rank_of is not None else {w: r for r, w in enumerate(members)}
        self.arrived: dict[SlotKey, tuple[memoryview, dict[str, Any]]] = {}
        self.posted: dict[SlotKey, tuple[asyncio.Future[Any], memoryview | None]] = {}
        self.error: CollectiveError | None = None
        #: group rank -> the group ranks it was waiting for when it timed out
        self.reports: dict[int, list[int]] = {}
        self._loop = loop or asyncio.get_running_loop()

    def fail(self, exc: CollectiveError) -> None:
        """Fail the operation once; later failures are ignored (the first cause wins)."""
        if self.error is not None:
            return
        self.error = exc
        for fut, _ in self.posted.values():
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # mark retrieved; the collective raises op.error itself
        self.posted.clear()

    def waiting_for(self) -> list[int]:
        """Group ranks this operation is currently blocked on."""
        return sorted({self.rank_of.get(src, src) for (src, _, _) in self.posted})

    def where(self) -> str:
        return f"{self.name} #{self.seq} of group {self.group!r}"


class Mailbox:
    """Demultiplexes DATA and ABORT frames of one transport into operations."""

    def __init__(self, rank: int) -> None:
        self.rank = rank  # world rank of this process
        self.ops: dict[tuple[str, int], Operation] = {}
        self.next_seq: dict[str, int] = {}
        self.early: dict[tuple[str, int], list[tuple[int, dict[str, Any], memoryview]]] = {}
        self.early_aborts: dict[tuple[str, int], dict[str, Any]] = {}
        self.dead: dict[int, BaseException] = {}
        self.departed: set[int] = set()  # the dead that said BYE: what they sent still counts
        self.early_bytes = 0
        #: recent operations that succeeded here, per group (seq -> name)
        self.succeeded: dict[str, collections.OrderedDict[int, str]] = {}
        #: group -> an ABORT that arrived for one of them
        self.late_aborts: dict[str, dict[str, Any]] = {}
        #: src -> the operation whose posted buffer src's current payload is being written into
        self.filling: dict[int, Operation] = {}
        #: set by a transport that writes payloads in place: stop src's current in-place write
        self.divert: Callable[[int], None] | None = None
        self._rank_of: dict[tuple[int, ...], dict[int, int]] = {}  # members -> {world rank: group rank}

    # -- operation lifecycle ------------------------------------------------
    def open(self, group: str, seq: int, fp: str, members: tuple[int, ...], name: str,
             loop: asyncio.AbstractEventLoop | None = None) -> Operation:
        key = (group, seq)
        if key in self.ops:
            raise RuntimeError(f"operation {key} is already open")
        rank_of = self._rank_of.get(members)
        if rank_of is None:
            if len(self._rank_of) > 256:
                self._rank_of.clear()
            rank_of = self._rank_of[members] = {w: r for r, w in enumerate(members)}
        op = Operation(group, seq, fp, members, name, rank_of, loop)
        self.ops[key] = op
        self.next_seq[group] = max(self.next_seq.get(group, 0), seq + 1)
        lost = [w for w in members if w in self.dead and w not in self.departed]
        if lost:
            op.fail(self._lost_error(op, lost))
        abort = self.early_aborts.pop(key, None)
        if abort is not None:
            self._apply_abort(op, abort)
        late = self.late_aborts.pop(group, None)
        if late is not None and op.error is None:
            r = op.rank_of.get(late["origin"], late["origin"])
            earlier = self.succeeded.get(group, {}).get(late["q"], "collective")
            exc = CollectiveAborted(
                f"{op.where()} not started: {earlier} #{late['q']} failed on rank {r} after this rank had "
                f"finished its part ({late['cause']}: {late['reason']})", op=op.name, seq=op.seq, ranks=(r,))
            op.fail(exc)  # the comm aborts this op on the other ranks too
        for src, header, payload in self.early.pop(key, ()):
            self.early_bytes -= payload.nbytes
            self._deliver_to(op, src, header, payload)
        return op

    def close(self, op: Operation) -> None:
        self.ops.pop((op.group, op.seq), None)
        for src in [s for s, o in self.filling.items() if o is op]:
            del self.filling[src]  # the caller gets its buffer back: no more bytes into it
            if self.divert is not None:
                self.divert(src)
        op.arrived.clear()
        if op.error is None:
            done = self.succeeded.get(op.group)
            if done is None:
                done = self.succeeded[op.group] = collections.OrderedDict()
            done[op.seq] = op.name
            if len(done) > SUCCEEDED_KEPT:
                done.popitem(last=False)
            if op.posted:  # receives nobody will complete now (the body did not wait for them)
                op.fail(CollectiveError(f"{op.where()} was closed", op=op.name, seq=op.seq))
            else:  # the common case: a shared error, no message to format
                op.error = _CLOSED

    # -- the receive side, called by collectives ----------------------------
    def take(self, op: Operation, key: SlotKey, out: memoryview | None) -> asyncio.Future[Any]:
        """Future of ``(payload, header)`` for slot ``key``; ``out`` (if given)
        receives the payload bytes, straight from the socket when possible."""
        fut: asyncio.Future[Any] = op._loop.create_future()
        if op.error is not None:
            fut.set_exception(op.error if op.error is not _CLOSED else
                              CollectiveError(f"{op.where()} was closed", op=op.name, seq=op.seq))
            fut.exception()
            return fut
        got = op.arrived.pop(key, None)
        if got is not None:
            payload, header = got
            if out is not None:
                if payload.nbytes != out.nbytes:
                    op.fail(self._size_error(op, key, header, payload.nbytes, out.nbytes))
                    fut.set_exception(op.error)  # type: ignore[arg-type]
                    fut.exception()
                    return fut
                out[:] = payload
                payload = out
            fut.set_result((payload, header))
            return fut
        if key[0] in self.dead:
            op.fail(self._lost_error(op, [key[0]]))
            fut.set_exception(op.error)  # type: ignore[arg-type]
            fut.exception()
            return fut
        op.posted[key] = (fut, out)
        return fut

    # -- the transport side ---------------------------------------------------
    def sink(self, src: int, header: dict[str, Any], nbytes: int) -> memoryview | None:
        """Where the payload of an incoming DATA frame should be written."""
        op = self.ops.get((header["g"], header["q"]))
        if op is None or header["f"] != op.fp:
            return None
        slot = op.posted.get((src, header["s"], header["c"]))
        if slot is None or slot[1] is None or slot[1].nbytes != nbytes:
            return None
        self.filling[src] = op
        return slot[1]

    def deliver(self, src: int, header: dict[str, Any], payload: memoryview) -> None:
        self.filling.pop(src, None)
        key = (header["g"], header["q"])
        op = self.ops.get(key)
        if op is not None:
            self._deliver_to(op, src, header, payload)
        elif header["q"] >= self.next_seq.get(header["g"], 0):
            self.early.setdefault(key, []).append((src, header, payload))
            self.early_bytes += payload.nbytes
        # else: a late frame of a finished (or failed) operation: drop it

    def on_abort(self, src: int, header: dict[str, Any]) -> None:
        key = (header["g"], header["q"])
        op = self.ops.get(key)
        if op is not None:
            self._apply_abort(op, header)
        elif header["q"] >= self.next_seq.get(header["g"], 0):
            self.early_aborts.setdefault(key, header)
        elif header["q"] in self.succeeded.get(header["g"], {}):
            # We finished our part (a broadcast root, say) but it failed elsewhere:
            # fail our next operation of the group, so no rank carries on alone.
            self.late_aborts.setdefault(header["g"], header)

    def peer_lost(self, peer: int, cause: BaseException | None = None, graceful: bool = False) -> None:
        """``peer``'s link is gone. A crash fails every open operation that
        includes it; an orderly close (``graceful``) fails only those still
        waiting for data from it (it had finished its part of the others)."""
        self.dead.setdefault(peer, cause or ConnectionError("connection closed"))
        if graceful:
            self.departed.add(peer)
        for op in list(self.ops.values()):
            if peer in op.rank_of and (not graceful or any(k[0] == peer for k in op.posted)):
                op.fail(self._lost_error(op, [peer]))

    def fail_all(self, exc_factory: Any) -> None:
        for op in list(self.ops.values()):
            op.fail(exc_factory(op))

    # -- internals ------------------------------------------------------------
    def _deliver_to(self, op: Operation, src: int, header: dict[str, Any], payload: memoryview) -> None:
        if op.error is not None:
            return
        if header["f"] != op.fp:
            r = op.rank_of.get(src, src)
            me = op.rank_of.get(self.rank, self.rank)
            op.fail(MismatchError(
                f"mismatched collectives at {op.where()}: rank {r} called {header['f']} "
                f"but rank {me} called {op.fp}", op=op.name, seq=op.seq, ranks=(me, r)))
            return
        key = (src, header["s"], header["c"])
        slot = op.posted.pop(key, None)
        if slot is None:
            op.arrived[key] = (payload, header)
            return
        fut, out = slot
        if out is not None and out is not payload:
            if out.nbytes != payload.nbytes:
                op.fail(self._size_error(op, key, header, payload.nbytes, out.nbytes))
                return
            out[:] = payload
            payload = out
        if not fut.done():
            fut.set_result((payload, header))

    def _apply_abort(self, op: Operation, header: dict[str, Any]) -> None:
        origin = header["origin"]
        r = op.rank_of.get(origin, origin)
        ranks = tuple(header.get("ranks") or (r,))
        if header["cause"] == "timeout":
            op.reports[r] = list(ranks)
        cls = MismatchError if header["cause"] == "mismatch" else CollectiveAborted
        waiting = op.waiting_for()
        me = op.rank_of.get(self.rank, self.rank)
        also = (f" (rank {me} itself was waiting for {', '.join(f'rank {w}' for w in waiting)})"
                if waiting and header["cause"] == "timeout" else "")
        exc = cls(f"{op.where()} aborted by rank {r} ({header['cause']}): {header['reason']}{also}",
                  op=op.name, seq=op.seq, ranks=waiting if also else ranks)
        exc.peers_told = True  # type: ignore[attr-defined]  # do not echo the abort back
        exc.waiting = waiting if also else []  # type: ignore[attr-defined]  # the comm reports these on
        op.fail(exc)

    def _lost_error(self, op: Operation, lost: list[int]) -> PeerLost:
        ranks = tuple(op.rank_of[w] for w in lost)
        why = "; ".join(f"rank {op.rank_of[w]}: {self.dead[w]}" for w in lost)
        return PeerLost(f"{op.where()} failed: lost connection to {why}", op=op.name, seq=op.seq, ranks=ranks)

    def _size_error(self, op: Operation, key: SlotKey, header: dict[str, Any], got: int, want: int) -> MismatchError:
        r = op.rank_of.get(key[0], key[0])
        return MismatchError(f"{op.where()}: rank {r} sent {got} bytes for step {key[1]} chunk {key[2]} "
                             f"where {want} were expected ({header['f']} vs {op.fp})",
                             op=op.name, seq=op.seq, ranks=(r,))
