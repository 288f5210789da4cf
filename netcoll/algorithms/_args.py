"""The checks every algorithm starts with (no networking): checked flat views of the
caller's buffers (:func:`flat`, :func:`as_u8`), and per kind of collective the arguments
checked and prepared (:func:`reduction_args`, :func:`reduce_scatter_args`,
:func:`all_to_all_args`, :func:`gather_args`), with what an error says of where it was
raised (:func:`where`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import ranks
from ..ops import ReduceOp, check_op_dtype, parse_op
from ._scratch import num_segments, split

if TYPE_CHECKING:
    from ..mesh.channel import Channel


def check_segment_bytes(segment_bytes: int) -> int:
    if isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int) or segment_bytes < 1:
        raise ValueError(f"segment_bytes must be a positive int, got {segment_bytes!r}")
    return segment_bytes


def flat(buf: Any, name: str = "buf", *, writeable: bool = True) -> np.ndarray:
    """A 1-D view (never a copy) of the C-contiguous ndarray ``buf``."""
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, not {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if writeable and not buf.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return buf.reshape(-1)


def as_u8(buf: Any, name: str = "buf", *, writeable: bool = True) -> np.ndarray:
    """A flat ``uint8`` view (never a copy) of the C-contiguous ndarray ``buf``."""
    return flat(buf, name, writeable=writeable).view(np.uint8)


def own_input(src: Any, data: np.ndarray, what: str) -> np.ndarray | None:
    """``src`` as a flat read-only view, checked to be a reduction's own input
    beside its result ``data`` (same dtype and size, not overlapping: the
    algorithm reads this rank's contribution there and writes ``data``); None
    stays None (the contribution is ``data``'s initial contents)."""
    if src is None:
        return None
    mine = flat(src, "src", writeable=False)
    if mine.dtype != data.dtype or mine.size != data.size or np.may_share_memory(mine, data):
        raise ValueError(f"{what}: src must match buf in size and dtype and not overlap it")
    return mine


def reduction_args(buf: Any, op: Any, segment_bytes: int) -> tuple[ReduceOp, np.ndarray]:
    """The checks every reducing algorithm starts with: ``(op, flat view of buf)``."""
    rop = parse_op(op)
    check_segment_bytes(segment_bytes)
    data = flat(buf)
    check_op_dtype(rop, data.dtype)
    return rop, data


def reduce_scatter_args(
    ch: Channel, buf: Any, op: Any, out: Any, segment_bytes: int
) -> tuple[ReduceOp, np.ndarray, np.ndarray]:
    """The checks every reduce_scatter starts with: ``(op, flat read-only view of
    buf, flat view of out)``; buf is ``P`` blocks of out's size, same dtype, apart."""
    rop = parse_op(op)
    check_segment_bytes(segment_bytes)
    data = flat(buf, writeable=False)
    dst = flat(out, "out")
    check_op_dtype(rop, dst.dtype)
    P = ch.size
    if data.size % P or dst.size != data.size // P:
        raise ValueError(f"reduce_scatter: buf has {data.size} elements, not {P} blocks of out's {dst.size}")
    if dst.dtype != data.dtype:
        raise TypeError(f"reduce_scatter: out is {dst.dtype} but buf is {data.dtype}")
    if dst.size and np.may_share_memory(dst, data):
        raise ValueError("reduce_scatter: out must not overlap buf")
    return rop, data, dst


def all_to_all_args(
    ch: Channel, send: Any, recv: Any, segment_bytes: int, own: bool = True
) -> tuple[np.ndarray, np.ndarray, int, list[tuple[int, int]]]:
    """The checks and setup every (even) all_to_all starts with: ``(uint8 view of
    send, uint8 view of recv, block bytes, the segments of one block)``, with this
    rank's own block already copied from ``send`` to ``recv`` (unless not ``own``: the
    caller never reads it there, as the compressed exchange)."""
    check_segment_bytes(segment_bytes)
    src = as_u8(send, "send", writeable=False)
    dst = as_u8(recv, "recv")
    P, r = ch.size, ch.rank
    if src.nbytes != dst.nbytes or src.nbytes % P:
        raise ValueError(
            f"all_to_all: send ({src.nbytes} bytes) and recv ({dst.nbytes} bytes) "
            f"must be {P} equal blocks of the same size"
        )
    if np.may_share_memory(src, dst) and src.nbytes:
        raise ValueError("all_to_all: send and recv must not overlap")
    block = src.nbytes // P
    if own:
        dst[r * block : (r + 1) * block] = src[r * block : (r + 1) * block]
    return src, dst, block, split(block, num_segments(block, segment_bytes))


def gather_args(ch: Channel, buf: Any, segment_bytes: int, what: str) -> tuple[np.ndarray, int]:
    """The checks every all-gather starts with: ``(uint8 view of buf, block bytes)``."""
    check_segment_bytes(segment_bytes)
    data = as_u8(buf)
    if data.nbytes % ch.size:
        raise ValueError(f"{what} buffer of {data.nbytes} bytes is not {ch.size} equal blocks")
    return data, data.nbytes // ch.size


def where(ch: Channel) -> dict[str, Any]:
    """``op``/``seq`` keywords for errors raised by an algorithm on ``ch``."""
    op = getattr(ch, "op", None)
    return {"op": getattr(op, "name", None), "seq": getattr(op, "seq", None)}


def check_root(ch: Channel, root: int) -> int:
    return ranks.check_root(root, ch.size)


__all__ = [
    "all_to_all_args",
    "as_u8",
    "check_root",
    "check_segment_bytes",
    "flat",
    "gather_args",
    "own_input",
    "reduce_scatter_args",
    "reduction_args",
    "where",
]
