"""Plans of the collectives that move data without reducing it: broadcast,
all_gather, gather, scatter, all_to_all, and barrier.

Block buffers travel as raw bytes; where a receiver cannot know a shape or
dtype (broadcast into ``None``, uneven lists) it travels with the data.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import algorithms
from ..arrays import array_from_meta, as_array, check_out, contiguous_copy, describe, leading_ranks, meta_of
from ..compression import NONE, Requested
from ..engine import Call, Engine
from ..errors import MismatchError
from ..selection import root_shape, select
from ..tensors import from_peer
from . import compressed
from ._common import (
    Done,
    Plan,
    Ran,
    array_list,
    check_root,
    check_uneven,
    contiguous,
    dtype_name,
    flat_bytes,
    fp,
    is_list,
    pick_v,
    result,
    unaliased,
)


def broadcast(e: Engine, x: Any, root: Any, algorithm: str, torch: bool = False, compression: Requested = NONE) -> Plan:
    if compression.codec != "none":
        return compressed.broadcast(e, x, root, algorithm, compression, torch)
    root = check_root(e, root)
    algo, _ = select(e, "broadcast", algorithm, 0)
    meta: dict[str, Any] | None = None
    arr: np.ndarray | None = None
    if e.rank == root:
        arr = contiguous(as_array(x))
        meta = meta_of(arr, torch)
    elif x is not None:
        arr = check_out(x, x.shape, as_array(x).dtype, "broadcast buffer")
    if e.world_size == 1:
        return Done(arr)
    fn = algorithms.ALGORITHMS["broadcast"][algo]
    # what ran, for the model (only it needs the size: the root's now, the others' from the
    # data in post) and for a sized broadcast's stats; without either, nothing to keep
    ran = Ran(e.choice) if algo == "sized" or e.tuner.active else None
    if ran is not None and e.rank == root and arr is not None:
        ran.nbytes = arr.nbytes
        if algo == "sized":  # the root chooses the tree or the chain by the size, the others follow
            ran.shape, ran.predicted = root_shape(e, arr.nbytes)
    if ran is not None and algo == "sized":
        fn = functools.partial(fn, chain=ran.shape == "ring", ran=ran.tell)

    def post(got_: tuple[Any, dict[str, Any]]) -> Any:  # an array, or a tensor when a tensor was sent
        if e.rank == root:
            return arr
        data, got_meta = got_
        if ran is not None:
            ran.nbytes = data.nbytes
        got = array_from_meta(got_meta)
        if arr is None:
            return from_peer(np.frombuffer(data, dtype=got.dtype).reshape(got.shape) if got.size else got, got_meta)
        if arr.shape != got.shape or arr.dtype != got.dtype:
            raise MismatchError(
                f"broadcast from rank {root} sent {describe(got.dtype, got.shape)} but "
                f"rank {e.rank} passed a {describe(arr.dtype, arr.shape)} buffer",
                op="broadcast",
                ranks=(e.rank, root),
            )
        return arr

    send = None if arr is None else flat_bytes(arr)
    return Call(
        "broadcast",
        fp(e, "broadcast", root=root, algorithm=algo),
        lambda ch: fn(ch, send, root, meta=meta, segment_bytes=e.segment_bytes),
        post,
        ran=ran,
    )


def all_gather(
    e: Engine, x: Any, uneven: Any, out: Any, algorithm: str, torch: bool = False, compression: Requested = NONE
) -> Plan:
    x = as_array(x)
    if check_uneven(uneven):
        if compression.codec != "none" and compression.explicit:
            raise ValueError(f"all_gather: compression={compression.codec!r} takes equal arrays, not uneven=True")
        if out is not None:
            raise ValueError("all_gather: out= is not supported with uneven=True (the result is a list)")
        algo = pick_v("all_gather", algorithm, "pairwise")
        if e.world_size == 1:
            return Done([contiguous_copy(x)])
        send = contiguous(x)
        name = fp(e, "all_gather", x=f"{dtype_name(x.dtype)}[uneven]", uneven=True, algorithm=algo)
        return Call(
            "all_gather",
            name,
            lambda ch: algorithms.pairwise.all_gather_list(
                ch, send, meta=meta_of(send, torch), segment_bytes=e.segment_bytes
            ),
            _arrays,
        )
    codec = compressed.applies(compression, x.dtype)
    if codec != "none":
        return compressed.all_gather(e, x, out, algorithm, codec)
    res = result(out, (e.world_size, *x.shape), x.dtype)
    res[e.rank] = unaliased(x, res, res[e.rank])
    algo, seg = select(e, "all_gather", algorithm, res.nbytes)
    if e.world_size == 1:
        return Done(res)
    fn = algorithms.ALGORITHMS["all_gather"][algo]
    return Call(
        "all_gather",
        fp(e, "all_gather", segment=seg, x=describe(x.dtype, x.shape), algorithm=algo),
        lambda ch: fn(ch, flat_bytes(res), segment_bytes=seg),
        lambda _: res,
    )


def gather(e: Engine, x: Any, root: Any, uneven: Any, out: Any, algorithm: str, torch: bool = False) -> Plan:
    x = as_array(x)
    root = check_root(e, root)
    if check_uneven(uneven):
        if out is not None:
            raise ValueError("gather: out= is not supported with uneven=True (the result is a list)")
        algo = pick_v("gather", algorithm, "direct")
        if e.world_size == 1:
            return Done([contiguous_copy(x)])
        send = contiguous(x)
        name = fp(e, "gather", x=f"{dtype_name(x.dtype)}[uneven]", root=root, uneven=True, algorithm=algo)
        return Call(
            "gather",
            name,
            lambda ch: algorithms.direct.gather_list(
                ch, send, root, meta=meta_of(send, torch), segment_bytes=e.segment_bytes
            ),
            lambda got: None if got is None else _arrays(got),
        )
    algo, seg = select(e, "gather", algorithm, x.nbytes * e.world_size)
    send = contiguous(x)
    res: np.ndarray | None = None
    if e.rank == root:
        res = result(out, (e.world_size, *x.shape), x.dtype)
        send = unaliased(send, res, res[e.rank])
        res[e.rank] = send
    if e.world_size == 1:
        return Done(res)
    fn = algorithms.ALGORITHMS["gather"][algo]
    recv = None if res is None else flat_bytes(res)
    return Call(
        "gather",
        fp(e, "gather", segment=seg, x=describe(x.dtype, x.shape), root=root, algorithm=algo),
        lambda ch: fn(ch, flat_bytes(send), recv, root, segment_bytes=seg),
        lambda _: res,
    )


def scatter(e: Engine, x: Any, root: Any, out: Any, algorithm: str, torch: bool = False) -> Plan:
    root = check_root(e, root)
    algo, _ = select(e, "scatter", algorithm, 0)
    if out is not None:
        return _scatter_into(e, x, root, out, algo)
    blocks: list[np.ndarray] | None = None
    if e.rank == root:
        if is_list(x):
            blocks = array_list(x, e.world_size, "scatter")
        else:
            whole = contiguous(as_array(x))
            leading_ranks(whole, e.world_size, "scatter")
            blocks = [whole[k, ...] for k in range(e.world_size)]  # 0-d rows stay arrays
    if e.world_size == 1:
        return Done(contiguous_copy(blocks[0]))  # type: ignore[index]
    metas = None if blocks is None else [meta_of(b, torch) for b in blocks]
    # direct scatter; each block carries its dtype/shape so non-roots need no buffer
    return Call(
        "scatter",
        fp(e, "scatter", root=root, algorithm=algo),
        lambda ch: algorithms.direct.scatter_list(ch, blocks, root, metas=metas, segment_bytes=e.segment_bytes),
        lambda got: _array(*got),
    )


def _scatter_into(e: Engine, x: Any, root: int, out: Any, algo: str) -> Plan:
    """scatter with ``out=``: every rank knows the row's shape, so the blocks
    go straight into ``out`` (no metadata, no allocation)."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
    out = check_out(as_array(out, "out"), out.shape, out.dtype)
    whole: np.ndarray | None = None
    if e.rank == root:
        if is_list(x):
            raise ValueError("scatter: out= needs the root's x as one array of rows, not a list")
        whole = contiguous(as_array(x))
        leading_ranks(whole, e.world_size, "scatter")
        if whole.shape[1:] != out.shape or whole.dtype != out.dtype:
            raise ValueError(
                f"scatter: out is {describe(out.dtype, out.shape)} but the rows of x are "
                f"{describe(whole.dtype, whole.shape[1:])}"
            )
        whole = unaliased(whole, out, whole[root])
    if e.world_size == 1:
        out[...] = whole[0]  # type: ignore[index]
        return Done(out)
    name = fp(e, "scatter", x=describe(out.dtype, out.shape), root=root, algorithm=algo, out=True)
    send = None if whole is None else flat_bytes(whole)
    return Call(
        "scatter",
        name,
        lambda ch: algorithms.direct.scatter(ch, send, flat_bytes(out), root, segment_bytes=e.segment_bytes),
        lambda _: out,
    )


def all_to_all(e: Engine, x: Any, out: Any, algorithm: str, torch: bool = False) -> Plan:
    if is_list(x):
        if out is not None:
            raise ValueError("all_to_all: out= is not supported for a list input")
        blocks = array_list(x, e.world_size, "all_to_all")
        algo = pick_v("all_to_all", algorithm, "pairwise")
        if e.world_size == 1:
            return Done([contiguous_copy(blocks[0])])
        name = fp(e, "all_to_all", x=f"list of {dtype_name(blocks[0].dtype)}", algorithm=algo)
        return Call(
            "all_to_all",
            name,
            lambda ch: algorithms.pairwise.all_to_all_list(
                ch, blocks, metas=[meta_of(b, torch) for b in blocks], segment_bytes=e.segment_bytes
            ),
            _arrays,
        )
    x = as_array(x)
    leading_ranks(x, e.world_size, "all_to_all")
    algo, seg = select(e, "all_to_all", algorithm, x.nbytes)
    res = result(out, x.shape, x.dtype)
    send = unaliased(contiguous(x), res)
    if e.world_size == 1:
        res[...] = send
        return Done(res)
    fn = algorithms.ALGORITHMS["all_to_all"][algo]
    return Call(
        "all_to_all",
        fp(e, "all_to_all", segment=seg, x=describe(x.dtype, x.shape), algorithm=algo),
        lambda ch: fn(ch, flat_bytes(send), flat_bytes(res), segment_bytes=seg),
        lambda _: res,
    )


def barrier(e: Engine, algorithm: str) -> Plan:
    algo, _ = select(e, "barrier", algorithm, 0)
    if e.world_size == 1:
        return Done(None)
    return Call(
        "barrier",
        fp(e, "barrier", segmented=False, algorithm=algo),
        algorithms.ALGORITHMS["barrier"][algo],
        lambda _: None,
    )


def _array(buf: Any, meta: Any) -> Any:
    """A block a peer sent, as it sent it (a tensor if it was one: :func:`from_peer`)."""
    return from_peer(array_from_meta(meta, memoryview(buf)), meta)


def _arrays(got: Any) -> list[Any]:
    return [_array(buf, meta) for buf, meta in got]
