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

Data: rank ``k``'s input element ``i`` is ``T[(i + 7919 k) mod 65521]`` for a
fixed pseudo-random table ``T`` of small integers (values chosen per op and
dtype so sums, products, min/max and bitwise ops stay exact in every dtype,
bfloat16 included). Because every buffer is periodic, inputs and the expected
outputs are made from one period, in chunks: verification costs a compare per
element and a few MiB of memory, never a second full-size array per rank.
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import numpy as np

from ..ops import reduce_reference
from .common import Geometry, SweepConfig, geometry, make_row

PERIOD: Final = 65521  # prime, so no power-of-two segment or block size is a multiple of it
RANK_SHIFT: Final = 7919  # rank k's data is the table rotated by k * RANK_SHIFT
CHUNK: Final = 4 * PERIOD  # elements per fill / compare step

_TABLE = np.random.default_rng(20240604).integers(-8, 9, size=PERIOD, dtype=np.int64)


def _values(redop: str, dt: np.dtype) -> np.ndarray:
    """The table as exact values of ``dt`` that keep ``redop`` exact over many ranks."""
    t = _TABLE
    if dt.kind == "b":
        return (t % 2).astype(bool)
    if redop == "prod":  # products of {-1, 1, 2} (unsigned: {1, 2}) stay small
        pick = np.array([1, 2, 1] if dt.kind == "u" else [-1, 1, 2], dtype=np.int64)
        return pick[t % 3].astype(dt)
    if dt.kind == "u":
        return (t + 8).astype(dt)
    return t.astype(np.float32).astype(dt) if dt.kind not in "iuc" else t.astype(dt)


class Pattern:
    """A periodic flat buffer with period ``len(base)``: element ``i`` is ``base[i % P]``."""

    def __init__(self, base: np.ndarray) -> None:
        self.period = len(base)
        self.ext = np.tile(base, CHUNK // self.period + 2)  # any window of CHUNK from any phase

    def window(self, start: int, m: int) -> np.ndarray:
        off = start % self.period
        return self.ext[off:off + m]

    def fill(self, out: np.ndarray, start: int = 0) -> None:
        """``out[i] = pattern[start + i]`` (``out`` is flat)."""
        for s in range(0, len(out), CHUNK):
            m = min(CHUNK, len(out) - s)
            out[s:s + m] = self.window(start + s, m)

    def count_wrong(self, got: np.ndarray, start: int = 0) -> int:
        """Elements of flat ``got`` that differ from ``pattern[start:]``."""
        wrong = 0
        for s in range(0, len(got), CHUNK):
            m = min(CHUNK, len(got) - s)
            wrong += int(np.count_nonzero(got[s:s + m] != self.window(start + s, m)))
        return wrong


class Data:
    """Every rank's inputs and the expected outputs, for one (redop, dtype, P)."""

    def __init__(self, redop: str, dt: np.dtype, world_size: int) -> None:
        self.redop, self.dt, self.n = redop, dt, world_size
        self._values = _values(redop, dt)
        self._patterns: dict[Any, Pattern] = {}

    def base(self, rank: int) -> np.ndarray:
        return np.roll(self._values, -(rank * RANK_SHIFT) % PERIOD)

    def rank(self, rank: int) -> Pattern:
        key = ("rank", rank)
        if key not in self._patterns:
            self._patterns[key] = Pattern(self.base(rank))
        return self._patterns[key]

    def reduced(self) -> Pattern:
        """The reduction over all ranks (in rank order, then finalized, as the reference)."""
        if "reduced" not in self._patterns:
            self._patterns["reduced"] = Pattern(
                reduce_reference(self.redop, [self.base(k) for k in range(self.n)]))
        return self._patterns["reduced"]

    def forget(self) -> None:
        """Drop the cached per-rank patterns (they are rebuilt on demand)."""
        self._patterns.clear()

    def input(self, g: Geometry, rank: int) -> np.ndarray:
        x = np.empty(g.input_shape, dtype=self.dt)
        self.rank(rank).fill(x.reshape(-1))
        return x

    def count_wrong(self, g: Geometry, rank: int, root: int, y: Any) -> int:
        """Wrong elements in this rank's output ``y`` (0 where nothing is expected)."""
        op, b = g.op, g.block
        if op in ("reduce", "gather") and rank != root:
            return 0 if y is None else max(1, int(np.size(y)))
        if y is None:
            return max(1, g.size // self.dt.itemsize)
        y = np.asarray(y)
        expected_shape = {"all_gather": (self.n, b), "gather": (self.n, b), "reduce_scatter": (b,),
                          "all_to_all": (self.n, b), "scatter": (b,)}.get(op, (g.count,))
        if y.shape != expected_shape or y.dtype != self.dt:
            return max(1, int(np.prod(expected_shape)))
        flat = y.reshape(-1)
        if op in ("all_reduce", "reduce"):
            return self.reduced().count_wrong(flat)
        if op == "broadcast":
            return self.rank(root).count_wrong(flat)
        if op in ("all_gather", "gather"):
            return sum(self.rank(k).count_wrong(flat[k * b:(k + 1) * b]) for k in range(self.n))
        if op == "scatter":
            return self.rank(root).count_wrong(flat, rank * b)
        if op == "reduce_scatter":
            return self.reduced().count_wrong(flat, rank * b)
        if op == "all_to_all":  # y[j] = rank j's x[rank]
            return sum(self.rank(j).count_wrong(flat[j * b:(j + 1) * b], rank * b) for j in range(self.n))
        raise ValueError(f"unknown collective {op!r}")


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (``ru_maxrss``; KiB on Linux)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if os.uname().sysname == "Darwin" else int(rss) * 1024


def _call(comm: Any, g: Geometry, cfg: SweepConfig, x: np.ndarray | None,
          out: np.ndarray | None) -> Callable[[], Awaitable[Any]]:
    """A zero-argument coroutine function running one collective call."""
    kw: dict[str, Any] = {"algorithm": cfg.algorithm_for(g.op)}
    if cfg.timeout is not None:
        kw["timeout"] = cfg.timeout
    root, redop, op = cfg.root, cfg.redop, g.op
    if op == "all_reduce":
        return lambda: comm.all_reduce(x, op=redop, out=out, **kw)
    if op == "reduce":
        return lambda: comm.reduce(x, op=redop, root=root, out=out, **kw)
    if op == "reduce_scatter":
        return lambda: comm.reduce_scatter(x, op=redop, out=out, **kw)
    if op == "broadcast":  # non-roots receive into ``out``
        return lambda: comm.broadcast(x if comm.rank == root else out, root=root, **kw)
    if op == "all_gather":
        return lambda: comm.all_gather(x, out=out, **kw)
    if op == "gather":
        return lambda: comm.gather(x, root=root, out=out, **kw)
    if op == "scatter":
        return lambda: comm.scatter(x if comm.rank == root else None, root=root, out=out, **kw)
    if op == "all_to_all":
        return lambda: comm.all_to_all(x, out=out, **kw)
    raise ValueError(f"unknown collective {op!r}")


def _out_buffer(op: str, g: Geometry, n: int, rank: int, root: int, dt: np.dtype) -> np.ndarray | None:
    """The preallocated result buffer of one rank for ``op`` (None: the call allocates)."""
    b = g.block
    shape = {"all_gather": (n, b), "gather": (n, b), "reduce_scatter": (b,), "all_to_all": (n, b), "scatter": (b,),
             "all_reduce": g.input_shape, "reduce": g.input_shape, "broadcast": g.input_shape}.get(op)
    if shape is None or (op in ("reduce", "gather") and rank != root) or (op == "broadcast" and rank == root):
        return None
    return np.empty(shape, dtype=dt)


Event = Callable[[dict[str, Any]], None]


def _algorithm(cfg: SweepConfig, g: Geometry) -> str:
    """The algorithm run: the forced one, or what ``auto`` picks (``auto:ring``)."""
    algo = cfg.algorithm_for(g.op)
    if algo != "auto":
        return algo
    from ..algorithms import choose

    try:  # the size the Communicator passes to choose(): 0 where only the root knows it
        return "auto:" + choose(g.op, 0 if g.op in ("broadcast", "scatter") else g.size, g.world_size)
    except Exception:  # noqa: BLE001 - informational only
        return "auto"


async def run_sweep(comm: Any, cfg: SweepConfig, *, on_event: Event | None = None) -> list[dict[str, Any]]:
    """Run the sweep on this rank. Every rank of ``comm`` must call it with the
    same ``cfg``. Returns the rows on rank 0 (``[]`` elsewhere); ``on_event``
    gets ``{"event": "start", op, size}`` before and ``{"event": "row", ...}``
    after each step, on rank 0."""
    n, rank = comm.world_size, comm.rank
    if cfg.root >= n:
        raise ValueError(f"-r/--root {cfg.root} is not a rank of a {n}-rank group")
    dt = cfg.np_dtype
    data = Data(cfg.redop, dt, n)
    emit = on_event if (on_event is not None and rank == 0) else (lambda e: None)
    rows: list[dict[str, Any]] = []
    pids = await comm.gather(np.array([os.getpid()], dtype=np.int64), root=0)
    if pids is not None:
        emit({"event": "ranks", "ranks": [{"rank": r, "pid": int(p[0]), "host": os.uname().nodename}
                                          for r, p in enumerate(pids)]})
    await comm.barrier()
    baseline = peak_rss_bytes()
    for op, requested in cfg.steps():
        g = geometry(op, requested, dt, n)
        emit({"event": "start", "op": op, "size": g.size, "requested": requested})
        x = None if (op in ("broadcast", "scatter") and rank != cfg.root) else data.input(g, rank)
        out = _out_buffer(op, g, n, rank, cfg.root, dt)
        call = _call(comm, g, cfg, x, out)
        for _ in range(cfg.warmup):
            await call()
        await comm.barrier()
        durations = np.empty(cfg.iters)
        clock = time.perf_counter
        t0 = clock()
        y = None
        for i in range(cfg.iters):
            ts = clock()
            y = await call()
            durations[i] = clock() - ts
        total = clock() - t0
        if cfg.check:  # verify one more call (on every rank) into poisoned buffers
            if out is not None:
                out.reshape(-1).view(np.uint8).fill(0xA5)
            y = await call()
        wrong = data.count_wrong(g, rank, cfg.root, y) if cfg.check else 0
        data.forget()
        del y, x, out
        peak = peak_rss_bytes()
        mine = np.array([total / cfg.iters, statistics.median(durations.tolist()), float(durations.min()),
                         float(wrong), float(peak), float(peak - baseline), float(baseline)], dtype=np.float64)
        table = await comm.gather(mine, root=0)
        if rank == 0:
            assert table is not None
            row = make_row(g, redop=cfg.redop, root=cfg.root, seconds=float(table[:, 0].max()),
                           median_seconds=float(table[:, 1].max()), min_seconds=float(table[:, 2].max()),
                           wrong=int(table[:, 3].sum()) if cfg.check else None,
                           requested=requested, iters=cfg.iters, warmup=cfg.warmup, algorithm=_algorithm(cfg, g),
                           peak_rss_bytes=int(table[:, 4].max()), rss_growth_bytes=int(table[:, 5].max()),
                           baseline_rss_bytes=int(table[:, 6].max()),
                           rank_time_us=[float(t) * 1e6 for t in table[:, 0]])
            rows.append(row)
            emit({"event": "row", "row": row})
        await asyncio.sleep(0)
    return rows
