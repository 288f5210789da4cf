"""What a collective is: the one registry every part of netcoll reads.

Each collective is declared once, in :data:`REGISTRY`, with

* which arguments it takes: a reduction ``op``? a ``root``? uneven sizes (and how)?
* the shape of its buffers: inputs and outputs are flat buffers of ``block``
  elements, or ``(world_size, block)`` arrays with one block per rank;
* who passes data and who gets a result (everyone, or only the root);
* its nccl-tests bus-bandwidth factor (``busbw = algbw * factor(P)``,
  ``doc/PERFORMANCE.md`` of nccl-tests);
* what the result must be on each rank for generated test data (as *segments*:
  which rank's pattern, or the reduction of all ranks', at which block offset),
  which gives one generator and one verifier for the benchmark and the job service;
* how to call it: :meth:`Collective.call` calls ``comm.<name>(...)`` with the
  arguments it takes;
* its algorithms: the names in :data:`netcoll.algorithms.ALGORITHMS`, plus ``auto``.

The command line (``netcoll submit``, ``netcoll bench``), the job model and
runner (:mod:`netcoll.service.jobs`, :mod:`netcoll.service.runner`) and the
benchmark (:mod:`netcoll.bench`) take their lists, factors, data and dispatch
from here. Importing this module loads no numpy (the CLI lists collectives
cheaply); algorithms, data and dispatch load what they need on first use.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    import numpy as np

    from .comm import Communicator
    from .testdata import TestData

__all__ = [
    "NAMES",
    "REDUCED",
    "REGISTRY",
    "WITH_DATA",
    "CallArgs",
    "Collective",
    "algorithms_help",
    "get",
]

#: A segment's source meaning "the reduction over every rank" rather than one rank's data.
REDUCED: Final = -1
#: (source rank or REDUCED, offset into that source's data in blocks)
Segment = tuple[int, int]
#: How uneven (per-rank different) sizes are offered: not at all, ``uneven=True``, or lists.
Uneven = Literal["no", "flag", "lists"]


@dataclasses.dataclass(frozen=True)
class CallArgs:
    """The arguments of one call; each collective passes on those it takes. ``op`` and
    ``algorithm`` are names from a job or a command line (the Communicator's typed
    literals cannot be known statically here: the plans check them, ValueError)."""

    op: Any = "sum"
    root: int = 0
    out: Any = None
    algorithm: Any = "auto"
    timeout: float | None = None
    compression: Any = None  #: a codec name, for the collectives that take one (None: the default)


Invoke = Callable[["Communicator", Any, CallArgs], Awaitable[Any]]


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective: arguments, buffer layout, bandwidth factor, test data, dispatch."""

    name: str
    summary: str  #: one line, for ``--help``
    invoke: Invoke = dataclasses.field(repr=False)  #: ``(comm, x, args) -> comm.<name>(...)``
    busbw: Callable[[int], float] = dataclasses.field(repr=False)  #: world size -> nccl-tests factor
    #: (rank, root, world size) -> the segments of this rank's result; None: no data (barrier)
    expected: Callable[[int, int, int], list[Segment]] | None = dataclasses.field(repr=False)
    takes_op: bool = False
    takes_root: bool = False
    uneven: Uneven = "no"
    input_blocks: bool = False  #: the input is ``(world_size, block)``, one block per rank
    output_blocks: bool = False  #: the output is ``(world_size, block)``
    root_sends: bool = False  #: only the root passes data; the others pass None
    root_receives: bool = False  #: only the root gets a result; the others get None
    root_result_is_input: bool = False  #: the root's result is its own input (broadcast)
    takes_compression: bool = False  #: ``compression=`` (netcoll.compression)

    # -- facts ------------------------------------------------------------------------------
    @property
    def algorithms(self) -> tuple[str, ...]:
        """``auto`` and the names of :data:`netcoll.algorithms.ALGORITHMS` for this collective."""
        from .algorithms import ALGORITHMS

        return ("auto", *ALGORITHMS[self.name])

    @property
    def has_data(self) -> bool:
        """False for barrier: no buffer, nothing to generate, verify or measure in bytes."""
        return self.expected is not None

    @property
    def blocked(self) -> bool:
        """One block per rank in the input or the output (the ``count`` column is a block)."""
        return self.input_blocks or self.output_blocks

    def busbw_factor(self, world_size: int) -> float:
        return self.busbw(world_size)

    def bandwidth(self, nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
        """(algbw, busbw) in GB/s (1e9 bytes/s) for one call moving ``nbytes`` (nccl-tests' size)."""
        if seconds <= 0 or nbytes <= 0:
            return 0.0, 0.0
        alg = nbytes / seconds / 1e9
        return alg, alg * self.busbw(world_size)

    def sends(self, rank: int, root: int) -> bool:
        """Does ``rank`` pass data?"""
        return self.has_data and (not self.root_sends or rank == root)

    def receives(self, rank: int, root: int) -> bool:
        """Does ``rank`` get a result?"""
        return self.has_data and (not self.root_receives or rank == root)

    # -- buffers ----------------------------------------------------------------------------
    def block_of(self, count: int, world_size: int) -> int:
        """Elements per block for ``count`` input elements per rank."""
        return count // world_size if self.input_blocks else count

    def input_shape(self, world_size: int, block: int) -> tuple[int, ...]:
        return (world_size, block) if self.input_blocks else (block,)

    def output_shape(self, world_size: int, block: int) -> tuple[int, ...]:
        return (world_size, block) if self.output_blocks else (block,)

    def nbytes(self, world_size: int, block: int, itemsize: int) -> int:
        """nccl-tests' ``size``: the larger of the send and the receive buffer, in bytes."""
        return (world_size if self.blocked else 1) * block * itemsize

    # -- dispatch ---------------------------------------------------------------------------
    def call(
        self,
        comm: Communicator,
        x: Any,
        *,
        op: str = "sum",
        root: int = 0,
        out: Any = None,
        algorithm: str = "auto",
        timeout: float | None = None,
        compression: str | None = None,
    ) -> Awaitable[Any]:
        """``comm.<name>(...)`` with the arguments this collective takes; await the result.

        ``x``: this rank's input (ignored where :meth:`sends` is False). ``out``:
        a result buffer (a broadcast non-root receives into it). ``compression``: passed
        to the collectives that take it (:attr:`takes_compression`), else ignored.
        """
        return self.invoke(comm, x, CallArgs(op, root, out, algorithm, timeout, compression))

    # -- generated data ---------------------------------------------------------------------
    def make_input(self, data: TestData, block: int, rank: int, root: int) -> np.ndarray | None:
        """``rank``'s input: its pattern over the input shape (None where it sends nothing)."""
        if not self.sends(rank, root):
            return None
        return data.array(self.input_shape(data.world_size, block), rank)

    def count_wrong(
        self, data: TestData, block: int, rank: int, root: int, y: Any, compression: str | None = None
    ) -> int:
        """Wrong elements in ``rank``'s result ``y`` for inputs from :meth:`make_input`
        (a missing or misshapen result counts as wholly wrong; 0 means correct). With a
        lossy ``compression`` (which ran: float data, a collective that takes it) an element
        is right within the codec's bound (:func:`netcoll.compression.error_bound`)."""
        atol = self.tolerance(data, compression)
        if self.expected is None:
            return 0
        if not self.receives(rank, root):
            return 0 if y is None else max(1, int(getattr(y, "size", 1)))
        shape = self.output_shape(data.world_size, block)
        whole = max(1, math.prod(shape))
        if y is None or getattr(y, "shape", None) != shape or getattr(y, "dtype", None) != data.dtype:
            return whole
        segments = self.expected(rank, root, data.world_size)
        flat, size = y.reshape(-1), math.prod(shape) // len(segments)
        wrong = 0
        for i, (source, offset) in enumerate(segments):
            pattern = data.reduced() if source == REDUCED else data.pattern(source)
            wrong += pattern.count_wrong(flat[i * size : (i + 1) * size], offset * block, atol)
        return wrong

    def tolerance(self, data: TestData, compression: str | None) -> float:
        """The error allowed in a result of generated ``data`` under ``compression``
        (None: ``NETCOLL_COMPRESSION``'s default): 0 where it does not run."""
        from .compression import compressible, error_bound, resolve
        from .testdata import MAX_ABS

        codec = resolve(compression).codec
        if codec == "none" or not self.takes_compression or not compressible(data.dtype):
            return 0.0
        n = data.world_size if self.takes_op else 1
        return error_bound(codec, MAX_ABS, n) * (1 + 1e-6)


# -- dispatch, one function per Communicator method ------------------------------------------------
def _all_reduce(comm: Communicator, x: np.ndarray, a: CallArgs) -> Awaitable[Any]:
    return comm.all_reduce(x, op=a.op, out=a.out, timeout=a.timeout, algorithm=a.algorithm, compression=a.compression)


def _all_gather(comm: Communicator, x: np.ndarray, a: CallArgs) -> Awaitable[Any]:
    return comm.all_gather(x, out=a.out, timeout=a.timeout, algorithm=a.algorithm, compression=a.compression)


def _reduce_scatter(comm: Communicator, x: np.ndarray, a: CallArgs) -> Awaitable[Any]:
    return comm.reduce_scatter(
        x, op=a.op, out=a.out, timeout=a.timeout, algorithm=a.algorithm, compression=a.compression
    )


def _all_to_all(comm: Communicator, x: np.ndarray, a: CallArgs) -> Awaitable[Any]:
    return comm.all_to_all(x, out=a.out, timeout=a.timeout, algorithm=a.algorithm)


def _broadcast(comm: Communicator, x: Any, a: CallArgs) -> Awaitable[Any]:
    """Non-roots receive into ``out`` (None: a new array)."""
    buf: np.ndarray | None = x if comm.rank == a.root else a.out
    return comm.broadcast(buf, root=a.root, timeout=a.timeout, algorithm=a.algorithm, compression=a.compression)


def _reduce(comm: Communicator, x: np.ndarray, a: CallArgs) -> Awaitable[Any]:
    return comm.reduce(
        x, op=a.op, root=a.root, out=a.out, timeout=a.timeout, algorithm=a.algorithm, compression=a.compression
    )


def _gather(comm: Communicator, x: np.ndarray, a: CallArgs) -> Awaitable[Any]:
    return comm.gather(x, root=a.root, out=a.out, timeout=a.timeout, algorithm=a.algorithm)


def _scatter(comm: Communicator, x: Any, a: CallArgs) -> Awaitable[Any]:
    """Only the root's ``x`` is sent; every rank receives into ``out`` (None: a new array)."""
    buf: np.ndarray | None = x if comm.rank == a.root else None
    return comm.scatter(buf, root=a.root, out=a.out, timeout=a.timeout, algorithm=a.algorithm)


def _barrier(comm: Communicator, x: Any, a: CallArgs) -> Awaitable[Any]:
    return comm.barrier(timeout=a.timeout, algorithm=a.algorithm)


# -- busbw factors (nccl-tests doc/PERFORMANCE.md; gather/scatter as its gather/scatter tests) ------
def _all_reduce_bus(n: int) -> float:
    return 2 * (n - 1) / n


def _ring_bus(n: int) -> float:
    return (n - 1) / n


def _one_bus(n: int) -> float:
    return 1.0


def _no_bus(n: int) -> float:
    return 0.0


# -- expected results: which data ends up where ------------------------------------------------------
def _reduced(rank: int, root: int, n: int) -> list[Segment]:
    return [(REDUCED, 0)]


def _roots(rank: int, root: int, n: int) -> list[Segment]:
    return [(root, 0)]


def _every_rank(rank: int, root: int, n: int) -> list[Segment]:
    return [(k, 0) for k in range(n)]


def _roots_block(rank: int, root: int, n: int) -> list[Segment]:
    return [(root, rank)]


def _reduced_block(rank: int, root: int, n: int) -> list[Segment]:
    return [(REDUCED, rank)]


def _transposed(rank: int, root: int, n: int) -> list[Segment]:
    return [(j, rank) for j in range(n)]  # y[j] = rank j's x[rank]


def _registry(*collectives: Collective) -> dict[str, Collective]:
    return {c.name: c for c in collectives}


#: Every collective, in nccl-tests' usual order (``netcoll bench --op all`` runs them so).
REGISTRY: Final[dict[str, Collective]] = _registry(
    Collective(
        "all_reduce",
        "reduce over all ranks; every rank gets the bit-identical result",
        invoke=_all_reduce,
        busbw=_all_reduce_bus,
        expected=_reduced,
        takes_op=True,
        takes_compression=True,
    ),
    Collective(
        "all_gather",
        "every rank's block, stacked, on every rank",
        invoke=_all_gather,
        busbw=_ring_bus,
        expected=_every_rank,
        uneven="flag",
        output_blocks=True,
        takes_compression=True,
    ),
    Collective(
        "reduce_scatter",
        "reduce (P, ...) over ranks; rank r gets reduced row r",
        invoke=_reduce_scatter,
        busbw=_ring_bus,
        expected=_reduced_block,
        takes_op=True,
        uneven="lists",
        input_blocks=True,
        takes_compression=True,
    ),
    Collective(
        "all_to_all",
        "y[j] = rank j's x[rank]",
        invoke=_all_to_all,
        busbw=_ring_bus,
        expected=_transposed,
        uneven="lists",
        input_blocks=True,
        output_blocks=True,
    ),
    Collective(
        "broadcast",
        "the root's array to every rank",
        invoke=_broadcast,
        busbw=_one_bus,
        expected=_roots,
        takes_root=True,
        root_sends=True,
        root_result_is_input=True,
        takes_compression=True,
    ),
    Collective(
        "reduce",
        "reduce over all ranks into the root",
        invoke=_reduce,
        busbw=_one_bus,
        expected=_reduced,
        takes_op=True,
        takes_root=True,
        root_receives=True,
        takes_compression=True,
    ),
    Collective(
        "gather",
        "every rank's block, stacked, at the root",
        invoke=_gather,
        busbw=_ring_bus,
        expected=_every_rank,
        takes_root=True,
        uneven="flag",
        output_blocks=True,
        root_receives=True,
    ),
    Collective(
        "scatter",
        "row r of the root's (P, ...) array to rank r",
        invoke=_scatter,
        busbw=_ring_bus,
        expected=_roots_block,
        takes_root=True,
        uneven="lists",
        input_blocks=True,
        root_sends=True,
    ),
    Collective("barrier", "wait until every rank arrives", invoke=_barrier, busbw=_no_bus, expected=None),
)

#: Every collective's name, in registry order.
NAMES: Final[tuple[str, ...]] = tuple(REGISTRY)
#: The collectives that move data (all but barrier): what ``netcoll bench`` measures.
WITH_DATA: Final[tuple[str, ...]] = tuple(c.name for c in REGISTRY.values() if c.has_data)


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the closest of ``choices`` to ``word`` (or "")."""
    close = difflib.get_close_matches(str(word).strip().lower(), list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def get(name: str) -> Collective:
    """The collective called ``name``. Raises ValueError naming the known ones
    (and, for a near miss, "did you mean ...?")."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown collective {name!r}; {did_you_mean(name, NAMES)}choose from {', '.join(NAMES)}"
        ) from None


def algorithms_help(names: Iterable[str] = NAMES, indent: str = "  ") -> str:
    """A ``--help`` block: each collective and its algorithm names (``auto`` first)."""
    width = max(len(n) for n in NAMES) + 2
    return "\n".join(f"{indent}{name:<{width}}{' '.join(get(name).algorithms)}" for name in names)
