"""Plans of the reducing collectives: all_reduce, reduce, reduce_scatter.

Algorithms never divide for ``avg``; the plan's ``post`` step does, once,
after the operation (:func:`netcoll.ops.finalize`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import algorithms
from ..arrays import as_array, contiguous_copy, describe, leading_ranks
from ..compression import NONE, Requested
from ..engine import Call, Engine
from ..ops import ReduceOp, check_op_dtype, finalize, parse_op
from ..selection import select, weights
from . import compressed
from ._common import (
    Done,
    Plan,
    array_list,
    check_root,
    contiguous,
    dtype_name,
    fp,
    is_list,
    pick_v,
    result,
    shapes,
    unaliased,
)


def _finalized(rop: ReduceOp, buf: np.ndarray, world_size: int) -> np.ndarray:
    finalize(rop, buf, world_size)
    return buf


def all_reduce(e: Engine, x: Any, op: Any, out: Any, algorithm: str, compression: Requested = NONE) -> Plan:
    x = as_array(x)
    rop = parse_op(op)
    codec = compressed.applies(compression, x.dtype, rop, algorithm)
    if codec != "none":
        return compressed.all_reduce(e, x, rop, out, algorithm, codec)
    check_op_dtype(rop, x.dtype)
    algo, seg = select(e, "all_reduce", algorithm, x.nbytes)
    kw: dict[str, Any] = {"segment_bytes": seg}
    if algo == "weighted":
        kw["rates"] = weights(e, "all_reduce")
    if (
        algo in ("ring", "tree", "weighted")
        and e.world_size > 1
        and out is not x
        and x.flags.c_contiguous
        and (out is None or not np.may_share_memory(out, x))
    ):
        # the ring, the tree and the weighted read our input where they need it: no up-front copy
        buf = result(out, x.shape, x.dtype)
        kw["src"] = x.reshape(-1)
    else:
        buf = contiguous_copy(x, out)

    def post(_: Any) -> np.ndarray:
        return _finalized(rop, buf, e.world_size) if rop is ReduceOp.AVG else buf

    if e.world_size == 1:
        return Done(post(None))
    fn = algorithms.ALGORITHMS["all_reduce"][algo]
    key = (x.dtype, x.shape, rop, algo, seg)
    name = e.fps.get(key)
    if name is None:
        name = e.remember_fp(
            key, fp(e, "all_reduce", segment=seg, x=describe(x.dtype, x.shape), op=rop.value, algorithm=algo)
        )
    flat = buf.reshape(-1)
    return Call("all_reduce", name, lambda ch: fn(ch, flat, rop, **kw), post)


def reduce(e: Engine, x: Any, op: Any, root: Any, out: Any, algorithm: str, compression: Requested = NONE) -> Plan:
    x = as_array(x)
    rop = parse_op(op)
    codec = compressed.applies(compression, x.dtype, rop, algorithm)
    if codec != "none":
        return compressed.reduce(e, x, rop, root, out, algorithm, codec)
    check_op_dtype(rop, x.dtype)
    root = check_root(e, root)
    algo, seg = select(e, "reduce", algorithm, x.nbytes)
    kw: dict[str, Any] = {"segment_bytes": seg}
    mine = out if e.rank == root else None
    buf: np.ndarray | None
    if e.world_size > 1:
        # both algorithms read our input where they need it; non-roots need no buffer
        src = contiguous(x)
        buf = result(mine, x.shape, x.dtype) if e.rank == root else None
        kw["src"] = (src if buf is None else unaliased(src, buf)).reshape(-1)
    else:
        buf = contiguous_copy(x, mine)

    def post(_: Any) -> np.ndarray | None:
        return None if e.rank != root else _finalized(rop, buf, e.world_size)  # type: ignore[arg-type]

    if e.world_size == 1:
        return Done(post(None))
    fn = algorithms.ALGORITHMS["reduce"][algo]
    name = fp(e, "reduce", segment=seg, x=describe(x.dtype, x.shape), op=rop.value, root=root, algorithm=algo)
    flat = None if buf is None else buf.reshape(-1)
    return Call("reduce", name, lambda ch: fn(ch, flat, rop, root, **kw), post)


def reduce_scatter(e: Engine, x: Any, op: Any, out: Any, algorithm: str, compression: Requested = NONE) -> Plan:
    rop = parse_op(op)
    codec = compressed.applies(compression, None if is_list(x) else as_array(x).dtype, rop, algorithm)
    if codec != "none":
        return compressed.reduce_scatter(e, x, rop, out, algorithm, codec)
    if is_list(x):
        if out is not None:
            raise ValueError("reduce_scatter: out= is not supported for a list input")
        return _reduce_scatter_list(e, array_list(x, e.world_size, "reduce_scatter"), rop, algorithm)
    x = as_array(x)
    leading_ranks(x, e.world_size, "reduce_scatter")
    check_op_dtype(rop, x.dtype)
    algo, seg = select(e, "reduce_scatter", algorithm, x.nbytes)
    res = result(out, x.shape[1:], x.dtype)
    buf = unaliased(contiguous(x), res)  # read only: no copy unless out overlaps it
    if e.world_size == 1:
        res[...] = buf[0]
        return Done(_finalized(rop, res, 1))
    fn = algorithms.ALGORITHMS["reduce_scatter"][algo]
    name = fp(e, "reduce_scatter", segment=seg, x=describe(x.dtype, x.shape), op=rop.value, algorithm=algo)
    return Call(
        "reduce_scatter",
        name,
        lambda ch: fn(ch, buf.reshape(-1), rop, res.reshape(-1), segment_bytes=seg),
        lambda _: _finalized(rop, res, e.world_size),
    )


def _reduce_scatter_list(e: Engine, blocks: list[np.ndarray], rop: ReduceOp, algorithm: str) -> Plan:
    check_op_dtype(rop, blocks[0].dtype)
    algo = pick_v("reduce_scatter", algorithm, "pairwise")
    res = contiguous_copy(blocks[e.rank])
    if e.world_size == 1:
        return Done(_finalized(rop, res, 1))
    name = fp(
        e, "reduce_scatter", x=f"list of {dtype_name(res.dtype)}", shapes=shapes(blocks), op=rop.value, algorithm=algo
    )
    return Call(
        "reduce_scatter",
        name,
        lambda ch: algorithms.pairwise.reduce_scatter_list(ch, blocks, rop, res, segment_bytes=e.segment_bytes),
        lambda _: _finalized(rop, res, e.world_size),
    )
