"""torch tensors in, torch tensors out (no networking; torch stays optional).

:func:`inputs` is called by every :class:`~netcoll.comm.Communicator` method
on its array arguments. When torch is not imported (``"torch" not in
sys.modules``) it returns at once: this module never imports torch itself, so
``import netcoll`` does not load it. When a CPU tensor (or a list of them) is
among the arguments, they are replaced by numpy arrays over the *same memory*
and a :class:`TorchIO` is returned whose :meth:`~TorchIO.result` turns the
call's result back into tensors:

* a result that *is* one of the arrays made from an argument (``out=``, a
  broadcast buffer, the root's own broadcast input) is returned as the caller's
  tensor itself;
* any other array becomes a tensor over the array's memory (``torch.from_numpy``,
  no copy), of the same dtype and shape; lists are converted element by element.

Arrays a rank receives without passing a buffer (``recv``, a non-root's
``broadcast(None)``, blocks of uneven lists) come out as they were sent: the
sender marks a tensor's metadata (``meta_of(x, torch=True)``) and
:func:`from_peer` makes a tensor of it where torch is loaded.

Dtypes: every CPU dtype numpy has a twin for (bool, int8..int64, uint8..uint64,
float16/32/64, complex64/128) goes through ``Tensor.numpy()``; bfloat16 goes
through a 16-bit integer view (numpy has no bfloat16; ``ml_dtypes`` does). The
others (float8 variants, complex32, the sub-byte and quantized dtypes) are a
``TypeError`` naming the dtype. Tensors that require grad are read through
``.detach()`` (collectives are not differentiable: no autograd graph is made);
non-contiguous tensors are read through their strides (copied once where a
collective needs contiguous input); a tensor with a lazy conjugate/negation bit
is resolved first. A tensor that is not on the CPU (CUDA, meta, ...) or not
strided (sparse) is a ``TypeError``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .ops import BFLOAT16

__all__ = ["TorchIO", "from_peer", "inputs", "is_tensor", "to_numpy", "to_tensor"]

#: torch dtypes numpy has no twin for, and what to do instead
_ADVICE = {
    "float8": "8-bit floats are not reduced by netcoll; cast (x.to(torch.bfloat16)) or move the bytes "
    "as x.view(torch.uint8)",
    "complex32": "cast to torch.complex64",
}


def _torch() -> Any:
    """The torch module if the program has imported it, else None (never imports it)."""
    return sys.modules.get("torch")


def is_tensor(x: Any) -> bool:
    """True when ``x`` is a torch tensor (False, without importing torch, when torch is not loaded)."""
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _unsupported(t: Any, what: str) -> TypeError:
    name = str(t.dtype).removeprefix("torch.")
    advice = next((a for k, a in _ADVICE.items() if name.startswith(k)), "cast it to a supported dtype")
    return TypeError(
        f"{what}: torch dtype {name} is not supported ({advice}); supported: bool, int8..int64, "
        f"uint8..uint64, float16, bfloat16, float32, float64, complex64, complex128"
    )


def to_numpy(t: Any, what: str = "x") -> np.ndarray:
    """A numpy array over the memory of CPU tensor ``t`` (same dtype, shape and strides)."""
    torch = _torch()
    device = t.device.type
    if device != "cpu":
        raise TypeError(
            f"{what}: a {device} tensor; netcoll moves CPU memory only (pass x.cpu() and copy the result back)"
        )
    if t.layout is not torch.strided:
        raise TypeError(f"{what}: a {t.layout} tensor; netcoll needs a dense (strided) tensor (x.to_dense())")
    t = t.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()  # a copy: .numpy() cannot read lazy bits
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(BFLOAT16)  # type: ignore[no-any-return]
    try:
        return t.numpy()  # type: ignore[no-any-return]
    except TypeError:
        raise _unsupported(t, what) from None


def to_tensor(a: np.ndarray) -> Any:
    """A tensor over ``a``'s memory (copied first only if torch could not share
    it: read-only or misaligned memory)."""
    torch = _torch()
    if not (a.flags.writeable and a.flags.aligned):
        a = np.array(a, order="C", copy=True)
    if a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def from_peer(arr: np.ndarray, meta: Any) -> Any:
    """An array a peer sent: a tensor when the peer sent a tensor (``"torch"``
    in its meta) and this process has torch loaded, else the array itself."""
    if isinstance(meta, dict) and meta.get("torch") is True and _torch() is not None:
        return to_tensor(arr)
    return arr


class TorchIO:
    """The torch side of one call: the arrays made from its tensors, to give
    the caller's own tensor back where the result is one of them."""

    __slots__ = ("_mine",)

    def __init__(self) -> None:
        self._mine: dict[int, tuple[np.ndarray, Any]] = {}  # id(array) -> (array, tensor)

    def array(self, x: Any, what: str) -> Any:
        """``x`` as numpy when it is a tensor (remembered), else ``x`` unchanged."""
        if not is_tensor(x):
            return x
        arr = to_numpy(x, what)
        self._mine[id(arr)] = (arr, x)
        return arr

    def arrays(self, x: Any, what: str) -> Any:
        """:meth:`array` of ``x``, or of each element of a list/tuple ``x``."""
        if isinstance(x, (list, tuple)):
            return [self.array(a, f"{what}[{k}]") for k, a in enumerate(x)]
        return self.array(x, what)

    def result(self, value: Any) -> Any:
        """The call's result with its arrays as tensors (the caller's own where it is one)."""
        if isinstance(value, np.ndarray):
            hit = self._mine.get(id(value))
            if hit is not None and hit[0] is value:
                return hit[1]
            return to_tensor(value)
        if isinstance(value, list):
            return [self.result(v) for v in value]
        return value


def inputs(x: Any, out: Any = None) -> tuple[Any, Any, TorchIO | None]:
    """``(x, out, io)``: ``x`` (an array or a list of arrays) and ``out`` as
    numpy when any of them is a torch tensor, with ``io`` to convert the result
    back; unchanged with ``io=None`` otherwise."""
    torch = _torch()
    if torch is None:
        return x, out, None
    tensor = torch.Tensor
    if not (
        isinstance(x, tensor)
        or isinstance(out, tensor)
        or (isinstance(x, (list, tuple)) and any(isinstance(a, tensor) for a in x))
    ):
        return x, out, None
    io = TorchIO()
    return io.arrays(x, "x"), io.array(out, "out"), io
