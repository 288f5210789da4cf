"""The gathering collectives of the :class:`~netcoll.comm.Communicator`:
``all_gather`` and ``gather`` (their plans: :mod:`netcoll.calls.moving`).
``uneven=True`` makes the result a list, so each has an overload for it.

Each is a function of ``self: Communicator`` that the class binds by name
(``all_reduce = reducing.all_reduce``): a method like any other."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

from ..calls import moving
from ..compression import resolve
from ..tensors import inputs

if TYPE_CHECKING:
    from ..compression import Compression
    from ..operation import Work
    from .communicator import Communicator
    from .types import AllGatherAlgorithm, Array, ArrayIn, GatherAlgorithm, TensorLike, TensorOut


@overload
def all_gather(
    self: Communicator,
    x: TensorLike[TensorOut],
    *,
    uneven: Literal[False] = False,
    out: TensorLike[TensorOut] | None = None,
    timeout: float | None = None,
    algorithm: AllGatherAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[TensorOut]: ...


@overload
def all_gather(
    self: Communicator,
    x: TensorLike[TensorOut],
    *,
    uneven: Literal[True],
    timeout: float | None = None,
    algorithm: AllGatherAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[list[TensorOut]]: ...


@overload
def all_gather(
    self: Communicator,
    x: ArrayIn,
    *,
    uneven: Literal[False] = False,
    out: Array | None = None,
    timeout: float | None = None,
    algorithm: AllGatherAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[Array]: ...


@overload
def all_gather(
    self: Communicator,
    x: ArrayIn,
    *,
    uneven: Literal[True],
    timeout: float | None = None,
    algorithm: AllGatherAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[list[Array]]: ...


@overload
def all_gather(
    self: Communicator,
    x: ArrayIn | TensorLike[Any],
    *,
    uneven: bool,
    out: Array | TensorLike[Any] | None = None,
    timeout: float | None = None,
    algorithm: AllGatherAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[Any]: ...
def all_gather(
    self: Communicator,
    x: ArrayIn | TensorLike[Any],
    *,
    uneven: bool = False,
    out: Array | TensorLike[Any] | None = None,
    timeout: float | None = None,
    algorithm: AllGatherAlgorithm = "auto",
    compression: Compression | None = None,
) -> Work[Any]:
    """Every rank's ``x``, stacked on every rank: row ``r`` from rank ``r``.

    Args:
        x: this rank's block, of the same shape and dtype on every rank
            (every numeric dtype, ``bool``, ``bfloat16``; a numpy array or
            anything ``numpy.asarray`` takes, or a CPU torch tensor). Never
            modified; it may be ``out[rank]`` (in place, as in NCCL).
        uneven: ``True`` lets the ranks pass different shapes (one dtype;
            every rank passes the same value): the result is then a list.
        out: a C-contiguous, writeable array of shape
            ``(world_size, *x.shape)`` and ``x``'s dtype that receives the
            result (not with ``uneven=True``).
        timeout: seconds the call may run (default: the communicator's
            :attr:`timeout`, 300 s unless ``connect(collective_timeout=)``).
            When it passes, this rank fails with ``CollectiveTimeout`` and
            the others are told to abort.
        algorithm: ``"auto"``, ``"ring"`` or ``"doubling"`` (Bruck's);
            with ``uneven=True``, ``"auto"`` or ``"pairwise"``.
        compression: ``"none"``, ``"fp16"``, ``"bf16"`` or ``"int8"`` (None: the default,
            ``NETCOLL_COMPRESSION``, else ``"none"``): the codec every contribution crosses the
            links in; every row, this rank's own too, is the decoded one; not with ``uneven``. Float
            inputs only (``ValueError`` for integer, bool or complex). Bounds: docs/compression.md.

    Returns:
        A :class:`~netcoll.Work`, issued now: an array of shape
        ``(world_size, *x.shape)`` (``out`` if given); with
        ``uneven=True``, a list of ``world_size`` arrays, item ``r`` from
        rank ``r``. Tensors for a tensor ``x``.

    Raises:
        TypeError: at the call, before anything is sent: an unsupported
            dtype, ``uneven`` not a bool, ``out`` not an array.
        ValueError: at the call: an unknown algorithm, ``out`` of another
            shape or dtype, or with ``uneven=True``, ``timeout`` not
            positive, ``x`` over ``max_array_bytes``.
        CommunicatorClosed: at the call, on a closed communicator.
        CollectiveError: from the Work: ``CollectiveTimeout`` (names the
            ranks still awaited), ``PeerLost``, ``MismatchError`` (ranks
            passed different shapes or dtypes, or made different calls),
            ``CollectiveAborted``, ``CollectiveCancelled``,
            ``CollectiveClosed``, ``LimitExceeded``.

    Example::

        table = await comm.all_gather(np.array([comm.rank, n_items]))  # shape (world_size, 2)
        parts = await comm.all_gather(shard, uneven=True)             # list of world_size arrays
    """
    (x, out, io), codec = inputs(x, out), resolve(compression)
    return self._plan(lambda e: moving.all_gather(e, x, uneven, out, algorithm, io is not None, codec), timeout, io)


@overload
def gather(
    self: Communicator,
    x: TensorLike[TensorOut],
    root: int = 0,
    *,
    uneven: Literal[False] = False,
    out: TensorLike[TensorOut] | None = None,
    timeout: float | None = None,
    algorithm: GatherAlgorithm = "auto",
) -> Work[TensorOut | None]: ...


@overload
def gather(
    self: Communicator,
    x: TensorLike[TensorOut],
    root: int = 0,
    *,
    uneven: Literal[True],
    timeout: float | None = None,
    algorithm: GatherAlgorithm = "auto",
) -> Work[list[TensorOut] | None]: ...


@overload
def gather(
    self: Communicator,
    x: ArrayIn,
    root: int = 0,
    *,
    uneven: Literal[False] = False,
    out: Array | None = None,
    timeout: float | None = None,
    algorithm: GatherAlgorithm = "auto",
) -> Work[Array | None]: ...


@overload
def gather(
    self: Communicator,
    x: ArrayIn,
    root: int = 0,
    *,
    uneven: Literal[True],
    timeout: float | None = None,
    algorithm: GatherAlgorithm = "auto",
) -> Work[list[Array] | None]: ...


@overload
def gather(
    self: Communicator,
    x: ArrayIn | TensorLike[Any],
    root: int = 0,
    *,
    uneven: bool,
    out: Array | TensorLike[Any] | None = None,
    timeout: float | None = None,
    algorithm: GatherAlgorithm = "auto",
) -> Work[Any]: ...
def gather(
    self: Communicator,
    x: ArrayIn | TensorLike[Any],
    root: int = 0,
    *,
    uneven: bool = False,
    out: Array | TensorLike[Any] | None = None,
    timeout: float | None = None,
    algorithm: GatherAlgorithm = "auto",
) -> Work[Any]:
    """Every rank's ``x``, stacked at rank ``root``: row ``r`` from rank ``r``.

    Args:
        x: this rank's block, of the same shape and dtype on every rank
            (dtypes as :meth:`all_gather`). Never modified.
        root: the rank that gets the result, ``0 <= root < world_size``.
        uneven: ``True`` lets the ranks pass different shapes (one dtype;
            every rank passes the same value): the root gets a list.
        out: used at the root: a C-contiguous, writeable array of shape
            ``(world_size, *x.shape)`` and ``x``'s dtype that receives the
            result (not with ``uneven=True``).
        timeout: seconds the call may run (default: the communicator's
            :attr:`timeout`); as for :meth:`all_gather`.
        algorithm: ``"auto"`` or ``"direct"``.

    Returns:
        A :class:`~netcoll.Work`, issued now: at the root an array of
        shape ``(world_size, *x.shape)`` (``out`` if given), or with
        ``uneven=True`` a list of ``world_size`` arrays; ``None`` on every
        other rank.

    Raises:
        TypeError, ValueError: at the call, as for :meth:`all_gather`, and
            ``ValueError`` for a ``root`` that is not a rank.
        CommunicatorClosed: at the call, on a closed communicator.
        CollectiveError: from the Work, as for :meth:`all_gather`.

    Example::

        rows = await comm.gather(metrics, root=0)   # None except on rank 0
    """
    x, out, io = inputs(x, out)
    return self._plan(lambda e: moving.gather(e, x, root, uneven, out, algorithm, io is not None), timeout, io)


__all__ = ["all_gather", "gather"]
