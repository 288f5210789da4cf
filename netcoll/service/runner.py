"""Run one job's collective on a rank: warm-up, timed iterations, progress.

Kept apart from the daemon so it can be tested over the in-process mesh.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import numpy as np

from ..comm import Communicator
from ..ranks import check_root
from .jobs import JobSpec

Progress = Callable[[int, int], Awaitable[None]]
#: how often a rank reports its progress in a job (when it has changed)
PROGRESS_INTERVAL = 0.5
MIN_CALL_TIMEOUT = 0.001  # a call made at (or past) the job's deadline still gets a positive one


def bytes_sent(comm: Communicator) -> int:
    """Payload bytes this rank has sent to all its peers (over the links' lifetime)."""
    return sum(int(s.get("bytes_sent", 0)) for s in comm.link_stats().values())


class ProgressReporter:
    """A rank's progress in one job, sent every ``interval`` seconds while it changes:
    timed iterations done (``step`` is :func:`run_collective`'s callback) and payload
    bytes sent since the job began (so a long single iteration shows progress too).
    Sending runs in a task of its own: a slow report never holds up an iteration.

    ``async with ProgressReporter(send, comm, iters) as p: await run_collective(..., p.step)``
    """

    def __init__(
        self,
        send: Callable[[dict[str, int]], Awaitable[None]],
        comm: Communicator,
        iters: int,
        interval: float | None = None,
    ) -> None:
        self.send, self.comm = send, comm
        self.interval = PROGRESS_INTERVAL if interval is None else interval  # (read at each job)
        self.iteration, self.of = 0, iters
        self.base = bytes_sent(comm)
        self.task: asyncio.Task[None] | None = None

    async def step(self, iteration: int, of: int) -> None:
        self.iteration, self.of = iteration, of

    def state(self) -> dict[str, int]:
        return {"iteration": self.iteration, "of": self.of, "bytes_sent": bytes_sent(self.comm) - self.base}

    async def _loop(self) -> None:
        last: dict[str, int] | None = None
        while True:
            await asyncio.sleep(self.interval)
            state = self.state()
            if state != last:
                await self.send(state)
                last = state

    async def __aenter__(self) -> ProgressReporter:
        self.task = asyncio.create_task(self._loop(), name="netcoll-job-progress")
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def call(
    comm: Communicator,
    spec: JobSpec,
    x: np.ndarray | None,
    out: np.ndarray | None = None,
    timeout: float | None = None,
) -> Any:
    """One call of the job's collective with this rank's input ``x``; ``out``
    (optional): the result buffer of an earlier call, reused; ``timeout``: the
    call's own (None: the communicator's). Buffer jobs (put / get / delete) return ``x``."""
    coll = spec.collective
    if coll is None:
        return x
    if coll.takes_root:
        check_root(spec.root, comm.world_size)
    return await coll.call(
        comm,
        x,
        op=spec.reduce_op,
        root=spec.root,
        out=out,
        algorithm=spec.algorithm,
        timeout=timeout,
        compression=spec.compression,
    )


def moved_bytes(spec: JobSpec, x: np.ndarray | None, y: Any, world: int) -> int:
    """The nccl-tests "size" of one iteration (:meth:`Collective.nbytes`): the larger
    of the send and the receive buffer, from whichever of the two this rank holds."""
    y = y if isinstance(y, np.ndarray) else None
    coll = spec.collective
    if coll is None or not coll.blocked:
        return int(x.nbytes) if x is not None else (0 if y is None else int(y.nbytes))
    if x is not None:
        block = x.nbytes // world if coll.input_blocks else x.nbytes
    elif y is not None:
        block = y.nbytes // world if coll.output_blocks else y.nbytes
    else:
        return 0
    return int(block) * world


async def run_collective(
    comm: Communicator,
    spec: JobSpec,
    x: np.ndarray | None,
    progress: Progress | None = None,
    end: float | None = None,
) -> tuple[Any, list[float], int]:
    """Run the job: ``warmup`` untimed calls, then ``iters`` timed ones; ``end`` (loop
    time): the job's deadline, each call's own (so a call still waiting then times out
    as a collective does, naming what it waits for, rather than being cancelled).

    Returns:
        (the last call's result, per-iteration seconds, bytes moved per iteration).
    """
    if spec.collective is None:  # put / get / delete: nothing to run
        return x, [], 0 if x is None else int(x.nbytes)
    y: Any = None
    timings = []
    for i in range(-spec.warmup, spec.iters):
        # After the first call, results go into its result array, as an application
        # reusing its buffers would (no allocation, no page faults in the loop). A
        # broadcast root's result is its input: that one is not reused. (scatter
        # wants out= on every rank or none: every rank has a result after call one.)
        out = y if isinstance(y, np.ndarray) and y is not x else None
        timeout = None if end is None else max(end - asyncio.get_running_loop().time(), MIN_CALL_TIMEOUT)
        t0 = time.perf_counter()
        y = await call(comm, spec, x, out, timeout)
        if i < 0:
            continue
        timings.append(time.perf_counter() - t0)
        if progress is not None:
            await progress(i + 1, spec.iters)
    return y, timings, moved_bytes(spec, x, y, comm.world_size)
