"""The seam between algorithms and the mesh.

A :class:`Mesh` is the mesh of per-peer links
(:mod:`netcoll.links`) that moves frames between world ranks and feeds a
:class:`~netcoll.mesh.mailbox.Mailbox`. A :class:`Channel` is what one
algorithm run sees: ``send``/``recv`` of byte buffers to *group* ranks within
one operation. Algorithms import nothing else from here, and the same
algorithm code runs over :mod:`.inprocess` and :mod:`.tcpmesh`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from .. import observe
from ..errors import CollectiveError, CommunicatorClosed, PeerLost
from ..escape import escape
from ..links.base import Link, LinkStats, Quiet
from ..operation import Operation
from ..ops import Fold
from ..wire import Kind
from .answers import Answers
from .mailbox import Mailbox

log = logging.getLogger("netcoll.transport")

CLOSE_TIMEOUT = 2.0  # how long an orderly close waits for the peers to close their ends
#: an operation that sends or posts a message of this many bytes over a link that sleeps in
#: bulk (TCP, TLS) keeps netcoll's loop from polling until it closes (:meth:`Mesh.hold_spin`;
#: measured in docs/performance.md, "No spinning in large socket transfers")
QUIET_MIN = 4 << 20


#: a partial all_reduce's decider: ``decide(group id, seq, proposal, timeout)`` returns the
#: agreed contributors, the first proposal made for that ``(group id, seq)``, to every caller
#: (:mod:`netcoll.algorithms.partial`)
Decide = Callable[[str, int, tuple[int, ...], float], Awaitable[tuple[int, ...]]]


def as_bytes(x: np.ndarray | memoryview | bytes | bytearray) -> memoryview:
    """A flat unsigned-byte memoryview of a C-contiguous buffer, without copying."""
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ValueError("buffers passed to a channel must be C-contiguous")
        if x.size and x.dtype.isbuiltin == 1:  # numpy's own dtypes export a buffer: the cheapest view
            mv = memoryview(x)  # type: ignore[arg-type]  # numpy's stubs: no Buffer before 3.12
            return mv if (mv.format == "B" and mv.ndim == 1) else mv.cast("B")
        return x.reshape(-1).view(np.uint8).data  # (ml_dtypes' bfloat16 exports none)
    mv = memoryview(x)
    return mv if (mv.format == "B" and mv.ndim == 1) else mv.cast("B")


class Mesh:
    """The mesh: one :class:`~netcoll.links.base.Link` per peer among world
    ranks ``0..size-1``, all feeding one :class:`Mailbox`.

    ``send`` returns once the payload has been handed off: the caller may
    reuse its buffer immediately. Links apply backpressure (socket buffers,
    the receiver's credit) by awaiting. Subclasses make the links (over TCP,
    in memory, ...) and :meth:`attach` them.
    """

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self.mailbox = Mailbox(rank)
        self.closed = False
        self.links: dict[int, Link] = {}
        self.mailbox.divert = self._divert
        self.mailbox.released = self._released
        self.mailbox.on_close = self._closed_op
        #: answers a peer's timeout with where this rank waits, and keeps the waits heard
        self.answers = Answers(self)
        self.mailbox.asked = self.answers
        self._holding: dict[tuple[str, int], Quiet] = {}  # operations that hold the loop's polling off
        #: every rank's link kinds and host, agreed by the world group when it formed
        #: (:class:`netcoll.selection.media.Layout`); None before that
        self.layout: Any = None
        #: who decides a partial all_reduce's contributors for the groups over this mesh: the
        #: coordinator's store (:func:`netcoll.connect`), one in-process table (:mod:`.inprocess`);
        #: None: partial all_reduce is refused
        self.decider: Decide | None = None

    def attach(self, link: Link) -> None:
        """Make ``link`` this rank's link to ``link.peer`` and start it."""
        self.links[link.peer] = link
        link.on_lost = self._on_lost
        link.start()
        log.info("rank %d: %s link to rank %d up", self.rank, link.kind, link.peer)

    async def send(self, peer: int, kind: Kind, header: dict[str, Any], payload: memoryview | None = None) -> None:
        """Send one frame to world rank ``peer`` (PeerLost when its link is gone)."""
        link = self.links.get(peer)
        if link is None or not link.usable:
            if self.closed:
                raise CommunicatorClosed("transport is closed")
            cause = (
                self.mailbox.dead.get(peer)
                or (link.lost if link else None)
                or ("connection closing" if link else "not linked")
            )
            raise PeerLost(f"no connection to rank {peer}: {cause}", ranks=(peer,))
        try:
            await link.send(kind, header, payload)
        except CollectiveError:  # the operation this send belongs to ended (a wait for clearance)
            raise
        except ConnectionError as exc:  # the link broke (or the peer left) under this send
            if self.closed:
                raise CommunicatorClosed("transport is closed") from None
            raise PeerLost(f"lost connection to rank {peer}: {exc}", ranks=(peer,)) from None

    def send_nowait(self, peer: int, header: dict[str, Any], payload: memoryview) -> bool:
        """Send a small DATA frame to world rank ``peer`` at once if its link
        can (see :meth:`Link.send_nowait`); False: nothing was sent, :meth:`send` it."""
        link = self.links.get(peer)
        return link is not None and link.send_nowait(header, payload)

    def folds(self, peer: int, nbytes: int) -> bool:
        """Whether the link to world rank ``peer`` folds a payload of ``nbytes``
        posted with an :class:`~netcoll.ops.Fold` (:attr:`Link.fold_min_bytes`)."""
        link = self.links.get(peer)
        least = None if link is None else link.fold_min_bytes
        return least is not None and nbytes >= least

    def hold_spin(self, op: Operation, peer: int) -> None:
        """``op`` moves a message of :data:`QUIET_MIN` bytes or more to or from world rank
        ``peer``: if that link says so (:meth:`Link.bulk_quiet`: a socket, on netcoll's
        polling loop), the loop sleeps in every wait until ``op`` closes."""
        key = (op.group, op.seq)
        if key in self._holding:
            return
        link = self.links.get(peer)
        quiet = None if link is None else link.bulk_quiet()
        if quiet is not None:
            quiet.hold()
            self._holding[key] = quiet

    def _closed_op(self, op: Operation) -> None:
        quiet = self._holding.pop((op.group, op.seq), None)
        if quiet is not None:
            quiet.release()

    def lends(self, peer: int, header: dict[str, Any], nbytes: int) -> bool:
        """Whether the link to world rank ``peer`` would lend such a DATA payload (:meth:`Link.lends`)."""
        link = self.links.get(peer)
        return link is not None and link.lends(header, nbytes)

    def link_stats(self) -> dict[int, LinkStats]:
        """Each peer's link: its kind, traffic, held bytes and credit."""
        return {peer: link.stats() for peer, link in sorted(self.links.items())}

    async def abort(
        self, op: Operation, cause: str, reason: str, ranks: tuple[int, ...] = (), wait: dict[str, Any] | None = None
    ) -> None:
        """Tell every other live member of ``op`` that it failed here (``wait``: on a
        timeout, what this rank waits for, :meth:`Operation.wait_field`)."""
        header: dict[str, Any] = {
            "g": op.group,
            "q": op.seq,
            "reason": reason,
            "origin": self.rank,
            "cause": cause,
            "ranks": list(ranks),
        }
        if wait is not None:
            header["w"] = wait
        for peer in op.members:
            if peer != self.rank and peer not in self.mailbox.dead:
                try:
                    await self.send(peer, Kind.ABORT, header)
                except Exception:  # noqa: BLE001 - best effort: the peer may be gone too
                    pass

    def check_open(self) -> None:
        if self.closed:
            raise CommunicatorClosed("transport is closed")

    async def close(self) -> None:
        """Close every link in order (BYE); pending operations fail with CommunicatorClosed."""
        if self.closed:
            return
        self.closed = True
        self.mailbox.fail_all(lambda op: CommunicatorClosed(f"{op.where()}: communicator closed"))
        for quiet in self._holding.values():  # (each is released as its operation closes, or here)
            quiet.release()
        self._holding.clear()
        await self.close_links()

    async def close_links(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """BYE on every link, wait up to ``timeout`` for the peers to close
        their ends, then abort what is left."""
        links = list(self.links.values())
        for link in links:
            link.close()
        waits = [asyncio.ensure_future(link.wait_closed()) for link in links]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=timeout)
            for task in pending:
                task.cancel()
            for link, task in zip(links, waits, strict=True):
                if task in pending:
                    link.abort()

    # -- link events ----------------------------------------------------------------
    def _on_lost(self, peer: int, cause: BaseException, graceful: bool) -> None:
        if not self.closed:
            level = logging.INFO if graceful else logging.WARNING
            log.log(
                level,
                "rank %d: link to rank %d %s: %s",
                self.rank,
                peer,
                "closed" if graceful else "lost",
                escape(cause),
            )
            self.mailbox.peer_lost(peer, cause, graceful)

    def _released(self, src: int, nbytes: int) -> None:
        link = self.links.get(src)
        if link is not None:
            link.released(nbytes)

    def _divert(self, src: int) -> None:
        link = self.links.get(src)
        if link is not None:
            link.divert()


class Channel:
    """One operation's view of the mesh, addressed by group rank.

    Args:
        mesh: the process's mesh.
        op: the open operation (group, seq, fingerprint, members).
    """

    __slots__ = ("mesh", "op", "members", "rank", "size", "_mailbox", "_head", "_trace")

    def __init__(self, mesh: Mesh, op: Operation) -> None:
        self.mesh = mesh
        self.op = op
        self.members = op.members
        self.size = len(op.members)
        self.rank = op.rank_of[mesh.rank]
        self._mailbox = mesh.mailbox
        self._head = {"g": op.group, "q": op.seq, "f": op.fp}
        #: the traced job's span recorder (read once per operation; None: not tracing)
        self._trace = observe.TRACE.get()

    async def send(
        self,
        peer: int,
        data: np.ndarray | memoryview | bytes,
        *,
        step: int,
        chunk: int = 0,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Send ``data`` (any C-contiguous buffer) to group rank ``peer``."""
        header = dict(self._head, s=step, c=chunk)
        if meta is not None:
            header["m"] = meta
        view, world = as_bytes(data), self.members[peer]
        if view.nbytes >= QUIET_MIN:
            self.mesh.hold_spin(self.op, world)
        if self._trace is None:
            if not self.mesh.send_nowait(world, header, view):
                await self.mesh.send(world, Kind.DATA, header, view)
            return
        start = observe.now()
        await self.mesh.send(world, Kind.DATA, header, view)
        self._span("send", f"send to rank {peer}", start, step, chunk, view.nbytes)

    def _span(self, name: str, tid: str, start: float, step: int, chunk: int, nbytes: int) -> None:
        assert self._trace is not None
        args = {"step": step, "chunk": chunk, "bytes": nbytes, "op": f"{self.op.name} #{self.op.seq}"}
        self._trace.add(name, tid, start, observe.now(), args)

    def _traced(self, fut: asyncio.Future[Any], peer: int, step: int, chunk: int) -> asyncio.Future[Any]:
        """Record a receive's span (posted until it completes) when the future ends."""
        start = observe.now()

        def done(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and f.exception() is None:
                self._span("recv", f"recv from rank {peer}", start, step, chunk, f.result()[0].nbytes)

        fut.add_done_callback(done)
        return fut

    def post(
        self,
        peer: int,
        *,
        step: int,
        chunk: int = 0,
        out: np.ndarray | memoryview | None = None,
        fold: Fold | None = None,
    ) -> asyncio.Future[tuple[memoryview, dict[str, Any]]]:
        """Post a receive now (no await) and return its future of ``(payload,
        header)``. A receive posted before its message arrives gets the bytes
        written straight into ``out``, or, with ``fold`` and a link that folds
        such a payload (:meth:`folds`), reduced into ``fold.out`` instead (then
        ``fold.complete`` and ``out`` is left as it was). Awaiting the future
        is :meth:`recv_meta`."""
        view = None if out is None else as_bytes(out)
        if view is not None and view.nbytes >= QUIET_MIN:
            self.mesh.hold_spin(self.op, self.members[peer])
        fut = self._mailbox.take(self.op, (self.members[peer], step, chunk), view, fold)
        return fut if self._trace is None else self._traced(fut, peer, step, chunk)

    def post_either(
        self, sources: Sequence[tuple[int, int]], *, chunk: int = 0, out: np.ndarray | memoryview | None = None
    ) -> asyncio.Future[tuple[memoryview, dict[str, Any]]]:
        """Post one receive for a message from whichever of ``sources`` (``(group rank,
        step)`` pairs) sends first; its future is :meth:`post`'s (the header's ``s`` says
        which step came). The caller :meth:`unpost` s the others once it has its message."""
        keys = tuple((self.members[peer], step, chunk) for peer, step in sources)
        view = None if out is None else as_bytes(out)
        if view is not None and view.nbytes >= QUIET_MIN:
            for world, _, _ in keys:
                self.mesh.hold_spin(self.op, world)
        fut = self._mailbox.take_either(self.op, keys, view)
        return fut if self._trace is None else self._traced(fut, sources[0][0], sources[0][1], chunk)

    def unpost(self, peer: int, *, step: int, chunk: int = 0) -> None:
        """Withdraw a receive :meth:`post` ed from group rank ``peer`` whose message will not
        come (see :meth:`Operation.withdraw`); a message that came meanwhile is left as arrived."""
        self.op.withdraw((self.members[peer], step, chunk))

    def lend_from(self, step: int) -> None:
        """This rank's sends of ``step`` and later may be lent: read by a peer on this host in
        place, each returning only once it has been read (any send's buffer stays the
        algorithm's to leave alone until the send returns). For an algorithm that has nothing
        to do meanwhile but wait for what it receives; see :attr:`Operation.lends_from`."""
        self.op.lends_from = min(self.op.lends_from, step)

    def sync_from(self, step: int) -> None:
        """This rank's sends of ``step`` and later, from :data:`~netcoll.links.framed.SYNC_MIN`
        bytes, are synchronous: each waits until the peer has posted its receive (a rendezvous:
        the payload then lands in place) instead of going ahead into the peer's memory. For a
        rank that would otherwise run ahead of a busier receiver and have it copy what it sent
        twice (a gather's and a tree reduce's non-roots); see :attr:`Operation.sync_from`."""
        self.op.sync_from = min(self.op.sync_from, step)

    def lends(self, peer: int, nbytes: int, *, step: int) -> bool:
        """Whether a send of ``nbytes`` at ``step`` to group rank ``peer`` would be lent: it
        returns only once the peer has read it in place (:meth:`Link.lends`)."""
        return self.mesh.lends(self.members[peer], dict(self._head, s=step), nbytes)

    def folds(self, peer: int, nbytes: int) -> bool:
        """Whether the link to group rank ``peer`` would fold a payload of ``nbytes``
        posted with a ``fold`` (see :meth:`post`); if not, describing one is wasted."""
        return self.mesh.folds(self.members[peer], nbytes)

    async def recv(
        self, peer: int, *, step: int, chunk: int = 0, out: np.ndarray | memoryview | None = None
    ) -> memoryview:
        """Receive the matching message from group rank ``peer``. With ``out``
        the bytes land in it (sizes must match exactly) and a byte view of
        ``out`` is returned; without, a fresh writable buffer is returned."""
        fut = self._mailbox.take(self.op, (self.members[peer], step, chunk), None if out is None else as_bytes(out))
        payload, _ = await (fut if self._trace is None else self._traced(fut, peer, step, chunk))
        return payload  # type: ignore[no-any-return]

    async def recv_meta(
        self, peer: int, *, step: int, chunk: int = 0, out: np.ndarray | memoryview | None = None
    ) -> tuple[memoryview, dict[str, Any] | None]:
        """Like :meth:`recv`, also returning the sender's ``meta`` (or None)."""
        fut = self._mailbox.take(self.op, (self.members[peer], step, chunk), None if out is None else as_bytes(out))
        payload, header = await (fut if self._trace is None else self._traced(fut, peer, step, chunk))
        return payload, header.get("m")
