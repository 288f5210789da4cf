"""Run one job's collective on a rank: warm-up, timed iterations, progress.

Kept apart from the daemon so it can be tested over the in-memory transport.
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

import numpy as np

from ..comm import Communicator
from .jobs import JobSpec

Progress = Callable[[int, int], Awaitable[None]]


async def call(comm: Communicator, spec: JobSpec, x: np.ndarray | None, out: np.ndarray | None = None) -> Any:
    """One call of the job's collective with this rank's input ``x``; ``out``
    (optional): the result buffer of an earlier call, reused."""
    op, root, algo = spec.op, spec.root, spec.algorithm
    if op in ("broadcast", "scatter", "reduce", "gather") and root >= comm.world_size:
        raise ValueError(f"root {root} is out of range for {comm.world_size} ranks")
    if op == "all_reduce":
        return await comm.all_reduce(x, op=spec.reduce_op, out=out, algorithm=algo)
    if op == "broadcast":
        return await comm.broadcast(x if comm.rank == root else out, root=root, algorithm=algo)
    if op == "reduce":
        return await comm.reduce(x, op=spec.reduce_op, root=root, out=out, algorithm=algo)
    if op == "all_gather":
        return await comm.all_gather(x, out=out, algorithm=algo)
    if op == "gather":
        return await comm.gather(x, root=root, out=out, algorithm=algo)
    if op == "scatter":
        return await comm.scatter(x if comm.rank == root else None, root=root, out=out, algorithm=algo)
    if op == "reduce_scatter":
        return await comm.reduce_scatter(x, op=spec.reduce_op, out=out, algorithm=algo)
    if op == "all_to_all":
        return await comm.all_to_all(x, out=out, algorithm=algo)
    if op == "barrier":
        return await comm.barrier(algorithm=algo)
    if op in ("put", "get", "delete"):
        return x
    raise ValueError(f"unknown collective {op!r}")


def moved_bytes(spec: JobSpec, x: np.ndarray | None, y: Any, world: int) -> int:
    """The nccl-tests "size" of one iteration: output bytes for all_gather/gather,
    the (whole) input otherwise."""
    if spec.op in ("all_gather", "gather") and isinstance(y, np.ndarray):
        return int(y.nbytes)
    if spec.op in ("all_gather", "gather") and x is not None:
        return int(x.nbytes) * world
    if x is not None:
        return int(x.nbytes)
    return int(y.nbytes) if isinstance(y, np.ndarray) else 0


async def run_collective(comm: Communicator, spec: JobSpec, x: np.ndarray | None,
                         progress: Progress | None = None) -> tuple[Any, list[float], int]:
    """Run the job: ``warmup`` untimed calls, then ``iters`` timed ones.

    Returns:
        (the last call's result, per-iteration seconds, bytes moved per iteration).
    """
    if spec.op in ("put", "get", "delete"):
        return x, [], 0 if x is None else int(x.nbytes)
    y: Any = None
    timings = []
    for i in range(-spec.warmup, spec.iters):
        # After the first call, results go into its result array, as an application
        # reusing its buffers would (no allocation, no page faults in the loop). A
        # broadcast root's result is its input: that one is not reused. (scatter
        # wants out= on every rank or none: every rank has a result after call one.)
        out = y if isinstance(y, np.ndarray) and y is not x else None
        t0 = time.perf_counter()
        y = await call(comm, spec, x, out)
        if i < 0:
            continue
        timings.append(time.perf_counter() - t0)
        if progress is not None:
            await progress(i + 1, spec.iters)
    return y, timings, moved_bytes(spec, x, y, comm.world_size)
