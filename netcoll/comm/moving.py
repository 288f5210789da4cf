"""The collectives of the :class:`~netcoll.comm.Communicator` that move data
from one rank or between all, unreduced: ``broadcast``, ``scatter``,
``all_to_all``, and ``barrier`` (their plans: :mod:`netcoll.calls.moving`).

A rank that passes no buffer (``broadcast(None)``, ``scatter(None)``) gets
what was sent as it was sent: an array, or a tensor when the sender passed
one and this process has torch loaded; so those calls return ``Work[Any]``.

Each is a function of ``self: Communicator`` that the class binds by name
(``all_reduce = reducing.all_reduce``): a method like any other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

from ..calls import moving
from ..compression import resolve
from ..tensors import inputs

if TYPE_CHECKING:
    from ..compression import Compression
    from ..operation import Work
    from .communicator import Communicator
    from .types import (
        AllToAllAlgorithm,
        Array,
        ArrayIn,
        BarrierAlgorithm,
        BroadcastAlgorithm,
        ScatterAlgorithm,
        TensorLike,
        TensorOut,
    )


@overload
def broadcast(
    self: Communicator,
    x: None = None,
    root: int = 0,
    *,
    timeout: float | None = None,
    algorithm: BroadcastAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[Any]: ...


@overload
def broadcast(
    self: Communicator,
    x: TensorLike[TensorOut],
    root: int = 0,
    *,
    timeout: float | None = None,
    algorithm: BroadcastAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[TensorOut]: ...


@overload
def broadcast(
    self: Communicator,
    x: ArrayIn,
    root: int = 0,
    *,
    timeout: float | None = None,
    algorithm: BroadcastAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[Array]: ...
def broadcast(
    self: Communicator,
    x: ArrayIn | TensorLike[Any] | None = None,
    root: int = 0,
    *,
    timeout: float | None = None,
    algorithm: BroadcastAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[Any]:
    """Rank ``root``'s ``x`` to every rank.

    Args:
        x: at the root, the array to send (any shape; every numeric dtype,
            ``bool``, ``bfloat16``; a numpy array or anything
            ``numpy.asarray`` takes, or a CPU torch tensor), never
            modified. Elsewhere ``None`` (shape and dtype travel with the
            data), or a C-contiguous, writeable buffer of the root's shape
            and dtype to receive into.
        root: the sending rank, ``0 <= root < world_size``.
        timeout: seconds the call may run (default: the communicator's
            :attr:`timeout`, 300 s unless ``connect(collective_timeout=)``).
            When it passes, this rank fails with ``CollectiveTimeout`` and
            the others are told to abort.
        algorithm: ``"auto"`` (the root chooses the tree or the chain by
            the size, the others follow), ``"tree"``, ``"ring"`` (a
            pipelined chain) or ``"sized"`` (what ``auto`` runs).
        compression: ``"none"``, ``"fp16"``, ``"bf16"`` or ``"int8"`` (None: the default,
            ``NETCOLL_COMPRESSION``, else ``"none"``): the codec every contribution crosses the
            links in; every rank, the root too, returns the decoded array (not the root's ``x``
            itself). Float inputs only (``ValueError`` for integer, bool or complex). Bounds:
            docs/compression.md.

    Returns:
        A :class:`~netcoll.Work`, issued now: the root's array. At the root
        that is ``x`` itself when it is a C-contiguous numpy array (sent
        without a copy, never modified), else a contiguous copy; a rank
        that passed a buffer gets that buffer; one that passed ``None``, a
        new array (a tensor when the root sent one and torch is loaded).

    Raises:
        TypeError: at the call, before anything is sent: an unsupported
            dtype, a buffer that is not an array.
        ValueError: at the call: a ``root`` that is not a rank, an unknown
            algorithm, a buffer that is not C-contiguous and writeable,
            ``timeout`` not positive, ``x`` over ``max_array_bytes``.
        CommunicatorClosed: at the call, on a closed communicator.
        CollectiveError: from the Work: ``MismatchError`` when a buffer's
            shape or dtype is not the root's (or the ranks made different
            calls), ``CollectiveTimeout`` (names the ranks still awaited),
            ``PeerLost``, ``CollectiveAborted``, ``CollectiveCancelled``,
            ``CollectiveClosed``, ``LimitExceeded`` (the root declared more
            than ``max_array_bytes``).

    Example::

        weights = await comm.broadcast(weights if comm.rank == 0 else None, root=0)
    """
    (x, _, io), codec = inputs(x), resolve(compression)
    return self._plan(lambda e: moving.broadcast(e, x, root, algorithm, io is not None, codec), timeout, io)


@overload
def scatter(
    self: Communicator,
    x: None = None,
    root: int = 0,
    *,
    out: Array | None = None,
    timeout: float | None = None,
    algorithm: ScatterAlgorithm = "auto",
) -> Work[Any]: ...


@overload
def scatter(
    self: Communicator,
    x: TensorLike[TensorOut] | Sequence[TensorLike[TensorOut]],
    root: int = 0,
    *,
    out: TensorLike[TensorOut] | None = None,
    timeout: float | None = None,
    algorithm: ScatterAlgorithm = "auto",
) -> Work[TensorOut]: ...


@overload
def scatter(
    self: Communicator,
    x: ArrayIn,
    root: int = 0,
    *,
    out: Array | None = None,
    timeout: float | None = None,
    algorithm: ScatterAlgorithm = "auto",
) -> Work[Array]: ...
def scatter(
    self: Communicator,
    x: ArrayIn | TensorLike[Any] | Sequence[TensorLike[Any]] | None = None,
    root: int = 0,
    *,
    out: Array | TensorLike[Any] | None = None,
    timeout: float | None = None,
    algorithm: ScatterAlgorithm = "auto",
) -> Work[Any]:
    """Row ``rank`` of rank ``root``'s ``x`` to each rank.

    Args:
        x: at the root, an array of shape ``(world_size, *s)`` (rank ``k``
            gets ``x[k]``), or a list (or tuple) of ``world_size`` arrays
            of one dtype and any shapes (rank ``k`` gets ``x[k]``);
            elsewhere ``None`` (shapes and dtypes travel with the data).
            Never modified.
        root: the sending rank, ``0 <= root < world_size``.
        out: a C-contiguous, writeable array of one row's shape and dtype
            to receive into, on every rank or on none (the root's ``x``
            then one array, not a list).
        timeout: seconds the call may run (default: the communicator's
            :attr:`timeout`); as for :meth:`broadcast`.
        algorithm: ``"auto"`` or ``"direct"``.

    Returns:
        A :class:`~netcoll.Work`, issued now: this rank's row (``out`` if
        given; a tensor when the root sent tensors and torch is loaded).

    Raises:
        TypeError, ValueError: at the call, as for :meth:`broadcast`, and
            ``ValueError`` when the root's leading axis (or list length)
            is not ``world_size``, or ``out`` does not match its rows.
        CommunicatorClosed: at the call, on a closed communicator.
        CollectiveError: from the Work, as for :meth:`broadcast`.

    Example::

        batch = await comm.scatter(batches if comm.rank == 0 else None, root=0)
    """
    x, out, io = inputs(x, out)
    return self._plan(lambda e: moving.scatter(e, x, root, out, algorithm, io is not None), timeout, io)


@overload
def all_to_all(
    self: Communicator,
    x: Sequence[TensorLike[TensorOut]],
    *,
    timeout: float | None = None,
    algorithm: AllToAllAlgorithm = "auto",
) -> Work[list[TensorOut]]: ...


@overload
def all_to_all(
    self: Communicator,
    x: list[Any] | tuple[Any, ...],
    *,
    timeout: float | None = None,
    algorithm: AllToAllAlgorithm = "auto",
) -> Work[list[Any]]: ...


@overload
def all_to_all(
    self: Communicator,
    x: TensorLike[TensorOut],
    *,
    out: TensorLike[TensorOut] | None = None,
    timeout: float | None = None,
    algorithm: AllToAllAlgorithm = "auto",
) -> Work[TensorOut]: ...


@overload
def all_to_all(
    self: Communicator,
    x: ArrayIn,
    *,
    out: Array | None = None,
    timeout: float | None = None,
    algorithm: AllToAllAlgorithm = "auto",
) -> Work[Array]: ...
def all_to_all(
    self: Communicator,
    x: ArrayIn | TensorLike[Any] | Sequence[TensorLike[Any]],
    *,
    out: Array | TensorLike[Any] | None = None,
    timeout: float | None = None,
    algorithm: AllToAllAlgorithm = "auto",
) -> Work[Any]:
    """Exchange rows: ``y[j]`` is rank ``j``'s ``x[rank]``.

    Args:
        x: an array of shape ``(world_size, *s)``, of the same shape and
            dtype on every rank (row ``j`` goes to rank ``j``); or a list
            (or tuple) of ``world_size`` arrays of one dtype and any shapes
            (as MPI's ``alltoallv``; shapes travel with the data). Never
            modified.
        out: a C-contiguous, writeable array of ``x``'s shape and dtype
            that receives the result (not with a list).
        timeout: seconds the call may run (default: the communicator's
            :attr:`timeout`); as for :meth:`broadcast`.
        algorithm: ``"auto"``, ``"pairwise"`` or ``"linear"``; a list
            takes ``"auto"`` or ``"pairwise"``.

    Returns:
        A :class:`~netcoll.Work`, issued now: an array ``y`` of ``x``'s
        shape (``out`` if given); for a list, a list of ``world_size``
        arrays (item ``j`` as rank ``j`` sent it: a tensor when it sent one
        and torch is loaded).

    Raises:
        TypeError, ValueError: at the call, as for :meth:`broadcast`, and
            ``ValueError`` when the leading axis (or list length) is not
            ``world_size``, ``TypeError`` for a list of mixed dtypes.
        CommunicatorClosed: at the call, on a closed communicator.
        CollectiveError: from the Work, as for :meth:`broadcast`.

    Example::

        tokens_for_me = await comm.all_to_all([tokens[dest == j] for j in range(comm.world_size)])
    """
    x, out, io = inputs(x, out)
    return self._plan(lambda e: moving.all_to_all(e, x, out, algorithm, io is not None), timeout, io)


def barrier(self: Communicator, *, timeout: float | None = None, algorithm: BarrierAlgorithm = "auto") -> Work[None]:
    """Done once every rank of the group has entered the barrier.

    Args:
        timeout: seconds the call may run (default: the communicator's
            :attr:`timeout`); when it passes, the error names the ranks
            that never entered.
        algorithm: ``"auto"`` or ``"doubling"`` (dissemination).

    Returns:
        A :class:`~netcoll.Work` issued now, whose result is ``None``.

    Raises:
        ValueError: at the call: an unknown algorithm, ``timeout`` not positive.
        CommunicatorClosed: at the call, on a closed communicator.
        CollectiveError: from the Work: ``CollectiveTimeout``, ``PeerLost``,
            ``MismatchError``, ``CollectiveAborted``, ``CollectiveCancelled``,
            ``CollectiveClosed``.

    Example::

        await comm.barrier()
    """
    return self._plan(lambda e: moving.barrier(e, algorithm), timeout)


__all__ = ["all_to_all", "barrier", "broadcast", "scatter"]
