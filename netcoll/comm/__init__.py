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

The collectives are written, with their typed overloads and reference
docstrings, as functions of ``self: Communicator`` in :mod:`.reducing`,
:mod:`.gathering`, :mod:`.moving` and :mod:`.p2p`, and made methods by name in
:class:`Communicator`'s body (it has no base class: it holds an engine);
:mod:`.types` has the types of their arguments and results (``Op``,
``ArrayIn``, ``TensorLike``, the ``*Algorithm`` literals) for annotating code
that calls them.
"""

from __future__ import annotations

from ..engine import DEFAULT_TIMEOUT
from ..mesh.channel import as_bytes
from .communicator import (
    COST_MODEL_ENV,
    Communicator,
    calibrate_if_enabled,
    cost_model_enabled,
    form_group,
    model_by_default,
)
from .types import Array, ArrayIn, Op, OpName, TensorLike, TorchReduceOp

__all__ = [
    "COST_MODEL_ENV",
    "DEFAULT_TIMEOUT",
    "Communicator",
    "as_bytes",
    "calibrate_if_enabled",
    "cost_model_enabled",
    "form_group",
    "model_by_default",
    "Array",
    "ArrayIn",
    "Op",
    "OpName",
    "TensorLike",
    "TorchReduceOp",
]
