"""The plan of a partial all_reduce (``all_reduce(x, partial=True)``): its argument
checks, its deadlines, and the tolerant operation that runs
:func:`netcoll.algorithms.partial.all_reduce`.

Deadlines: the collection window (contributions not here by then are left out) is
``deadline`` if given, else the call's ``timeout`` (else the communicator's); the
operation as a whole may run :data:`AGREE_GRACE` seconds past the call's timeout for
the agreement (a round trip to the coordinator, and the agreed contributions still on
their way to this rank).
"""

from __future__ import annotations

import numbers
from typing import Any

from ..algorithms.partial import Agreement
from ..algorithms.partial import all_reduce as run_partial
from ..arrays import as_array, contiguous_copy, describe
from ..engine import Call, Engine, check_timeout
from ..ops import ReduceOp, check_op_dtype, finalize, parse_op
from ._common import Done, Plan, fp

__all__ = ["AGREE_GRACE", "Agreement", "all_reduce", "deadlines"]

AGREE_GRACE = 30.0  # seconds a partial all_reduce may run past its timeout, to agree and finish


def deadlines(default: float, timeout: float | None, deadline: float | None) -> tuple[float, float]:
    """``(window, limit)``: seconds to collect contributions, and seconds the whole call
    may run (``default``: the communicator's timeout). ValueError for a ``deadline`` that
    is not a positive number or exceeds the timeout."""
    limit = default if timeout is None else check_timeout(timeout)
    if deadline is None:
        return limit, limit + AGREE_GRACE
    if isinstance(deadline, bool) or not isinstance(deadline, numbers.Real) or not float(deadline) > 0:
        raise ValueError(f"deadline must be a positive number of seconds, got {deadline!r}")
    if float(deadline) > limit:
        raise ValueError(f"deadline ({float(deadline):g}s) must not exceed the call's timeout ({limit:g}s)")
    return float(deadline), limit + AGREE_GRACE


def check_partial(partial: Any, algorithm: Any, compression: Any = None, deadline: Any = None) -> bool:
    """Whether the call is partial (TypeError unless a bool; ValueError with an algorithm
    other than ``"auto"``: a partial all_reduce has one, its own; with a ``compression=``
    other than none: it sends uncompressed; with a ``deadline=`` on a call that is not
    partial)."""
    if not isinstance(partial, bool):
        raise TypeError(f"partial must be True or False, got {partial!r}")
    if not partial and deadline is not None:
        raise ValueError("deadline= is for all_reduce(partial=True) only")
    if partial and algorithm != "auto":
        raise ValueError(
            f"all_reduce(partial=True) runs its own algorithm (every rank to every rank, then an "
            f"agreement); algorithm must be 'auto', got {algorithm!r}"
        )
    if partial and compression not in (None, "none"):
        raise ValueError(f"all_reduce(partial=True) sends uncompressed; compression must be None, got {compression!r}")
    return partial


def all_reduce(e: Engine, x: Any, op: Any, out: Any, agreement: Agreement, window: float, limit: float) -> Plan:
    """The plan: a tolerant ``all_reduce`` whose result is the agreed contributions'
    reduction (``avg`` divided by their number) and whose ``agreement`` names them."""
    x = as_array(x)
    rop = parse_op(op)
    check_op_dtype(rop, x.dtype)
    decide = e.mesh.decider
    if decide is None:
        raise ValueError(
            "all_reduce(partial=True) needs a decider shared by the ranks: a Communicator made by "
            "netcoll.connect (the coordinator decides) or over a MemoryHub; this one has none"
        )
    buf = contiguous_copy(x, out)
    if e.world_size == 1:
        agreement.contributors = (0,)
        return Done(buf)

    def post(agreed: tuple[int, ...]) -> Any:
        if rop is ReduceOp.AVG:
            finalize(rop, buf, len(agreed))
        return buf

    seg = e.segment_bytes
    name = fp(e, "all_reduce", segment=seg, x=describe(x.dtype, x.shape), op=rop.value, algorithm="partial")
    flat = buf.reshape(-1)
    return Call(
        "all_reduce",
        name,
        lambda ch: run_partial(
            ch, flat, rop, agreement=agreement, decide=decide, window=window, limit=limit, segment_bytes=seg
        ),
        post,
        tolerance=agreement,
    )
