"""``ProcessGroupNetcoll``: the torch.distributed process group over a netcoll
communicator (a pure-Python ``torch.distributed.ProcessGroup``, as torch's own
tests make them).

Each method takes the tensors torch passes, issues one netcoll collective
(:class:`~netcoll.torch.issue.Issuer`) and returns a torch ``Work``; the
results land in torch's tensors in place, as with Gloo: contiguous tensors are
handed to netcoll as the output buffer itself (no copy), others get the result
copied in when the collective ends. ``op`` is a ``torch.distributed.ReduceOp``
(``PREMUL_SUM`` is refused). Collectives are not differentiable: tensors that
require grad are read and written through ``.detach()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..compression import Compression
from ..tensors import to_tensor
from .issue import Issuer, completed

__all__ = ["ProcessGroupNetcoll"]

Tensors = list[torch.Tensor]


def _one(tensors: Sequence[Any], what: str) -> Any:
    if len(tensors) != 1:
        raise ValueError(f"netcoll {what}: one tensor per call (got {len(tensors)}); torch passes one per device")
    return tensors[0]


def _timeout(opts: Any) -> float | None:
    """The call's own timeout (torch leaves it unset, -1 ms: the group's applies)."""
    seconds = float(opts.timeout.total_seconds())
    return seconds if seconds > 0 else None


def _as_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else to_tensor(value)


def _fill(dst: torch.Tensor, value: Any) -> None:
    """Copy a result into ``dst`` (unless it was written there already)."""
    src = _as_tensor(value)
    if src is dst:
        return
    if src.dtype != dst.dtype or src.numel() != dst.numel():
        raise ValueError(
            f"netcoll: received {src.dtype} of {src.numel()} elements for a {dst.dtype} tensor of {dst.numel()}"
        )
    with torch.no_grad():
        dst.copy_(src.reshape(dst.shape))


def _fill_rows(dsts: Sequence[torch.Tensor], rows: Any) -> None:
    for dst, row in zip(dsts, rows, strict=True):
        _fill(dst, row)


def _into(dst: torch.Tensor, value: Any, done: Any) -> Any:
    """A collective's finish: its result into ``dst``; ``done`` for torch's future."""
    _fill(dst, value)
    return done


def _rows_into(dsts: Sequence[torch.Tensor], rows: Any, done: Any) -> Any:
    _fill_rows(dsts, rows)
    return done


def _even(tensors: Sequence[torch.Tensor], like: torch.Tensor) -> bool:
    return all(t.shape == like.shape and t.dtype == like.dtype for t in tensors)


class ProcessGroupNetcoll(dist.ProcessGroup):
    """A torch process group whose collectives run on a netcoll communicator.

    (mypy: torch's stub lists each C++ method's overloads -- the ``opts`` form
    and Python conveniences with ``timeout=`` or ``root=`` -- under other
    parameter names; torch calls the ``opts`` form of a Python subclass, which
    is what these override, hence the ``type: ignore[override]`` per method.)
    """

    def __init__(self, issue: Issuer, rank: int, size: int, *, on_shutdown: Callable[[], None]) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (rank, size) form exists; the stub lacks it
        self._issue = issue
        self._on_shutdown = on_shutdown
        self._group_name = self._group_desc = ""

    def getBackendName(self) -> str:
        return "netcoll"

    # torch names a group after creating it (functional collectives find groups by name)
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    def __repr__(self) -> str:
        return f"<ProcessGroupNetcoll {self._issue.comm.group!r} rank={self.rank()} size={self.size()}>"

    def shutdown(self) -> None:
        self._on_shutdown()

    def abort(self) -> None:
        self._on_shutdown()

    # -- reducing --------------------------------------------------------------------
    def allreduce(self, tensors: Tensors, opts: Any) -> dist.Work:  # type: ignore[override]
        t, op, timeout = _one(tensors, "allreduce"), opts.reduceOp, _timeout(opts)
        out = t if t.is_contiguous() else None
        return self._issue(lambda c: c.all_reduce(t, op, out=out, timeout=timeout), lambda r: _into(t, r, tensors))

    def allreduce_compressed(
        self,
        tensor: torch.Tensor,
        compression: Compression,
        op: Any = dist.ReduceOp.AVG,
        timeout: float | None = None,
        *,
        source: torch.Tensor | None = None,
    ) -> dist.Work:
        """``allreduce`` with the codec ``compression`` (netcoll's ``compression=``, which
        torch's ``all_reduce`` has no way to pass): what the DDP hook of
        :mod:`netcoll.torch.hooks` calls. In place, like ``allreduce``, or, with
        ``source`` (a tensor of ``tensor``'s shape and dtype, not overlapping it), the
        reduction of ``source`` into ``tensor``: neither is copied. Returns at once, before
        the collective is issued on netcoll's loop (autograd goes on meanwhile; the issues
        keep the calls' order): its errors, argument errors too, are the Work's. The
        future's value is ``[tensor]``."""
        x = tensor if source is None else source
        out = tensor if tensor.is_contiguous() else None
        return self._issue(
            lambda c: c.all_reduce(x, op, out=out, timeout=timeout, compression=compression),
            lambda r: _into(tensor, r, [tensor]),
            wait=False,
        )

    def allreduce_coalesced(self, tensors: Tensors, opts: Any) -> dist.Work:  # type: ignore[override]
        if len({t.dtype for t in tensors}) > 1:
            raise TypeError("netcoll allreduce_coalesced: every tensor must have the same dtype")
        if not tensors:
            return completed(tensors)
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        op, timeout = opts.reduceOp, _timeout(opts)

        def finish(_: Any) -> Tensors:
            _fill_rows(tensors, torch.split(flat, [t.numel() for t in tensors]))
            return tensors

        return self._issue(lambda c: c.all_reduce(flat, op, out=flat, timeout=timeout), finish)

    def reduce(self, tensors: Tensors, opts: Any) -> dist.Work:  # type: ignore[override]
        t, op, root, timeout = _one(tensors, "reduce"), opts.reduceOp, opts.rootRank, _timeout(opts)
        out = t if t.is_contiguous() else None

        def finish(value: Any) -> Tensors:
            if value is not None:
                _fill(t, value)
            return tensors

        return self._issue(lambda c: c.reduce(t, op, root, out=out, timeout=timeout), finish)

    def reduce_scatter(self, output_tensors: Tensors, input_tensors: list[Tensors], opts: Any) -> dist.Work:  # type: ignore[override]
        out, ins = _one(output_tensors, "reduce_scatter"), _one(input_tensors, "reduce_scatter")
        op, timeout = opts.reduceOp, _timeout(opts)
        # one shape for every block is the same on every rank: the stacked (even) call, else the list one
        x: Any = torch.stack([i.detach() for i in ins]) if _even(ins, out) else [i.detach() for i in ins]
        dst = out if out.is_contiguous() and not isinstance(x, list) else None
        return self._issue(
            lambda c: c.reduce_scatter(x, op, out=dst, timeout=timeout), lambda r: _into(out, r, output_tensors)
        )

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        size, op, timeout = self.size(), opts.reduceOp, _timeout(opts)
        if input.numel() != size * output.numel():
            raise ValueError(
                f"netcoll reduce_scatter_tensor: input has {input.numel()} elements, not "
                f"world_size={size} x the output's {output.numel()}"
            )
        x = input.detach().reshape(size, *output.shape)
        dst = output if output.is_contiguous() else None
        return self._issue(
            lambda c: c.reduce_scatter(x, op, out=dst, timeout=timeout), lambda r: _into(output, r, [output])
        )

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]  # (see the class docstring)

    # -- moving ----------------------------------------------------------------------
    def broadcast(self, tensors: Tensors, opts: Any) -> dist.Work:  # type: ignore[override]
        t, root, timeout = _one(tensors, "broadcast"), opts.rootRank, _timeout(opts)
        x = t if t.is_contiguous() or self.rank() == root else None
        return self._issue(lambda c: c.broadcast(x, root, timeout=timeout), lambda r: _into(t, r, tensors))

    def allgather(self, output_tensors: list[Tensors], input_tensors: Tensors, opts: Any) -> dist.Work:  # type: ignore[override]
        outs, t, timeout = _one(output_tensors, "allgather"), _one(input_tensors, "allgather"), _timeout(opts)
        uneven = not _even(outs, t)  # the outputs' shapes are the same on every rank
        return self._issue(
            lambda c: c.all_gather(t, uneven=uneven, timeout=timeout),
            lambda rows: _rows_into(outs, rows, output_tensors),
        )

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> dist.Work:  # type: ignore[override]
        size, timeout = self.size(), _timeout(opts)
        if output.numel() != size * input.numel() or output.dtype != input.dtype:
            raise ValueError(
                f"netcoll all_gather_into_tensor: output must hold world_size={size} x the input's "
                f"{input.numel()} {input.dtype} elements, got {output.numel()} {output.dtype}"
            )
        dst = output.view(size, *input.shape) if output.is_contiguous() else None
        return self._issue(
            lambda c: c.all_gather(input, out=dst, timeout=timeout), lambda r: _into(output, r, [output])
        )

    _allgather_base = all_gather_single  # type: ignore[assignment]  # (see the class docstring)

    def gather(self, output_tensors: list[Tensors], input_tensors: Tensors, opts: Any) -> dist.Work:  # type: ignore[override]
        t, root, timeout = _one(input_tensors, "gather"), opts.rootRank, _timeout(opts)
        outs = _one(output_tensors, "gather") if self.rank() == root else []

        def finish(rows: Any) -> list[Tensors]:
            if rows is not None:
                _fill_rows(outs, rows)
            return output_tensors

        return self._issue(lambda c: c.gather(t, root, timeout=timeout), finish)

    def scatter(self, output_tensors: Tensors, input_tensors: list[Tensors], opts: Any) -> dist.Work:  # type: ignore[override]
        out, root, timeout = _one(output_tensors, "scatter"), opts.rootRank, _timeout(opts)
        x = [i.detach() for i in _one(input_tensors, "scatter")] if self.rank() == root else None
        return self._issue(lambda c: c.scatter(x, root, timeout=timeout), lambda r: _into(out, r, output_tensors))

    def alltoall(self, output_tensors: Tensors, input_tensors: Tensors, opts: Any) -> dist.Work:  # type: ignore[override]
        ins, timeout = [i.detach() for i in input_tensors], _timeout(opts)
        return self._issue(
            lambda c: c.all_to_all(ins, timeout=timeout), lambda rows: _rows_into(output_tensors, rows, output_tensors)
        )

    def all_to_all_single(  # type: ignore[override]
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any,
    ) -> dist.Work:
        size, timeout = self.size(), _timeout(opts)
        if not output_split_sizes and not input_split_sizes:  # even: one array of world_size rows
            if input.shape[0] % size or output.shape != input.shape:
                raise ValueError(
                    f"netcoll all_to_all_single: without split sizes, input and output need one shape whose "
                    f"first dimension divides by world_size={size}; got {tuple(input.shape)}, {tuple(output.shape)}"
                )
            x = input.detach().reshape(size, -1, *input.shape[1:])
            dst = output.view(x.shape) if output.is_contiguous() else None
            return self._issue(
                lambda c: c.all_to_all(x, out=dst, timeout=timeout), lambda r: _into(output, r, [output])
            )
        ins = list(torch.split(input.detach(), _splits(input_split_sizes, input, size)))
        outs = list(torch.split(output.detach(), _splits(output_split_sizes, output, size)))
        return self._issue(lambda c: c.all_to_all(ins, timeout=timeout), lambda rows: _rows_into(outs, rows, [output]))

    _alltoall_base = all_to_all_single

    # -- point to point and barrier -----------------------------------------------------
    def send(self, tensors: Tensors, dstRank: int, tag: int) -> Any:
        t = _one(tensors, "send")
        return self._issue(lambda c: c.send(t, dstRank, tag), lambda _: tensors)

    def recv(self, tensors: Tensors, srcRank: int, tag: int) -> Any:
        t = _one(tensors, "recv")
        return self._issue(lambda c: c.recv(srcRank, tag), lambda r: _into(t, r, tensors))

    def recv_anysource(self, tensors: Tensors, tag: int) -> Any:
        raise RuntimeError("netcoll: recv from any source is not supported; pass src=")

    def barrier(self, opts: Any) -> dist.Work:  # type: ignore[override]
        timeout = _timeout(opts)
        return self._issue(lambda c: c.barrier(timeout=timeout), lambda _: [])


def _splits(sizes: list[int], t: torch.Tensor, world_size: int) -> list[int]:
    """Split sizes along dim 0 (an empty list: equal parts, as torch means it)."""
    n = t.shape[0] if t.dim() else 1
    if not sizes:
        if n % world_size:
            raise ValueError(f"netcoll all_to_all_single: {n} rows do not split evenly over {world_size} ranks")
        return [n // world_size] * world_size
    if len(sizes) != world_size or sum(sizes) != n or min(sizes) < 0:
        raise ValueError(
            f"netcoll all_to_all_single: split sizes {list(sizes)} must be world_size={world_size} "
            f"non-negative counts adding up to the tensor's {n} rows"
        )
    return [int(s) for s in sizes]
