"""The per-rank benchmark loop (nccl-tests style), run by every rank of a group.

For each collective and size: build this rank's deterministic input, run
``warmup`` untimed calls, a barrier, then ``iters`` timed calls back to back.
Each rank's time is its mean per call; the reported time is the **maximum over
ranks** of those means (rank 0 gathers them with ``comm.gather``). The output
of the last timed call is then checked against a numpy reference and the
wrong elements of all ranks are added up (``#wrong``, as in nccl-tests).

Only out-of-place calls are measured: the input array is never the output.
Results go to preallocated buffers, like nccl-tests' separate receive buffer
(and the peers' benchmarks): ``out=`` for all_reduce, reduce, all_gather,
gather, scatter, reduce_scatter and all_to_all, a receive buffer for
broadcast's non-roots. Verification runs one more, untimed call into
buffers first filled with ``0xA5`` bytes, so a call that wrote nothing cannot
pass on an earlier call's result.

Data, dispatch and verification are the registry's
(:meth:`netcoll.collectives.Collective.make_input`, ``call``, ``count_wrong``)
over :class:`netcoll.testdata.TestData` — the same the job service uses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import resource
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from ..testdata import TestData
from .common import Geometry, SweepConfig, geometry, make_row

Event = Callable[[dict[str, Any]], None]


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (``ru_maxrss``; KiB on Linux)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if os.uname().sysname == "Darwin" else int(rss) * 1024


def _call(
    comm: Any, g: Geometry, cfg: SweepConfig, x: np.ndarray | None, out: np.ndarray | None
) -> Callable[[], Awaitable[Any]]:
    """A zero-argument function making one call of the collective (the registry's dispatch)."""
    coll = g.collective
    algorithm, root, redop, timeout = cfg.algorithm_for(g.op), cfg.root, cfg.redop, cfg.timeout
    codec = cfg.compression_for(g.op)
    return lambda: coll.call(
        comm, x, op=redop, root=root, out=out, algorithm=algorithm, timeout=timeout, compression=codec
    )


def _out_buffer(g: Geometry, rank: int, root: int) -> np.ndarray | None:
    """The preallocated result buffer of one rank (None where it gets no result, and at
    a broadcast root, whose result is its input)."""
    coll = g.collective
    if not coll.receives(rank, root) or (coll.root_result_is_input and rank == root):
        return None
    return np.empty(g.output_shape, dtype=g.dtype)


def _algorithm(cfg: SweepConfig, g: Geometry, comm: Any) -> str:
    """The algorithm run: the forced one, or what ``auto`` picked (``auto:ring``),
    as the communicator's model stats say."""
    algo = cfg.algorithm_for(g.op)
    if algo != "auto":
        return algo
    chosen = _chosen(comm, g.op)
    return "auto" if chosen is None else f"auto:{chosen['algorithm']}"


def _chosen(comm: Any, op: str) -> dict[str, Any] | None:
    """This rank's last choice for ``op`` from the communicator's model stats (None: none)."""
    stats = getattr(comm, "model_stats", None)
    return None if stats is None else stats["choices"].get(op)


def _choice(comm: Any, op: str) -> tuple[int, float]:
    """This rank's last choice for ``op``: (segment_bytes, predicted seconds; NaN if none)."""
    chosen = _chosen(comm, op)
    if chosen is None:
        return 0, float("nan")
    predicted = chosen["predicted_s"]
    return int(chosen["segment_bytes"]), float("nan") if predicted is None else float(predicted)


@dataclasses.dataclass
class _Measured:
    """One rank's numbers for one step."""

    total: float  #: seconds for all timed calls
    durations: np.ndarray  #: seconds per timed call
    wrong: int


async def _measure(comm: Any, g: Geometry, cfg: SweepConfig, data: TestData) -> _Measured:
    """Warm up, time ``iters`` calls, then verify one more call into poisoned buffers."""
    rank, coll = comm.rank, g.collective
    x = coll.make_input(data, g.block, rank, cfg.root)
    out = _out_buffer(g, rank, cfg.root)
    call = _call(comm, g, cfg, x, out)
    for _ in range(cfg.warmup):
        await call()
    await comm.barrier()
    durations = np.empty(cfg.iters)
    clock = time.perf_counter
    t0 = clock()
    for i in range(cfg.iters):
        ts = clock()
        await call()
        durations[i] = clock() - ts
    total = clock() - t0
    wrong = 0
    if cfg.check:  # one more call (on every rank) into poisoned buffers
        if out is not None:
            out.reshape(-1).view(np.uint8).fill(0xA5)
        codec = cfg.compression_for(g.op)
        wrong = coll.count_wrong(data, g.block, rank, cfg.root, await call(), codec)
    data.forget()
    return _Measured(total, durations, wrong)


async def _report(
    comm: Any, g: Geometry, cfg: SweepConfig, m: _Measured, requested: int, baseline: int
) -> dict[str, Any] | None:
    """Gather every rank's numbers at rank 0; return the row there (None elsewhere)."""
    peak = peak_rss_bytes()
    mine = np.array(
        [
            m.total / cfg.iters,
            statistics.median(m.durations.tolist()),
            float(m.durations.min()),
            float(m.wrong),
            float(peak),
            float(peak - baseline),
            float(baseline),
            *map(float, _choice(comm, g.op)),
        ],
        dtype=np.float64,
    )
    table = await comm.gather(mine, root=0)
    if comm.rank != 0:
        return None
    assert table is not None
    return make_row(
        g,
        redop=cfg.redop,
        root=cfg.root,
        seconds=float(table[:, 0].max()),
        median_seconds=float(table[:, 1].max()),
        min_seconds=float(table[:, 2].max()),
        wrong=int(table[:, 3].sum()) if cfg.check else None,
        requested=requested,
        iters=cfg.iters,
        warmup=cfg.warmup,
        algorithm=_algorithm(cfg, g, comm),
        compression=cfg.compression_for(g.op),
        segment_bytes=int(table[0, 7]),
        predicted_us=None if np.isnan(table[0, 8]) else float(table[0, 8]) * 1e6,
        peak_rss_bytes=int(table[:, 4].max()),
        rss_growth_bytes=int(table[:, 5].max()),
        baseline_rss_bytes=int(table[:, 6].max()),
        rank_time_us=[float(t) * 1e6 for t in table[:, 0]],
    )


async def _announce_ranks(comm: Any, emit: Event) -> None:
    """Rank 0 learns every rank's pid (for the table's preamble)."""
    pids = await comm.gather(np.array([os.getpid()], dtype=np.int64), root=0)
    if pids is not None:
        emit(
            {
                "event": "ranks",
                "ranks": [{"rank": r, "pid": int(p[0]), "host": os.uname().nodename} for r, p in enumerate(pids)],
            }
        )


async def run_sweep(comm: Any, cfg: SweepConfig, *, on_event: Event | None = None) -> list[dict[str, Any]]:
    """Run the sweep on this rank. Every rank of ``comm`` must call it with the
    same ``cfg``. Returns the rows on rank 0 (``[]`` elsewhere); ``on_event``
    gets ``{"event": "start", op, size}`` before and ``{"event": "row", ...}``
    after each step, on rank 0."""
    n, rank = comm.world_size, comm.rank
    if cfg.root >= n:
        raise ValueError(f"-r/--root {cfg.root} is not a rank of a {n}-rank group")
    data = TestData(cfg.redop, cfg.np_dtype, n)
    emit: Event = on_event if (on_event is not None and rank == 0) else (lambda e: None)
    rows: list[dict[str, Any]] = []
    await _announce_ranks(comm, emit)
    await comm.barrier()
    baseline = peak_rss_bytes()
    for op, requested in cfg.steps():
        g = geometry(op, requested, data.dtype, n)
        emit({"event": "start", "op": op, "size": g.size, "requested": requested})
        if cfg.alternate:
            got = await _alternate(comm, g, cfg, data, requested, baseline)
        else:
            measured = await _measure(comm, g, cfg, data)
            got = [await _report(comm, g, cfg, measured, requested, baseline)]
        for row in got:
            if row is not None:
                rows.append(row)
                emit({"event": "row", "row": row})
        await asyncio.sleep(0)
    return rows


async def _alternate(
    comm: Any, g: Geometry, cfg: SweepConfig, data: TestData, requested: int, baseline: int
) -> list[dict[str, Any] | None]:
    """One size, every algorithm of ``cfg.alternate`` the collective has, in turn: a block of
    ``iters`` calls of each (warmed up before its first), ``rounds`` times, in reverse order
    every other round, so that the machine's drift falls on all of them alike. A row per
    algorithm over all its calls, reported right after its last block (``auto``'s choice
    is then still the communicator's last one); the last block is the one verified."""
    names = [a for a in cfg.alternate if a in g.collective.algorithms]
    blocks: dict[str, list[_Measured]] = {name: [] for name in names}
    rows: list[dict[str, Any] | None] = []
    last = cfg.rounds - 1
    for r in range(cfg.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            one = dataclasses.replace(
                cfg, algorithm=name, warmup=cfg.warmup if r == 0 else 0, check=cfg.check and r == last
            )
            blocks[name].append(await _measure(comm, g, one, data))
            if r == last:
                merged = _Measured(
                    sum(b.total for b in blocks[name]),
                    np.concatenate([b.durations for b in blocks[name]]),
                    sum(b.wrong for b in blocks[name]),
                )
                whole = dataclasses.replace(cfg, algorithm=name, iters=cfg.iters * cfg.rounds)
                rows.append(await _report(comm, g, whole, merged, requested, baseline))
    return rows
