"""The reducing collectives of the :class:`~netcoll.comm.Communicator`:
``all_reduce``, ``reduce`` and ``reduce_scatter`` (their plans:
:mod:`netcoll.calls.reducing`).

Each is a function of ``self: Communicator`` that the class binds by name
(``all_reduce = reducing.all_reduce``): a method like any other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

from ..calls import partial as partial_
from ..calls import reducing
from ..compression import resolve
from ..tensors import inputs

if TYPE_CHECKING:
    from ..compression import Compression
    from ..operation import Work
    from .communicator import Communicator
    from .types import (
        AllReduceAlgorithm,
        Array,
        ArrayIn,
        Op,
        ReduceAlgorithm,
        ReduceScatterAlgorithm,
        TensorLike,
        TensorOut,
    )


@overload
def all_reduce(
    self: Communicator,
    x: TensorLike[TensorOut],
    op: Op = "sum",
    *,
    out: TensorLike[TensorOut] | None = None,
    timeout: float | None = None,
    algorithm: AllReduceAlgorithm = "auto",
    compression: Compression | None = None,
    partial: bool = False,
    deadline: float | None = None,
) -> Work[TensorOut]: ...


@overload
def all_reduce(
    self: Communicator,
    x: ArrayIn,
    op: Op = "sum",
    *,
    out: Array | None = None,
    timeout: float | None = None,
    algorithm: AllReduceAlgorithm = "auto",
    compression: Compression | None = None,
    partial: bool = False,
    deadline: float | None = None,
) -> Work[Array]: ...
def all_reduce(
    self: Communicator,
    x: ArrayIn | TensorLike[Any],
    op: Op = "sum",
    *,
    out: Array | TensorLike[Any] | None = None,
    timeout: float | None = None,
    algorithm: AllReduceAlgorithm = "auto",
    compression: Compression | None = None,
    partial: bool = False,
    deadline: float | None = None,
) -> Work[Any]:
    """Reduce ``x`` element-wise over every rank; every rank gets the result.

    The result is **bit-identical on every rank** (the reduction order is
    fixed, never decided by arrival). ``x`` is never modified, unless
    ``out`` is ``x`` (in place).

    Args:
        x: this rank's contribution, of the same shape and dtype on every
            rank: a numpy array (or anything ``numpy.asarray`` takes) or a
            CPU torch tensor. Every numeric dtype, ``bool`` and ``bfloat16``;
            0-d, empty and non-contiguous arrays work.
        op: ``"sum"`` (default), ``"prod"``, ``"min"``, ``"max"``,
            ``"avg"``, ``"band"``, ``"bor"``, ``"bxor"``; or a
            :class:`~netcoll.ReduceOp`, or a ``torch.distributed.ReduceOp``
            value. ``avg`` needs a floating or complex dtype (it divides
            once, at the end), the bitwise ops an integer or bool dtype;
            ``min``/``max`` are undefined for complex. Integers wrap on
            overflow.
        out: a C-contiguous, writeable array of ``x``'s shape and dtype
            that receives the result and is returned (``x`` itself: in place).
        timeout: seconds the call may run (default: the communicator's
            :attr:`timeout`, 300 s unless ``connect(collective_timeout=)``).
            When it passes, this rank fails with ``CollectiveTimeout`` and
            the others are told to abort.
        algorithm: ``"auto"`` (chosen by size, world size and links;
            ``NETCOLL_ALGO`` may force one), or ``"ring"``, ``"tree"``,
            ``"doubling"``, ``"halving"``, ``"allpairs"``, ``"weighted"`` (shares
            by the ranks' measured rates; docs/algorithms.md).
        compression: ``"none"``, ``"fp16"``, ``"bf16"`` or ``"int8"`` (None: the default,
            ``NETCOLL_COMPRESSION``, else ``"none"``): the codec every contribution crosses the
            links in; reduced in ``x``'s dtype in rank order, and the result decoded from the same
            bytes on every rank (still bit-identical); ``op`` sum, avg, min or max; ``algorithm``
            ``"auto"``. Float inputs only (``ValueError`` for integer, bool or complex). Bounds:
            docs/compression.md.
        partial: reduce over the ranks that delivered by the deadline
            instead of failing without them (local SGD, DiLoCo-style outer
            steps; docs/training.md, "Partial results"). Every rank sends
            ``x`` to every other; a rank whose link is lost is left out at
            once, a slow one when the deadline passes; the coordinator
            decides the contributors (the first proposal wins), named by
            ``work.contributors``; ``avg`` divides by their number. Every
            rank that returns gets the same bits and contributors; a rank
            left out gets :class:`~netcoll.errors.PartialExcluded`, one that
            lacks an agreed contribution whose sender was lost
            :class:`~netcoll.errors.PartialMismatch`. All ranks delivering:
            the result is ``algorithm="allpairs"``'s, bit for bit. Needs a
            Communicator of :func:`netcoll.connect` (or a ``MemoryHub``);
            ``algorithm`` must be ``"auto"``. Cost: ``(world_size - 1)`` times
            ``x``'s bytes sent per rank, and a coordinator round trip.
        deadline: with ``partial``: seconds to wait for contributions
            (default: ``timeout``); at most ``timeout``. The call may then run
            up to 30 s past ``timeout`` to agree and finish.

    Returns:
        A :class:`~netcoll.Work`, issued now (its place in the group's
        order is fixed at the call): awaiting it gives the reduced array
        (``out`` if given; a ``torch.Tensor`` for a tensor). Its
        ``contributors`` is None, or with ``partial`` the agreed ranks.

    Raises:
        TypeError: at the call, before anything is sent: an unsupported
            dtype, an ``op`` the dtype does not allow, an ``op`` of
            another type, ``out`` not an array.
        ValueError: at the call: an unknown op or algorithm, ``out`` of
            another shape or dtype or not C-contiguous, ``timeout`` not
            positive, ``x`` over ``max_array_bytes`` (16 GiB); with
            ``partial``: an algorithm other than ``"auto"``, a ``deadline``
            not positive or over ``timeout``, a Communicator with no decider;
            ``deadline`` without ``partial``. (TypeError: ``partial`` not a bool.)
        CommunicatorClosed: at the call, on a closed communicator.
        CollectiveError: from the Work: ``CollectiveTimeout`` (names the
            ranks still awaited, or the deadlock), ``PeerLost``,
            ``MismatchError`` (the ranks called different collectives,
            shapes, dtypes or ops: both calls named), ``CollectiveAborted``
            (another rank failed it), ``CollectiveCancelled``,
            ``CollectiveClosed``, ``LimitExceeded``; with ``partial``:
            ``PartialExcluded``, ``PartialMismatch``.

    Example::

        grads = await comm.all_reduce(grads, op="avg")
        work = comm.all_reduce(loss)  # in flight; await it later
    """
    return _all_reduce(self, x, op, out, timeout, algorithm, compression, partial, deadline)


def _all_reduce(
    self: Communicator,
    x: Any,
    op: Op,
    out: Any,
    timeout: float | None,
    algorithm: Any,
    compression: Any,
    partial: bool,
    deadline: float | None,
) -> Work[Any]:
    """The all_reduce of every rank, compressed or not, or a partial one (:func:`_partial`)."""
    if partial_.check_partial(partial, algorithm, compression, deadline):
        return _partial(self, x, op, out, timeout, deadline)
    (x, out, io), codec = inputs(x, out), resolve(compression)
    return self._plan(lambda e: reducing.all_reduce(e, x, op, out, algorithm, codec), timeout, io)


def _partial(self: Communicator, x: Any, op: Op, out: Any, timeout: float | None, deadline: float | None) -> Work[Any]:
    """A partial all_reduce (:mod:`netcoll.calls.partial`): its Work names the contributors."""
    window, limit = partial_.deadlines(self.timeout, timeout, deadline)
    x, out, io = inputs(x, out)
    agreement = partial_.Agreement()
    work = self._plan(lambda e: partial_.all_reduce(e, x, op, out, agreement, window, limit), limit, io)
    work._agreed = agreement
    return work


@overload
def reduce(
    self: Communicator,
    x: TensorLike[TensorOut],
    op: Op = "sum",
    root: int = 0,
    *,
    out: TensorLike[TensorOut] | None = None,
    timeout: float | None = None,
    algorithm: ReduceAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[TensorOut | None]: ...


@overload
def reduce(
    self: Communicator,
    x: ArrayIn,
    op: Op = "sum",
    root: int = 0,
    *,
    out: Array | None = None,
    timeout: float | None = None,
    algorithm: ReduceAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[Array | None]: ...
def reduce(
    self: Communicator,
    x: ArrayIn | TensorLike[Any],
    op: Op = "sum",
    root: int = 0,
    *,
    out: Array | TensorLike[Any] | None = None,
    timeout: float | None = None,
    algorithm: ReduceAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[Any]:
    """Reduce ``x`` element-wise over every rank into rank ``root``.

    Args:
        x: this rank's contribution, of the same shape and dtype on every
            rank (dtypes as :meth:`all_reduce`). Never modified.
        op: the reduction, as for :meth:`all_reduce` (default ``"sum"``).
        root: the rank that gets the result, ``0 <= root < world_size``.
        out: used at the root, ignored elsewhere: a C-contiguous, writeable
            array of ``x``'s shape and dtype that receives the result.
        timeout: seconds the call may run (default: the communicator's
            :attr:`timeout`); as for :meth:`all_reduce`.
        algorithm: ``"auto"``, ``"tree"`` or ``"ring"``.
        compression: ``"none"``, ``"fp16"``, ``"bf16"`` or ``"int8"`` (None: the default,
            ``NETCOLL_COMPRESSION``, else ``"none"``): the codec every contribution crosses the
            links in; reduced in ``x``'s dtype; ``op`` sum, avg, min or max; ``algorithm``
            ``"auto"``. Float inputs only (``ValueError`` for integer, bool or complex). Bounds:
            docs/compression.md.

    Returns:
        A :class:`~netcoll.Work`, issued now: the reduced array at the
        root (``out`` if given), ``None`` on every other rank.

    Raises:
        TypeError, ValueError: at the call, as for :meth:`all_reduce`, and
            ``ValueError`` for a ``root`` that is not a rank.
        CommunicatorClosed: at the call, on a closed communicator.
        CollectiveError: from the Work, as for :meth:`all_reduce` (ranks
            passing different roots get a ``MismatchError`` or, when no
            frame crosses, a ``CollectiveTimeout`` naming the wait).

    Example::

        total = await comm.reduce(counts, op="sum", root=0)
        if comm.rank == 0:
            assert total is not None
    """
    (x, out, io), codec = inputs(x, out), resolve(compression)
    return self._plan(lambda e: reducing.reduce(e, x, op, root, out, algorithm, codec), timeout, io)


@overload
def reduce_scatter(
    self: Communicator,
    x: TensorLike[TensorOut] | Sequence[TensorLike[TensorOut]],
    op: Op = "sum",
    *,
    out: TensorLike[TensorOut] | None = None,
    timeout: float | None = None,
    algorithm: ReduceScatterAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[TensorOut]: ...


@overload
def reduce_scatter(
    self: Communicator,
    x: ArrayIn,
    op: Op = "sum",
    *,
    out: Array | None = None,
    timeout: float | None = None,
    algorithm: ReduceScatterAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[Array]: ...
def reduce_scatter(
    self: Communicator,
    x: ArrayIn | TensorLike[Any] | Sequence[TensorLike[Any]],
    op: Op = "sum",
    *,
    out: Array | TensorLike[Any] | None = None,
    timeout: float | None = None,
    algorithm: ReduceScatterAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[Any]:
    """Reduce ``x`` over every rank; rank ``r`` gets row ``r`` of the result.

    Args:
        x: an array of shape ``(world_size, *s)``, of the same shape and
            dtype on every rank (dtypes as :meth:`all_reduce`); or a list
            (or tuple) of ``world_size`` arrays of one dtype, ``x[j]`` of
            one shape on every rank but shapes that may differ between
            ``j`` (uneven rows, reduced in the fixed order
            ``((x[r+1] op x[r+2]) op ...) op x[r]``). Never modified.
        op: the reduction, as for :meth:`all_reduce` (default ``"sum"``).
        out: a C-contiguous, writeable array of shape ``s`` and ``x``'s
            dtype that receives this rank's row (not with a list).
        timeout: seconds the call may run (default: the communicator's
            :attr:`timeout`); as for :meth:`all_reduce`.
        algorithm: ``"auto"``, ``"ring"`` or ``"halving"``; a list takes
            ``"auto"`` or ``"pairwise"``.
        compression: ``"none"``, ``"fp16"``, ``"bf16"`` or ``"int8"`` (None: the default,
            ``NETCOLL_COMPRESSION``, else ``"none"``): the codec every contribution crosses the
            links in; reduced in ``x``'s dtype in rank order; one array ``x``, not a list; ``op``
            sum, avg, min or max; ``algorithm`` ``"auto"``. Float inputs only (``ValueError`` for
            integer, bool or complex). Bounds: docs/compression.md.

    Returns:
        A :class:`~netcoll.Work`, issued now: this rank's reduced row
        (``out`` if given), shape ``s`` (``x[rank]``'s for a list).

    Raises:
        TypeError, ValueError: at the call, as for :meth:`all_reduce`, and
            ``ValueError`` when ``x``'s leading axis is not ``world_size``
            (or the list's length), ``TypeError`` for a list of mixed dtypes.
        CommunicatorClosed: at the call, on a closed communicator.
        CollectiveError: from the Work, as for :meth:`all_reduce`.

    Example::

        mine = await comm.reduce_scatter(grads.reshape(comm.world_size, -1), op="avg")
    """
    (x, out, io), codec = inputs(x, out), resolve(compression)
    return self._plan(lambda e: reducing.reduce_scatter(e, x, op, out, algorithm, codec), timeout, io)


__all__ = ["all_reduce", "reduce", "reduce_scatter"]
