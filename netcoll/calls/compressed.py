"""Plans of the compressed collectives (``compression=`` other than ``"none"``):
all_reduce, reduce, reduce_scatter, all_gather and broadcast.

What refuses what, at the call (before anything is sent):

* an unknown codec name: ``ValueError`` (:func:`netcoll.compression.parse_compression`);
* an input that is not float16, bfloat16, float32 or float64 (integer, bool, complex):
  ``ValueError``;
* the reductions take ``sum``, ``avg``, ``min`` and ``max``: ``prod`` is a
  ``ValueError`` (a product compounds each contribution's codec error, and an int8
  code means nothing under it), the bitwise ops a ``TypeError`` as always for floats;
* the reductions run one plan (:mod:`netcoll.algorithms.compressed`), so their
  ``algorithm=`` must be ``"auto"``: anything else is a ``ValueError``;
* uneven (list) inputs: ``ValueError``.

all_gather and broadcast move the encoded bytes with their usual algorithms (chosen
for the encoded size) and every rank decodes them, the sender's own slot too, so
every rank holds the same values: a compressed broadcast returns the root's array
*as decoded* on the root as well (not the array it passed). A group of one sends
nothing, so its results are exact (as uncompressed). The algorithm chosen is
left out of the cost model's learning (its times include encoding).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import algorithms
from ..algorithms import compressed
from ..arrays import array_from_meta, as_array, check_out, describe, leading_ranks, meta_of
from ..compression import CODECS, Requested, check_codec, compressible, decode, encode, encoded_nbytes
from ..engine import Call, Engine
from ..errors import MismatchError
from ..ops import ReduceOp, check_op_dtype, finalize
from ..selection import select
from ..tensors import from_peer
from ._common import Done, Plan, check_root, contiguous, fp, is_list, result

__all__ = ["all_gather", "all_reduce", "applies", "broadcast", "check_reduction", "reduce", "reduce_scatter"]

#: the reductions a compressed call takes
OPS = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX)


def applies(req: Requested, dtype: np.dtype | None, rop: ReduceOp | None = None, algorithm: str = "auto") -> str:
    """The codec a call runs: its own ``compression=`` whatever the input (the plan then
    refuses what it cannot take), or the default where it can apply (a float input, a
    reduction of sum, avg, min or max, ``algorithm="auto"``; ``dtype`` None: a list or
    uneven input), else ``"none"``: ``NETCOLL_COMPRESSION=int8`` compresses a program's
    float gradients and leaves its integer counters as they were."""
    if req.codec == "none" or req.explicit:
        return req.codec
    fits = dtype is not None and compressible(dtype) and (rop is None or rop in OPS) and algorithm == "auto"
    return req.codec if fits else "none"


def check_reduction(codec: str, rop: ReduceOp, dtype: np.dtype, algorithm: str, what: str) -> None:
    """The checks of a compressed reduction (see the module's docstring)."""
    check_codec(codec, dtype, what)
    check_op_dtype(rop, dtype)
    if rop not in OPS:
        raise ValueError(
            f"{what}: op={rop.value!r} cannot be compressed (compression={codec!r} takes sum, avg, min, max)"
        )
    if algorithm != "auto":
        raise ValueError(
            f"{what}: compression={codec!r} runs one plan (netcoll.algorithms.compressed): "
            f"algorithm must be 'auto', not {algorithm!r}"
        )


def _select(e: Engine, name: str, algorithm: str, nbytes: int) -> tuple[str, int]:
    """:func:`select` for the encoded size; the choice is kept out of the model's learning."""
    algo, seg = select(e, name, algorithm, nbytes)
    e.choice, e.tuner.asked = None, None
    return algo, seg


def _exchange(e: Engine, x: np.ndarray, codec: str) -> tuple[Any, str, int]:
    """The all_to_all of a compressed reduction's exchange, the name the call's fingerprint
    (and the metrics' ``algorithm`` label) gives the plan, and its segment size."""
    algo, seg = _select(e, "all_to_all", "auto", encoded_nbytes(codec, x.dtype, x.size))
    return algorithms.ALGORITHMS["all_to_all"][algo], f"compressed:{algo}", seg


def _post(rop: ReduceOp, world_size: int) -> Any:
    def post(buf: np.ndarray) -> np.ndarray:
        finalize(rop, buf, world_size)  # avg divides once (every rank the same values)
        return buf

    return post


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` are the same contiguous memory: a compressed all_reduce reads
    each piece of its input before it writes that piece's result, so it can run in place."""
    both = a.flags.c_contiguous and b.flags.c_contiguous
    return both and a.ctypes.data == b.ctypes.data and a.nbytes == b.nbytes and a.dtype == b.dtype


def all_reduce(e: Engine, x: Any, rop: ReduceOp, out: Any, algorithm: str, codec: str) -> Plan:
    x = as_array(x)
    check_reduction(codec, rop, x.dtype, algorithm, "all_reduce")
    buf = result(out, x.shape, x.dtype)
    src = contiguous(x)
    if out is not None and np.may_share_memory(buf, src) and not _same(buf, src):
        src = src.copy()  # partly overlapping: read a copy (the very same array is read in place)
    if e.world_size == 1:
        buf[...] = src
        return Done(_post(rop, 1)(buf))
    exchange, plan, seg = _exchange(e, x, codec)
    x_ = describe(x.dtype, x.shape)
    name = fp(e, "all_reduce", segment=seg, x=x_, op=rop.value, algorithm=plan, compression=codec)
    flat, mine = buf.reshape(-1), src.reshape(-1)
    return Call(  # avg divides as it decodes each piece's result (average=True): no pass at the end
        "all_reduce",
        name,
        lambda ch: compressed.all_reduce(
            ch, flat, rop, codec=codec, exchange=exchange, src=mine, segment_bytes=seg, average=True
        ),
        lambda _: buf,
    )


def reduce(e: Engine, x: Any, rop: ReduceOp, root: Any, out: Any, algorithm: str, codec: str) -> Plan:
    x = as_array(x)
    check_reduction(codec, rop, x.dtype, algorithm, "reduce")
    root = check_root(e, root)
    src = contiguous(x)
    buf = result(out, x.shape, x.dtype) if e.rank == root else None
    if buf is not None and np.may_share_memory(buf, src):
        src = src.copy()
    if e.world_size == 1:
        buf[...] = src  # type: ignore[index]
        return Done(_post(rop, 1)(buf))
    seg = e.segment_bytes  # (a direct gather of the encoded inputs: nothing to choose)
    x_ = describe(x.dtype, x.shape)
    name = fp(e, "reduce", segment=seg, x=x_, op=rop.value, root=root, algorithm="compressed:direct", compression=codec)
    return Call(
        "reduce",
        name,
        lambda ch: compressed.reduce(
            ch,
            None if buf is None else buf.reshape(-1),
            rop,
            root,
            codec=codec,
            src=src.reshape(-1),
            segment_bytes=seg,
        ),
        lambda _: None if buf is None else _post(rop, e.world_size)(buf),
    )


def reduce_scatter(e: Engine, x: Any, rop: ReduceOp, out: Any, algorithm: str, codec: str) -> Plan:
    if is_list(x):
        raise ValueError(f"reduce_scatter: compression={codec!r} takes one array of rows, not a list")
    x = as_array(x)
    leading_ranks(x, e.world_size, "reduce_scatter")
    check_reduction(codec, rop, x.dtype, algorithm, "reduce_scatter")
    res = result(out, x.shape[1:], x.dtype)
    src = contiguous(x)
    if np.may_share_memory(res, src):
        src = src.copy()
    if e.world_size == 1:
        res[...] = src[0]
        return Done(_post(rop, 1)(res))
    exchange, plan, seg = _exchange(e, x, codec)
    x_ = describe(x.dtype, x.shape)
    name = fp(e, "reduce_scatter", segment=seg, x=x_, op=rop.value, algorithm=plan, compression=codec)
    return Call(
        "reduce_scatter",
        name,
        lambda ch: compressed.reduce_scatter(
            ch, src.reshape(-1), rop, res.reshape(-1), codec=codec, exchange=exchange, segment_bytes=seg
        ),
        lambda _: _post(rop, e.world_size)(res),
    )


def all_gather(e: Engine, x: Any, out: Any, algorithm: str, codec: str) -> Plan:
    x = as_array(x)
    check_codec(codec, x.dtype, "all_gather")
    res = result(out, (e.world_size, *x.shape), x.dtype)
    slot = encoded_nbytes(codec, x.dtype, x.size)
    wire = np.empty(e.world_size * slot, np.uint8)
    encode(codec, x, wire[e.rank * slot : (e.rank + 1) * slot])

    def post(_: Any) -> np.ndarray:
        rows = res.reshape(e.world_size, -1)
        for k in range(e.world_size):
            decode(codec, wire[k * slot : (k + 1) * slot], rows[k])
        return res

    if e.world_size == 1:  # nothing crosses a link: exact
        res[0] = x
        return Done(res)
    algo, seg = _select(e, "all_gather", algorithm, wire.nbytes)
    fn = algorithms.ALGORITHMS["all_gather"][algo]
    name = fp(e, "all_gather", segment=seg, x=describe(x.dtype, x.shape), algorithm=algo, compression=codec)
    return Call("all_gather", name, lambda ch: fn(ch, wire, segment_bytes=seg), post)


def broadcast(e: Engine, x: Any, root: Any, algorithm: str, req: Requested, torch: bool = False) -> Plan:
    """A broadcast whose codec each rank knows from the dtype it holds (the root's ``x``,
    another rank's buffer) and a rank without a buffer learns from the root's meta
    (``"z"``): under the default, a root's integer array crosses as it is."""
    root = check_root(e, root)
    meta: dict[str, Any] | None = None
    arr: np.ndarray | None = None
    wire: np.ndarray | None = None
    used: str | None = None  # the codec, once this rank knows it
    if e.rank == root:
        arr = contiguous(as_array(x))
        used = applies(req, arr.dtype)
        check_codec(used, arr.dtype, "broadcast")
        wire = encode(used, arr)
        meta = dict(meta_of(arr, torch), nbytes=wire.nbytes, z=used)
    elif x is not None:
        arr = check_out(x, x.shape, as_array(x).dtype, "broadcast buffer")
        used = applies(req, arr.dtype)
        check_codec(used, arr.dtype, "broadcast")
        wire = np.empty(encoded_nbytes(used, arr.dtype, arr.size), np.uint8)
    algo, _ = _select(e, "broadcast", algorithm, 0 if wire is None else wire.nbytes)
    if algo == "sized":
        algo = "tree"  # (the root's size-based choice needs the model's bookkeeping)
    if e.world_size == 1:  # nothing crosses a link: the root's own array, as uncompressed
        return Done(arr)
    fn = algorithms.ALGORITHMS["broadcast"][algo]

    def post(got_: tuple[Any, dict[str, Any]]) -> Any:
        data, got_meta = got_
        got = array_from_meta(got_meta)  # (the declared shape is checked before anything is allocated)
        sent = got_meta.get("z")
        if sent not in CODECS or (used is not None and sent != used):
            raise MismatchError(
                f"broadcast from rank {root} sent codec {sent!r} but rank {e.rank} expected {used!r}",
                op="broadcast",
                ranks=(e.rank, root),
            )
        if e.rank == root:
            return _decoded(sent, data, got.shape, got.dtype)
        if arr is None:
            return from_peer(decode(sent, np.asarray(data), got.reshape(-1)).reshape(got.shape), got_meta)
        if arr.shape != got.shape or arr.dtype != got.dtype:
            raise MismatchError(
                f"broadcast from rank {root} sent {describe(got.dtype, got.shape)} but "
                f"rank {e.rank} passed a {describe(arr.dtype, arr.shape)} buffer",
                op="broadcast",
                ranks=(e.rank, root),
            )
        decode(sent, np.asarray(data), arr.reshape(-1))
        return arr

    return Call(
        "broadcast",
        fp(e, "broadcast", root=root, algorithm=algo, compression=req.codec),
        lambda ch: fn(ch, wire, root, meta=meta, segment_bytes=e.segment_bytes),
        post,
    )


def _decoded(codec: str, data: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A new array of ``shape`` and ``dtype`` decoded from ``data``."""
    return decode(codec, np.asarray(data), np.empty(shape, dtype).reshape(-1)).reshape(shape)
