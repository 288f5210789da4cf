"""The public :class:`Communicator`: argument checks, algorithm choice,
sequencing, deadlines and typed errors around the algorithms.

Every collective call on a group takes the next sequence number; ranks must
issue the same collectives in the same order (concurrent calls are fine, as in
NCCL). Each call sends a fingerprint of itself (name, dtype, shape, op, root,
algorithm, segment size) with every frame, so ranks that disagree fail with a
:class:`MismatchError` naming both calls. One deadline covers a whole call;
when it passes, the error names the ranks that never delivered, and every
other rank is told to abort (no one waits for its own timeout).

Uneven sizes ("v" collectives, as MPI's ``alltoallv``/``gatherv``/...):
``all_to_all``, ``scatter`` and ``reduce_scatter`` also take a *list* (or
tuple) of ``world_size`` arrays of one dtype and any shapes instead of one
array with a leading rank axis, and ``gather``/``all_gather`` take
``uneven=True`` for per-rank different shapes; these return lists. Shapes and
dtypes travel with the data wherever the receiver cannot know them.

Cancelling a task that is running a collective fails that collective on every
rank (the others get :class:`CollectiveAborted`) and the communicator stays
usable, because the call has already taken its sequence number. A task
cancelled before its coroutine first ran never took one: then this rank is one
collective behind the others, and the next calls pair up wrongly (mismatch
errors at best) — cancel only calls that have started, or close the
communicator.
"""

from __future__ import annotations

import hashlib
import numbers
from typing import Any

import numpy as np

from . import algorithms
from .arrays import (
    array_from_meta,
    as_array,
    check_out,
    contiguous_copy,
    describe,
    leading_ranks,
    meta_of,
)
from .engine import DEFAULT_TIMEOUT, CommBase
from .errors import MismatchError
from .ops import BFLOAT16, ReduceOp, check_op_dtype, finalize, parse_op
from .transport.base import Channel, as_bytes


def _flat_bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def _is_list(x: Any) -> bool:
    """Uneven ("v") input: a list or tuple of per-rank arrays."""
    return isinstance(x, (list, tuple))


def _dtype_name(dt: np.dtype) -> str:
    return "bfloat16" if dt == BFLOAT16 else dt.name


def _contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` itself when C-contiguous (it is only read), else a C-contiguous copy."""
    return a if a.flags.c_contiguous else np.array(a, order="C", copy=True)


def _result(out: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The caller's ``out`` (checked) or a new array for a collective's result."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    return check_out(out, shape, dtype)


def _unaliased(x: np.ndarray, out: np.ndarray, in_place: np.ndarray | None = None) -> np.ndarray:
    """``x``, or a copy of it if it overlaps ``out`` (other than being exactly
    ``in_place``, the part of ``out`` it belongs in): an input the result
    would overwrite while it is still being sent."""
    if not np.may_share_memory(x, out):
        return x
    if (in_place is not None and x.shape == in_place.shape and x.strides == in_place.strides
            and x.__array_interface__["data"][0] == in_place.__array_interface__["data"][0]):
        return x
    return np.array(x, order="C", copy=True)


def _array_list(x: Any, world_size: int, what: str) -> list[np.ndarray]:
    """Check an uneven ("v") argument: ``world_size`` arrays of one supported
    dtype (any shapes). Raises before any byte is sent."""
    arrs = [as_array(a, f"{what}[{k}]") for k, a in enumerate(x)]
    if len(arrs) != world_size:
        raise ValueError(f"{what} needs one array per rank: a list of world_size={world_size} arrays, "
                         f"got {len(arrs)}")
    dtypes = sorted({_dtype_name(a.dtype) for a in arrs})
    if len(dtypes) > 1:
        raise TypeError(f"{what}: every array of the list must have the same dtype, got {', '.join(dtypes)}")
    return [_contiguous(a) for a in arrs]


def _shapes(arrs: list[np.ndarray]) -> str:
    """The shapes of a list for a fingerprint (a digest when long: the
    fingerprint rides on every frame)."""
    text = ";".join(f"[{','.join(map(str, a.shape))}]" for a in arrs)
    if len(text) <= 200:
        return text
    return f"{len(arrs)} shapes sha1:{hashlib.sha1(text.encode()).hexdigest()[:16]}"


def _check_uneven(uneven: Any) -> bool:
    if not isinstance(uneven, bool):
        raise TypeError(f"uneven must be True or False, got {uneven!r}")
    return uneven


class Communicator(CommBase):
    """A group of ranks that run collectives together.

    Attributes:
        rank: this process's rank in the group (0..world_size-1).
        world_size: the number of ranks in the group.
        group: the group's name (sub-groups from :meth:`split` get derived names).
    """

    # -- collectives ----------------------------------------------------------------
    async def all_reduce(self, x: Any, op: str | ReduceOp = "sum", *, out: np.ndarray | None = None,
                         timeout: float | None = None, algorithm: str = "auto") -> np.ndarray:
        """Reduce ``x`` over all ranks; every rank gets the bit-identical result."""
        x = as_array(x)
        rop = parse_op(op)
        check_op_dtype(rop, x.dtype)
        algo = self._pick("all_reduce", algorithm, x.nbytes)
        kw: dict[str, Any] = {"segment_bytes": self.segment_bytes}
        if (algo == "ring" and self.world_size > 1 and out is not x and x.flags.c_contiguous
                and (out is None or not np.may_share_memory(out, x))):
            # the ring reads our input where it needs it: no up-front copy into the result
            buf = np.empty(x.shape, x.dtype) if out is None else check_out(out, x.shape, x.dtype)
            kw["src"] = x.reshape(-1)
        else:
            buf = contiguous_copy(x, out)
        if self.world_size > 1:
            fn = algorithms.ALGORITHMS["all_reduce"][algo]
            key = ("all_reduce", x.dtype, x.shape, rop, algo, self.segment_bytes)
            fp = self._fps.get(key)
            if fp is None:
                fp = self._remember_fp(key, self._fp("all_reduce", x=describe(x.dtype, x.shape), op=rop.value,
                                                     algorithm=algo))
            await self._run("all_reduce", fp, lambda ch: fn(ch, buf.reshape(-1), rop, **kw), timeout)
        if rop is ReduceOp.AVG:
            finalize(rop, buf, self.world_size)
        return buf

    async def broadcast(self, x: Any = None, root: int = 0, *, timeout: float | None = None,
                        algorithm: str = "auto") -> np.ndarray:
        """Root's ``x`` to every rank. Non-roots pass ``None`` (shape and dtype
        travel with the data) or a buffer to receive into, which is returned.
        The root's result is ``x`` itself (sent without a copy, never
        modified) when it is a C-contiguous numpy array, else a contiguous copy."""
        root = self._check_root(root)
        algo = self._pick("broadcast", algorithm, 0)
        meta: dict[str, Any] | None = None
        if self.rank == root:
            arr = _contiguous(as_array(x))
            meta = meta_of(arr)
        elif x is not None:
            arr = check_out(x, x.shape, as_array(x).dtype, "broadcast buffer")
        else:
            arr = None
        if self.world_size == 1:
            return arr  # type: ignore[return-value]
        fn = algorithms.ALGORITHMS["broadcast"][algo]
        fp = self._fp("broadcast", root=root, algorithm=algo)
        data, meta = await self._run("broadcast", fp, lambda ch: fn(
            ch, None if arr is None else _flat_bytes(arr), root, meta=meta,
            segment_bytes=self.segment_bytes), timeout)
        if self.rank == root:
            return arr  # type: ignore[return-value]
        got = array_from_meta(meta)
        if arr is not None:
            if arr.shape != got.shape or arr.dtype != got.dtype:
                raise MismatchError(f"broadcast from rank {root} sent {describe(got.dtype, got.shape)} but "
                                    f"rank {self.rank} passed a {describe(arr.dtype, arr.shape)} buffer",
                                    op="broadcast", ranks=(self.rank, root))
            return arr
        return np.frombuffer(data, dtype=got.dtype).reshape(got.shape) if got.size else got

    async def reduce(self, x: Any, op: str | ReduceOp = "sum", root: int = 0, *, out: np.ndarray | None = None,
                     timeout: float | None = None, algorithm: str = "auto") -> np.ndarray | None:
        """Reduce ``x`` over all ranks into ``root``; others get ``None``.
        ``out`` (optional; used at the root, ignored elsewhere): a C-contiguous
        array of ``x``'s shape and dtype that receives and is the result."""
        x = as_array(x)
        rop = parse_op(op)
        check_op_dtype(rop, x.dtype)
        root = self._check_root(root)
        algo = self._pick("reduce", algorithm, x.nbytes)
        kw: dict[str, Any] = {"segment_bytes": self.segment_bytes}
        mine = out if self.rank == root else None
        if algo == "ring" and self.world_size > 1:
            # the ring reads our input where it needs it (non-roots need no buffer)
            src = _contiguous(x)
            if self.rank == root:
                buf = _result(mine, x.shape, x.dtype)
                src = _unaliased(src, buf)
            else:
                buf = None
            kw["src"] = src.reshape(-1)
        else:
            buf = contiguous_copy(x, mine)
        if self.world_size > 1:
            fn = algorithms.ALGORITHMS["reduce"][algo]
            fp = self._fp("reduce", x=describe(x.dtype, x.shape), op=rop.value, root=root, algorithm=algo)
            await self._run("reduce", fp, lambda ch: fn(ch, None if buf is None else buf.reshape(-1), rop, root,
                                                        **kw), timeout)
        if self.rank != root:
            return None
        finalize(rop, buf, self.world_size)
        return buf

    async def all_gather(self, x: Any, *, uneven: bool = False, out: np.ndarray | None = None,
                         timeout: float | None = None, algorithm: str = "auto") -> np.ndarray | list[np.ndarray]:
        """Every rank's ``x`` stacked: row ``r`` comes from rank ``r``.

        Args:
            x: this rank's array; same shape and dtype on every rank.
            uneven: ``True`` lets ranks pass arrays of *different* shapes (one
                dtype): the result is then a list of ``world_size`` arrays,
                ``y[r]`` = rank ``r``'s ``x`` (shapes travel with the data;
                algorithm ``"pairwise"``). Every rank must pass the same value.
            out: optional C-contiguous array of shape ``(world_size, *x.shape)``
                and ``x``'s dtype to fill and return instead of a new one (not
                with ``uneven=True``); ``x`` may be ``out[rank]`` (in place).

        Returns:
            An array of shape ``(world_size, *x.shape)`` (``out`` if given), or
            with ``uneven=True`` a list of ``world_size`` arrays.
        """
        x = as_array(x)
        if _check_uneven(uneven) and out is not None:
            raise ValueError("all_gather: out= is not supported with uneven=True (the result is a list)")
        if uneven:
            algo = self._pick_v("all_gather", algorithm, "pairwise")
            if self.world_size == 1:
                return [contiguous_copy(x)]
            send = _contiguous(x)
            fp = self._fp("all_gather", x=f"{_dtype_name(x.dtype)}[uneven]", uneven=True, algorithm=algo)
            got = await self._run("all_gather", fp, lambda ch: algorithms.pairwise.all_gather_list(
                ch, send, meta=meta_of(send), segment_bytes=self.segment_bytes), timeout)
            return [array_from_meta(meta, memoryview(buf)) for buf, meta in got]
        out = _result(out, (self.world_size, *x.shape), x.dtype)
        x = _unaliased(x, out, out[self.rank])
        out[self.rank] = x
        algo = self._pick("all_gather", algorithm, out.nbytes)
        if self.world_size > 1:
            fn = algorithms.ALGORITHMS["all_gather"][algo]
            fp = self._fp("all_gather", x=describe(x.dtype, x.shape), algorithm=algo)
            await self._run("all_gather", fp, lambda ch: fn(ch, _flat_bytes(out),
                                                            segment_bytes=self.segment_bytes), timeout)
        return out

    async def gather(self, x: Any, root: int = 0, *, uneven: bool = False, out: np.ndarray | None = None,
                     timeout: float | None = None,
                     algorithm: str = "auto") -> np.ndarray | list[np.ndarray] | None:
        """Every rank's ``x`` stacked at ``root``; others get ``None``.

        Args:
            x: this rank's array; same shape and dtype on every rank.
            root: the gathering rank.
            uneven: ``True`` lets ranks pass arrays of *different* shapes (one
                dtype): the root then gets a list of ``world_size`` arrays,
                ``y[r]`` = rank ``r``'s ``x`` (shapes travel with the data).
                Every rank must pass the same value.
            out: optional; at the root, a C-contiguous array of shape
                ``(world_size, *x.shape)`` and ``x``'s dtype to fill and return
                (not with ``uneven=True``); ignored on the other ranks.

        Returns:
            Root: an array of shape ``(world_size, *x.shape)`` (``out`` if
            given), or with ``uneven=True`` a list of ``world_size`` arrays.
            Others: ``None``.
        """
        x = as_array(x)
        root = self._check_root(root)
        if _check_uneven(uneven) and out is not None:
            raise ValueError("gather: out= is not supported with uneven=True (the result is a list)")
        if uneven:
            algo = self._pick_v("gather", algorithm, "direct")
            if self.world_size == 1:
                return [contiguous_copy(x)]
            send = _contiguous(x)
            fp = self._fp("gather", x=f"{_dtype_name(x.dtype)}[uneven]", root=root, uneven=True, algorithm=algo)
            got = await self._run("gather", fp, lambda ch: algorithms.direct.gather_list(
                ch, send, root, meta=meta_of(send), segment_bytes=self.segment_bytes), timeout)
            if got is None:
                return None
            return [array_from_meta(meta, memoryview(buf)) for buf, meta in got]
        algo = self._pick("gather", algorithm, x.nbytes * self.world_size)
        send = _contiguous(x)
        if self.rank == root:
            out = _result(out, (self.world_size, *x.shape), x.dtype)
            send = _unaliased(send, out, out[self.rank])
            out[self.rank] = send
        else:
            out = None
        if self.world_size > 1:
            fn = algorithms.ALGORITHMS["gather"][algo]
            fp = self._fp("gather", x=describe(x.dtype, x.shape), root=root, algorithm=algo)
            await self._run("gather", fp, lambda ch: fn(ch, _flat_bytes(send), None if out is None else
                                                        _flat_bytes(out), root,
                                                        segment_bytes=self.segment_bytes), timeout)
        return out

    async def scatter(self, x: Any = None, root: int = 0, *, out: np.ndarray | None = None,
                      timeout: float | None = None, algorithm: str = "auto") -> np.ndarray:
        """Row ``rank`` of the root's ``x`` to each rank.

        Args:
            x: root: an array of shape ``(world_size, *s)``, or a list (or
                tuple) of ``world_size`` arrays of one dtype and any shapes
                (uneven sizes; rank ``k`` gets ``x[k]``). Others: ignored
                (pass ``None``): shape and dtype travel with the data.
            root: the scattering rank.
            out: a C-contiguous array of one row's shape and dtype to receive
                into and return. Every rank passes one or none (a rank that
                does and one that does not make a mismatch error); the root's
                ``x`` must then be an array (not a list) of rows of that shape.

        Returns:
            ``x[rank]`` of the root's ``x`` (a new array, or ``out``).

        Raises:
            ValueError / TypeError (at the root, before any byte is sent): no
            leading rank axis, a list of the wrong length, mixed dtypes.
        """
        root = self._check_root(root)
        algo = self._pick("scatter", algorithm, 0)
        if out is not None:
            return await self._scatter_into(x, root, out, algo, timeout)
        blocks: list[np.ndarray] | None = None
        if self.rank == root:
            if _is_list(x):
                blocks = _array_list(x, self.world_size, "scatter")
            else:
                whole = _contiguous(as_array(x))
                leading_ranks(whole, self.world_size, "scatter")
                blocks = [whole[k, ...] for k in range(self.world_size)]  # 0-d rows stay arrays
        if self.world_size == 1:
            return contiguous_copy(blocks[0])  # type: ignore[index]
        seg = self.segment_bytes
        metas = None if blocks is None else [meta_of(b) for b in blocks]

        async def body(ch: Channel) -> np.ndarray:
            # direct scatter; each block carries its dtype/shape so non-roots need no buffer
            buf, meta = await algorithms.direct.scatter_list(ch, blocks, root, metas=metas, segment_bytes=seg)
            return array_from_meta(meta, memoryview(buf))

        return await self._run("scatter", self._fp("scatter", root=root, algorithm=algo), body, timeout)

    async def _scatter_into(self, x: Any, root: int, out: Any, algo: str, timeout: float | None) -> np.ndarray:
        """scatter with ``out=``: every rank knows the row's shape, so the
        blocks go straight into ``out`` (no metadata, no allocation)."""
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
        out = check_out(as_array(out, "out"), out.shape, out.dtype)
        whole: np.ndarray | None = None
        if self.rank == root:
            if _is_list(x):
                raise ValueError("scatter: out= needs the root's x as one array of rows, not a list")
            whole = _contiguous(as_array(x))
            leading_ranks(whole, self.world_size, "scatter")
            if whole.shape[1:] != out.shape or whole.dtype != out.dtype:
                raise ValueError(f"scatter: out is {describe(out.dtype, out.shape)} but the rows of x are "
                                 f"{describe(whole.dtype, whole.shape[1:])}")
            whole = _unaliased(whole, out, whole[root])
        if self.world_size == 1:
            out[...] = whole[0]  # type: ignore[index]
            return out
        fp = self._fp("scatter", x=describe(out.dtype, out.shape), root=root, algorithm=algo, out=True)
        await self._run("scatter", fp, lambda ch: algorithms.direct.scatter(
            ch, None if whole is None else _flat_bytes(whole), _flat_bytes(out), root,
            segment_bytes=self.segment_bytes), timeout)
        return out

    async def reduce_scatter(self, x: Any, op: str | ReduceOp = "sum", *, out: np.ndarray | None = None,
                             timeout: float | None = None, algorithm: str = "auto") -> np.ndarray:
        """Reduce ``x`` over ranks; rank ``r`` gets reduced row ``r``.

        Args:
            x: an array of shape ``(world_size, *s)``, same on every rank; or
                a list (or tuple) of ``world_size`` arrays of one dtype whose
                ``x[j]`` has the same shape on every rank (shapes may differ
                across ``j``): rank ``r`` gets ``x[r]`` reduced (uneven sizes;
                algorithm ``"pairwise"``, reduced in the fixed order
                ``((x[r+1] op x[r+2]) op ...) op x[r]`` over ranks mod P, so
                deterministic run to run).
            op: the reduction.
            out: optional C-contiguous array of shape ``s`` and ``x``'s dtype
                to fill and return (array input only).

        Returns:
            The reduced row (shape ``s``; ``out`` if given), or the reduced ``x[rank]``.

        Raises:
            ValueError / TypeError before any byte is sent: no leading rank
            axis, a list of the wrong length, mixed dtypes, an op the dtype
            does not support.
        """
        rop = parse_op(op)
        if _is_list(x):
            if out is not None:
                raise ValueError("reduce_scatter: out= is not supported for a list input")
            blocks = _array_list(x, self.world_size, "reduce_scatter")
            check_op_dtype(rop, blocks[0].dtype)
            algo = self._pick_v("reduce_scatter", algorithm, "pairwise")
            out = contiguous_copy(blocks[self.rank])
            if self.world_size > 1:
                fp = self._fp("reduce_scatter", x=f"list of {_dtype_name(out.dtype)}", shapes=_shapes(blocks),
                              op=rop.value, algorithm=algo)
                await self._run("reduce_scatter", fp, lambda ch: algorithms.pairwise.reduce_scatter_list(
                    ch, blocks, rop, out, segment_bytes=self.segment_bytes), timeout)
            finalize(rop, out, self.world_size)
            return out
        x = as_array(x)
        leading_ranks(x, self.world_size, "reduce_scatter")
        check_op_dtype(rop, x.dtype)
        algo = self._pick("reduce_scatter", algorithm, x.nbytes)
        out = _result(out, x.shape[1:], x.dtype)
        buf = _unaliased(_contiguous(x), out)  # read only: no copy unless out overlaps it
        if self.world_size == 1:
            out[...] = buf[0]
        else:
            fn = algorithms.ALGORITHMS["reduce_scatter"][algo]
            fp = self._fp("reduce_scatter", x=describe(x.dtype, x.shape), op=rop.value, algorithm=algo)
            await self._run("reduce_scatter", fp, lambda ch: fn(ch, buf.reshape(-1), rop, out.reshape(-1),
                                                                segment_bytes=self.segment_bytes), timeout)
        finalize(rop, out, self.world_size)
        return out

    async def all_to_all(self, x: Any, *, out: np.ndarray | None = None, timeout: float | None = None,
                         algorithm: str = "auto") -> np.ndarray | list[np.ndarray]:
        """``y[j]`` = rank ``j``'s ``x[rank]``.

        Args:
            x: an array of shape ``(world_size, *s)`` (same on every rank); or
                a list (or tuple) of ``world_size`` arrays of one dtype and any
                shapes — ``x[j]`` goes to rank ``j`` (uneven sizes, as MPI's
                ``alltoallv``; shapes travel with the data, so ranks need not
                know what they will receive; the dtype must be the same on
                every rank).
            out: optional C-contiguous array of ``x``'s shape and dtype to fill
                and return (array input only).

        Returns:
            An array ``y`` of shape ``(world_size, *s)`` (``out`` if given), or
            for a list input a list of ``world_size`` arrays, ``y[j]`` = rank
            ``j``'s ``x[rank]``.

        Raises:
            ValueError / TypeError before any byte is sent: no leading rank
            axis, a list of the wrong length, mixed dtypes.
        """
        if _is_list(x):
            if out is not None:
                raise ValueError("all_to_all: out= is not supported for a list input")
            blocks = _array_list(x, self.world_size, "all_to_all")
            algo = self._pick_v("all_to_all", algorithm, "pairwise")
            if self.world_size == 1:
                return [contiguous_copy(blocks[0])]
            fp = self._fp("all_to_all", x=f"list of {_dtype_name(blocks[0].dtype)}", algorithm=algo)
            got = await self._run("all_to_all", fp, lambda ch: algorithms.pairwise.all_to_all_list(
                ch, blocks, metas=[meta_of(b) for b in blocks], segment_bytes=self.segment_bytes), timeout)
            return [array_from_meta(meta, memoryview(buf)) for buf, meta in got]
        x = as_array(x)
        leading_ranks(x, self.world_size, "all_to_all")
        algo = self._pick("all_to_all", algorithm, x.nbytes)
        out = _result(out, x.shape, x.dtype)
        send = _unaliased(_contiguous(x), out)
        if self.world_size == 1:
            out[...] = send
            return out
        fn = algorithms.ALGORITHMS["all_to_all"][algo]
        fp = self._fp("all_to_all", x=describe(x.dtype, x.shape), algorithm=algo)
        await self._run("all_to_all", fp, lambda ch: fn(ch, _flat_bytes(send), _flat_bytes(out),
                                                        segment_bytes=self.segment_bytes), timeout)
        return out

    async def barrier(self, *, timeout: float | None = None, algorithm: str = "auto") -> None:
        """Return once every rank has entered the barrier."""
        algo = self._pick("barrier", algorithm, 0)
        if self.world_size > 1:
            fn = algorithms.ALGORITHMS["barrier"][algo]
            await self._run("barrier", self._fp("barrier", segmented=False, algorithm=algo), fn, timeout)

    # -- point to point -------------------------------------------------------------
    def _p2p(self, src: int, dst: int, tag: int) -> tuple[str, int, tuple[int, ...]]:
        if isinstance(tag, bool) or not isinstance(tag, numbers.Integral) or tag < 0:
            raise ValueError(f"tag must be a non-negative int, got {tag!r}")
        for what, r in (("dst", dst), ("src", src)):
            if isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 0 <= r < self.world_size:
                raise ValueError(f"{what} must be a rank in 0..{self.world_size - 1}, got {r!r}")
        if src == dst:
            raise ValueError(f"rank {src} cannot send to itself")
        group = f"{self.group}/p2p/{tag}/{src}>{dst}"
        seq = self._p2p_seq.get(group, 0)
        self._p2p_seq[group] = seq + 1
        return group, seq, (self.members[src], self.members[dst])

    async def send(self, x: Any, dst: int, tag: int = 0, *, timeout: float | None = None) -> None:
        """Send ``x`` to rank ``dst``; matched by the ``dst``'s ``recv(src, tag)`` calls in order."""
        arr = as_array(x)
        data = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        group, seq, members = self._p2p(self.rank, dst, tag)
        await self._run("send", self._fp("p2p"), lambda ch: algorithms.direct.send_message(
            ch, 1, data, meta=meta_of(data), segment_bytes=self.segment_bytes), timeout,
            group=group, seq=seq, members=members)

    async def recv(self, src: int, tag: int = 0, *, timeout: float | None = None) -> np.ndarray:
        """Receive the next array rank ``src`` sent with ``tag``."""
        group, seq, members = self._p2p(src, self.rank, tag)

        async def body(ch: Channel) -> np.ndarray:
            buf, meta = await algorithms.direct.recv_message(ch, 0, segment_bytes=self.segment_bytes)
            return array_from_meta(meta, memoryview(buf))

        return await self._run("recv", self._fp("p2p"), body, timeout, group=group, seq=seq, members=members)

    # -- groups ----------------------------------------------------------------------
    async def split(self, color: int | None, key: int = 0, *, timeout: float | None = None) -> Communicator | None:
        """Collective: ranks passing the same ``color`` form a sub-group over the
        same links, ordered by (``key``, rank). ``color=None`` joins none (returns None)."""
        for what, v in (("color", color), ("key", key)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0):
                raise ValueError(f"{what} must be a non-negative int{' or None' if what == 'color' else ''}, "
                                 f"got {v!r}")
        table = await self.all_gather(np.array([-1 if color is None else color, key, self.rank], np.int64),
                                      timeout=timeout)
        index = self._splits
        self._splits += 1
        if color is None:
            return None
        mine = sorted((int(k), int(r)) for c, k, r in table if c == color)
        sub = Communicator(self.transport, group=f"{self.group}/split{index}:{color}",
                           members=tuple(self.members[r] for _, r in mine), timeout=self.timeout,
                           segment_bytes=self.segment_bytes)
        return sub

    async def close(self) -> None:
        """Close the communicator (and, for the one :func:`connect` made, its links)."""
        if self.closed:
            return
        self.closed = True
        for hook in reversed(self._on_close):
            await hook()



__all__ = ["DEFAULT_TIMEOUT", "Communicator", "as_bytes"]
