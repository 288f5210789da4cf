"""The public :class:`Communicator`: every collective is *issued when it is
called* and returns a :class:`~netcoll.operation.Work`.

Each call checks its arguments (``ValueError``/``TypeError`` are raised at
the call, before any byte is sent), takes the group's next sequence number,
and starts running; ``await comm.all_reduce(x)`` is the common use, and
several Works may be in flight and awaited in any order. Ranks must issue the
same collectives in the same order (concurrent calls are fine, as in NCCL).
Each call sends a fingerprint of itself (name, dtype, shape, op, root,
algorithm, segment size) with every frame, so ranks that disagree fail with a
:class:`~netcoll.errors.MismatchError` naming both calls. One deadline covers
a whole call; when it passes, the error names the ranks that never delivered,
and every other rank is told to abort. Cancelling a Work (or the task that
awaits it) aborts that collective on every rank, and the next one is correct.

Uneven sizes ("v" collectives, as MPI's ``alltoallv``/``gatherv``/...):
``all_to_all``, ``scatter`` and ``reduce_scatter`` also take a *list* (or
tuple) of ``world_size`` arrays of one dtype and any shapes instead of one
array with a leading rank axis, and ``gather``/``all_gather`` take
``uneven=True`` for per-rank different shapes; these return lists.

torch: every call also takes CPU torch tensors (and lists of them) wherever
it takes arrays, and then returns tensors of the same dtype and shape over the
result's memory (:mod:`netcoll.tensors`; ``out=`` / a broadcast buffer is
returned as the caller's tensor itself). ``op`` may be a
``torch.distributed.ReduceOp``.

The methods are thin: the plans in :mod:`netcoll.calls` check arguments and
build the algorithm call, :class:`~netcoll.engine.Engine` sequences and runs it.
"""

from __future__ import annotations

import numbers
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from .calls import moving, p2p, reducing
from .calls._common import Done, Plan
from .engine import DEFAULT_TIMEOUT, Engine
from .operation import Work
from .ops import ReduceOp
from .tensors import TorchIO, inputs
from .transport.base import Transport, as_bytes

Array = np.ndarray[Any, Any]


class Communicator:
    """A group of ranks that run collectives together.

    Attributes:
        rank: this process's rank in the group (0..world_size-1).
        world_size: the number of ranks in the group.
        group: the group's name (sub-groups from :meth:`split` get derived names).
    """

    def __init__(
        self,
        transport: Transport,
        *,
        group: str = "default",
        members: tuple[int, ...] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        segment_bytes: int | None = None,
    ) -> None:
        self._engine = Engine(transport, group=group, members=members, timeout=timeout, segment_bytes=segment_bytes)
        self._splits = 0
        self._on_close: list[Callable[[], Awaitable[None]]] = []

    def __repr__(self) -> str:
        return f"<Communicator group={self.group!r} rank={self.rank} world_size={self.world_size}>"

    rank = property(lambda self: self._engine.rank, doc="this rank in the group")
    world_size = property(lambda self: self._engine.world_size, doc="ranks in the group")
    group = property(lambda self: self._engine.group, doc="the group's name")
    members = property(lambda self: self._engine.members, doc="the group's world ranks")
    transport = property(lambda self: self._engine.transport, doc="the process's transport")
    timeout = property(lambda self: self._engine.timeout, doc="the default deadline (s)")
    segment_bytes = property(lambda self: self._engine.segment_bytes, doc="message segment size")
    closed = property(lambda self: self._engine.closed, doc="True once closed")

    def _issue(self, plan: Plan, timeout: float | None, io: TorchIO | None = None) -> Work:
        if io is not None:  # torch tensors in: torch tensors out
            if isinstance(plan, Done):
                plan.value = io.result(plan.value)
            else:
                post = plan.post
                plan.post = io.result if post is None else lambda value: io.result(post(value))
        if isinstance(plan, Done):
            return Work.completed(getattr(plan, "name", "local"), plan.value)
        return self._engine.issue(plan, timeout)

    # -- collectives ----------------------------------------------------------------
    def all_reduce(
        self,
        x: Any,
        op: str | ReduceOp = "sum",
        *,
        out: Any = None,
        timeout: float | None = None,
        algorithm: str = "auto",
    ) -> Work:
        """Reduce ``x`` over all ranks; every rank gets the bit-identical result
        (``out`` if given: a C-contiguous array of ``x``'s shape and dtype)."""
        x, out, io = inputs(x, out)
        return self._issue(reducing.all_reduce(self._engine, x, op, out, algorithm), timeout, io)

    def broadcast(self, x: Any = None, root: int = 0, *, timeout: float | None = None, algorithm: str = "auto") -> Work:
        """Root's ``x`` to every rank. Non-roots pass ``None`` (shape and dtype
        travel with the data) or a buffer to receive into, which is returned.
        The root's result is ``x`` itself (sent without a copy, never
        modified) when it is a C-contiguous numpy array, else a contiguous copy."""
        x, _, io = inputs(x)
        return self._issue(moving.broadcast(self._engine, x, root, algorithm, io is not None), timeout, io)

    def reduce(
        self,
        x: Any,
        op: str | ReduceOp = "sum",
        root: int = 0,
        *,
        out: Any = None,
        timeout: float | None = None,
        algorithm: str = "auto",
    ) -> Work:
        """Reduce ``x`` over all ranks into ``root``; others get ``None``.
        ``out`` (optional; used at the root, ignored elsewhere): a C-contiguous
        array of ``x``'s shape and dtype that receives and is the result."""
        x, out, io = inputs(x, out)
        return self._issue(reducing.reduce(self._engine, x, op, root, out, algorithm), timeout, io)

    def all_gather(
        self,
        x: Any,
        *,
        uneven: bool = False,
        out: Any = None,
        timeout: float | None = None,
        algorithm: str = "auto",
    ) -> Work:
        """Every rank's ``x`` stacked: an array of shape ``(world_size, *x.shape)``
        whose row ``r`` comes from rank ``r`` (``out`` if given; ``x`` may be
        ``out[rank]``, in place). ``uneven=True`` lets ranks pass different
        shapes (one dtype; every rank passes the same value): the result is
        then a list of ``world_size`` arrays."""
        x, out, io = inputs(x, out)
        return self._issue(moving.all_gather(self._engine, x, uneven, out, algorithm, io is not None), timeout, io)

    def gather(
        self,
        x: Any,
        root: int = 0,
        *,
        uneven: bool = False,
        out: Any = None,
        timeout: float | None = None,
        algorithm: str = "auto",
    ) -> Work:
        """Every rank's ``x`` stacked at ``root`` (shape ``(world_size, *x.shape)``,
        ``out`` if given there); others get ``None``. ``uneven=True``: per-rank
        shapes may differ and the root gets a list of arrays."""
        x, out, io = inputs(x, out)
        return self._issue(moving.gather(self._engine, x, root, uneven, out, algorithm, io is not None), timeout, io)

    def scatter(
        self,
        x: Any = None,
        root: int = 0,
        *,
        out: Any = None,
        timeout: float | None = None,
        algorithm: str = "auto",
    ) -> Work:
        """Row ``rank`` of the root's ``x`` to each rank.

        The root passes an array of shape ``(world_size, *s)`` or a list of
        ``world_size`` arrays of one dtype and any shapes (rank ``k`` gets
        ``x[k]``); others pass ``None`` (shape and dtype travel with the data).
        ``out``: a C-contiguous array of one row's shape and dtype to receive
        into; every rank passes one or none (the root's ``x`` then an array)."""
        x, out, io = inputs(x, out)
        return self._issue(moving.scatter(self._engine, x, root, out, algorithm, io is not None), timeout, io)

    def reduce_scatter(
        self,
        x: Any,
        op: str | ReduceOp = "sum",
        *,
        out: Any = None,
        timeout: float | None = None,
        algorithm: str = "auto",
    ) -> Work:
        """Reduce ``x`` (shape ``(world_size, *s)``) over ranks; rank ``r`` gets
        reduced row ``r`` (``out`` if given). A list of ``world_size`` arrays of
        one dtype (``x[j]`` of one shape on every rank) reduces uneven rows, in
        the fixed order ``((x[r+1] op x[r+2]) op ...) op x[r]``."""
        x, out, io = inputs(x, out)
        return self._issue(reducing.reduce_scatter(self._engine, x, op, out, algorithm), timeout, io)

    def all_to_all(self, x: Any, *, out: Any = None, timeout: float | None = None, algorithm: str = "auto") -> Work:
        """``y[j]`` = rank ``j``'s ``x[rank]``, for ``x`` of shape ``(world_size, *s)``
        (``out`` if given), or for a list of ``world_size`` arrays of one dtype
        and any shapes (as MPI's ``alltoallv``; shapes travel with the data)."""
        x, out, io = inputs(x, out)
        return self._issue(moving.all_to_all(self._engine, x, out, algorithm, io is not None), timeout, io)

    def barrier(self, *, timeout: float | None = None, algorithm: str = "auto") -> Work:
        """Done once every rank has entered the barrier."""
        return self._issue(moving.barrier(self._engine, algorithm), timeout)

    # -- point to point -------------------------------------------------------------
    def send(self, x: Any, dst: int, tag: int = 0, *, timeout: float | None = None) -> Work:
        """Send ``x`` to rank ``dst``; matched by ``dst``'s ``recv(src, tag)`` calls in order."""
        x, _, io = inputs(x)
        return self._issue(p2p.send(self._engine, x, dst, tag, io is not None), timeout, io)

    def recv(self, src: int, tag: int = 0, *, timeout: float | None = None) -> Work:
        """Receive the next array rank ``src`` sent with ``tag``."""
        return self._issue(p2p.recv(self._engine, src, tag), timeout)

    # -- groups -----------------------------------------------------------------------
    def split(self, color: int | None, key: int = 0, *, timeout: float | None = None) -> Work:
        """Collective: ranks passing the same ``color`` form a sub-group over the
        same links, ordered by (``key``, rank); the Work's result is the new
        Communicator (``None`` for ``color=None``, which joins none)."""
        for what, v in (("color", color), ("key", key)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0):
                raise ValueError(f"{what} must be a non-negative int{' or None' if what == 'color' else ''}, got {v!r}")
        row = np.array([-1 if color is None else color, key, self.rank], np.int64)
        index = self._splits
        self._splits += 1
        plan = moving.all_gather(self._engine, row, False, None, "auto")
        if isinstance(plan, Done):
            return Work.completed("split", self._sub(plan.value, color, index))
        gathered = plan.post
        assert gathered is not None

        def finish(value: Any) -> Communicator | None:
            return self._sub(gathered(value), color, index)

        plan.name, plan.post = "split", finish
        return self._engine.issue(plan, timeout)

    def _sub(self, table: Array, color: int | None, index: int) -> Communicator | None:
        if color is None:
            return None
        mine = sorted((int(k), int(r)) for c, k, r in table if c == color)
        return Communicator(
            self.transport,
            group=f"{self.group}/split{index}:{color}",
            members=tuple(self.members[r] for _, r in mine),
            timeout=self.timeout,
            segment_bytes=self.segment_bytes,
        )

    def link_stats(self) -> dict[int, dict[str, Any]]:
        """This rank's link to each other member, by group rank: its kind
        (``"tcp"``, ``"memory"``, ...), traffic, bytes held for receives not yet
        posted, and flow-control credit (:class:`netcoll.links.base.LinkStats`)."""
        stats = self.transport.link_stats()
        return {r: stats[w].as_dict() for r, w in enumerate(self.members) if w in stats}

    async def close(self) -> None:
        """Close the communicator (and, for the one :func:`connect` made, its links)."""
        if self._engine.closed:
            return
        self._engine.closed = True
        for hook in reversed(self._on_close):
            await hook()


__all__ = ["DEFAULT_TIMEOUT", "Communicator", "as_bytes"]
