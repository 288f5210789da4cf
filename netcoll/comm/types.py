"""The types of the public :class:`~netcoll.comm.Communicator` API, for type
checkers (mypy, pyright) and for annotating code that calls it.

* :data:`Op`: a reduction, as one of the names in :data:`OpName` (``"sum"``
  ... ``"bxor"``), a :class:`~netcoll.ops.ReduceOp`, or a
  ``torch.distributed.ReduceOp`` value (:class:`TorchReduceOp`, structural:
  torch is never imported). At run time :func:`netcoll.ops.parse_op` also
  takes the names in any case (``"SUM"``); a type checker sees the lowercase
  ones, so a typo such as ``op="average"`` is an error before anything runs.
  A name held in a ``str`` variable: ``ReduceOp(name)``.
* :data:`ArrayIn`: what a call takes where it takes an array: anything numpy
  turns into one (``numpy.typing.ArrayLike``: arrays, scalars, nested lists).
  Results are :data:`Array` (``numpy.ndarray``) for array input.
* :class:`TensorLike`: a CPU torch tensor, seen structurally (a ``detach``
  method and a ``requires_grad`` flag), so that the checker knows a call made
  with a tensor returns a tensor without netcoll importing torch
  (``netcoll.tensors`` converts at run time). Its parameter is what
  ``detach()`` returns: ``torch.Tensor`` for a tensor and for its subclasses
  (``nn.Parameter``), which is also what a call returns (a new tensor over the
  result's memory) unless it fills your ``out=``.
* The ``*Algorithm`` literals: the names ``algorithm=`` takes for each
  collective (``"auto"`` and :data:`netcoll.algorithms.ALGORITHMS`' names,
  plus the one algorithm of its uneven form where it has one).

Each collective returns a :class:`~netcoll.operation.Work` of its result:
``Work[Array]`` for ``all_reduce(x)`` with an array, ``Work[torch.Tensor]``
for a tensor, ``Work[Array | None]`` where only the root gets a result,
``Work[None]`` for ``barrier`` and ``send``.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, TypeAlias, TypeVar

import numpy as np
from numpy.typing import ArrayLike

from ..ops import ReduceOp

__all__ = [
    "AllGatherAlgorithm",
    "AllReduceAlgorithm",
    "AllToAllAlgorithm",
    "Array",
    "ArrayIn",
    "BarrierAlgorithm",
    "BroadcastAlgorithm",
    "GatherAlgorithm",
    "Op",
    "OpName",
    "ReduceAlgorithm",
    "ReduceScatterAlgorithm",
    "ScatterAlgorithm",
    "TensorLike",
    "TorchReduceOp",
    "TensorOut",
]

#: a result array (any dtype, any shape)
Array: TypeAlias = np.ndarray[Any, Any]
#: an array argument: an array or anything ``numpy.asarray`` turns into one
ArrayIn: TypeAlias = ArrayLike

#: the reduction names, as :class:`~netcoll.ops.ReduceOp`'s values
OpName: TypeAlias = Literal["sum", "prod", "min", "max", "avg", "band", "bor", "bxor"]


class TorchReduceOp(Protocol):
    """A ``torch.distributed.ReduceOp`` value (``dist.ReduceOp.SUM``, an enum
    member of torch's ``RedOpType``): known by its ``name`` (``"SUM"``,
    ``"PRODUCT"``, ...; ``PREMUL_SUM`` is a ``ValueError`` at the call)."""

    @property
    def name(self) -> str: ...


#: a reduction: a name, a ReduceOp, or a torch.distributed.ReduceOp value
Op: TypeAlias = OpName | ReduceOp | TorchReduceOp


Detached = TypeVar("Detached", covariant=True)


class TensorLike(Protocol[Detached]):
    """A torch tensor, as far as a type checker needs to tell one from an
    array (``torch.Tensor`` matches; a numpy array does not), generic in what
    its ``detach()`` returns (``torch.Tensor``). Collectives take CPU tensors
    of every dtype and return that type."""

    requires_grad: bool

    def detach(self) -> Detached: ...


#: the tensor type a call returns for a tensor argument (``torch.Tensor``)
TensorOut = TypeVar("TensorOut")

AllReduceAlgorithm: TypeAlias = Literal["auto", "ring", "tree", "doubling", "halving", "allpairs", "weighted"]
BroadcastAlgorithm: TypeAlias = Literal["auto", "ring", "tree", "sized"]
ReduceAlgorithm: TypeAlias = Literal["auto", "ring", "tree"]
#: ``pairwise``: the uneven form's (``uneven=True``)
AllGatherAlgorithm: TypeAlias = Literal["auto", "ring", "doubling", "pairwise"]
GatherAlgorithm: TypeAlias = Literal["auto", "direct"]
ScatterAlgorithm: TypeAlias = Literal["auto", "direct"]
#: ``pairwise``: the uneven (list) form's
ReduceScatterAlgorithm: TypeAlias = Literal["auto", "ring", "halving", "pairwise"]
AllToAllAlgorithm: TypeAlias = Literal["auto", "pairwise", "linear"]
BarrierAlgorithm: TypeAlias = Literal["auto", "doubling"]
