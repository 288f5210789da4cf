"""A DDP communication hook that averages gradient buckets with netcoll's compressed
all_reduce, optionally with error feedback.

::

    model = DistributedDataParallel(model)
    model.register_comm_hook(*netcoll.torch.compression_hook("int8", error_feedback=True))

Each bucket crosses the wire encoded by the codec (:mod:`netcoll.compression`: ``"fp16"``,
``"bf16"``, ``"int8"``; ``"none"`` is the plain all_reduce) and is averaged over the ranks
in the bucket's dtype; the averaged gradient is bit-identical on every rank (the codec's
guarantee), so the replicas stay identical. Unlike torch's ``fp16_compress_hook``, which
all-reduces a float16 tensor (and sums in float16), the sums here are in float32.

With ``error_feedback=True`` (:class:`netcoll.feedback.ErrorFeedback`) each rank adds to a
bucket what the codec dropped of that bucket's previous contribution before sending it:
nothing is lost for good, so compressed training follows uncompressed training closely.
Cost: one residual per bucket, the gradients' size once more in their dtype (a 10 M
parameter float32 model keeps 40 MB more per rank). CPU: one pass over each bucket per
step (add the residual, round-trip through the codec, subtract), in cache-sized chunks,
in place in the bucket's buffer (:meth:`CompressionState.compensated`), which the
compressed all_reduce then averages in place (it reads each piece of its input before it
writes that piece's result): nothing is copied; for float32 with fp16 or bf16 that loop
runs on torch's kernels, the codec's own casts (:mod:`netcoll.feedback`).
Residuals are kept by bucket index and start from zero when a bucket's size changes (DDP
rebuilds its buckets after the first step).

The hook returns its future at once: the collective runs on netcoll's loop thread while
autograd goes on with the backward pass, as with Gloo.

Follows torch's hook conventions (``hook(state, bucket) -> Future[Tensor]``, the state an
object of its own as PowerSGD's): register it on a DDP model whose process group is a
netcoll one (``init_process_group("netcoll")`` or ``new_group`` under it).
"""

# no `from __future__ import annotations`: DDP's register_comm_hook compares the hook's annotations
# with dist.GradBucket and torch.futures.Future[torch.Tensor] as objects
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # what torch.distributed re-exports (its stub does not)

from ..compression import Compression, parse_compression
from ..feedback import ErrorFeedback
from ..tensors import to_numpy
from .backend import ProcessGroupNetcoll

__all__ = ["CompressionState", "compressed_allreduce_hook", "compression_hook"]

Hook = Callable[[Any, GradBucket], torch.futures.Future[torch.Tensor]]


class CompressionState:
    """What :func:`compressed_allreduce_hook` needs: the process group (``None``: the
    default one), the codec, and the error feedback's residuals (when asked for)."""

    def __init__(self, process_group: Any = None, compression: str = "fp16", *, error_feedback: bool = True) -> None:
        self.process_group = process_group
        self.compression = cast(Compression, parse_compression(compression))
        self.error_feedback = error_feedback
        self.feedback: ErrorFeedback | None = None  # made at the first bucket (rank and size of the group)

    def group(self) -> ProcessGroupNetcoll:
        """The netcoll process group the hook all-reduces on."""
        pg = self.process_group if self.process_group is not None else dist.group.WORLD
        if not isinstance(pg, ProcessGroupNetcoll):
            raise TypeError(
                f"netcoll's compression hook needs a netcoll process group (init_process_group('netcoll')), not {pg!r}"
            )
        return pg

    def compensated(self, pg: ProcessGroupNetcoll, bucket: GradBucket) -> torch.Tensor:
        """``bucket``'s buffer, ready for the hook's all_reduce: with error feedback, its
        residual added in place (in the same pass that finds the new residual); without,
        as it is. The all_reduce then runs in place on it (the compressed all_reduce reads
        each piece of its input before it writes that piece's average): nothing is copied."""
        feedback = self._feedback(pg, bucket)
        buffer = bucket.buffer()
        if feedback is not None:
            flat = to_numpy(buffer, "bucket")
            feedback.compensate(bucket.index(), flat, out=flat)
        return buffer

    def _feedback(self, pg: ProcessGroupNetcoll, bucket: GradBucket) -> ErrorFeedback | None:
        """The error feedback (made at the first bucket), ``None`` when not asked for; at
        the last bucket, forgets what belonged to buckets past it (DDP rebuilt them)."""
        if not self.error_feedback or self.compression == "none":
            return None
        if self.feedback is None:
            self.feedback = ErrorFeedback(self.compression, rank=pg.rank(), world_size=pg.size())
        if bucket.is_last():
            for key in self.feedback.held():
                if not isinstance(key, int) or key > bucket.index():
                    self.feedback.discard(key)
        return self.feedback

    @property
    def residual_bytes(self) -> int:
        """Bytes the error feedback's residuals hold (one per bucket)."""
        return 0 if self.feedback is None else self.feedback.nbytes


def compressed_allreduce_hook(state: CompressionState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket`` over the group with netcoll's compressed all_reduce (in place);
    the future's value is the bucket's buffer, as DDP expects."""
    pg = state.group()
    work = pg.allreduce_compressed(state.compensated(pg, bucket), state.compression, dist.ReduceOp.AVG)

    def averaged(fut: torch.futures.Future[Any]) -> torch.Tensor:
        value: torch.Tensor = fut.value()[0]
        return value

    return work.get_future().then(averaged)


def compression_hook(
    compression: str = "fp16", *, error_feedback: bool = True, process_group: Any = None
) -> tuple[CompressionState, Hook]:
    """``(state, hook)`` for ``model.register_comm_hook(state, hook)``: gradient buckets
    averaged with ``compression`` (see the module docstring)."""
    return CompressionState(process_group, compression, error_feedback=error_feedback), compressed_allreduce_hook
