"""The peers netcoll is compared with, as rank processes: torch.distributed's Gloo
backend (CPU) and MPI (mpi4py on Open MPI: TCP only, or Open MPI's defaults). Started by
``bench/compare.py``; not meant to be run by hand, but it can be:

    python bench/peers.py gloo --rank R --world-size N --init tcp://127.0.0.1:PORT --config JSON
    mpirun -np N --mca pml ob1 --mca btl tcp,self python bench/peers.py mpi --config JSON

``--config`` is one SweepConfig as JSON, or a JSON list of them (the bands of a large world and
the latency run, one launch: 16 ranks importing torch take a while); each row carries
``"band"``, the index of its config in that list.

Each runs the same sweep as ``netcoll bench`` (sizes, geometry and busbw
factors from :mod:`netcoll.bench.common`): ``warmup`` untimed calls, a barrier,
``iters`` timed calls back to back; time = max over ranks of the per-rank mean.
Rank 0 prints one JSON line per row. Results are not verified (these are the
reference implementations). Calls are what a user of each library writes:
Gloo's ``all_reduce``, ``broadcast`` and ``reduce`` work in place on the
tensor (no copy), the others are out-of-place; MPI calls are out-of-place
except ``Bcast``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from netcoll.bench.common import SweepConfig, geometry, make_row


def _emit(ev: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(ev) + "\n")
    sys.stdout.flush()


def _time(call: Callable[[], Any], barrier: Callable[[], Any], cfg: SweepConfig) -> np.ndarray:
    for _ in range(cfg.warmup):
        call()
    barrier()
    d = np.empty(cfg.iters)
    clock = time.perf_counter
    t0 = clock()
    for i in range(cfg.iters):
        ts = clock()
        call()
        d[i] = clock() - ts
    total = clock() - t0
    return np.array([total / cfg.iters, statistics.median(d.tolist()), d.min()], dtype=np.float64)


def _configs(text: str) -> list[SweepConfig]:
    data = json.loads(text)
    return [SweepConfig.from_json(c) for c in (data if isinstance(data, list) else [data])]


def _steps(cfgs: list[SweepConfig]) -> Iterator[tuple[int, SweepConfig, str, int]]:
    for band, cfg in enumerate(cfgs):
        for op, requested in cfg.steps():
            yield band, cfg, op, requested


def _row(g: Any, cfg: SweepConfig, stats: np.ndarray, impl: str, requested: int) -> dict[str, Any]:
    return make_row(
        g,
        redop=cfg.redop,
        root=cfg.root,
        seconds=float(stats[0]),
        median_seconds=float(stats[1]),
        min_seconds=float(stats[2]),
        wrong=None,
        requested=requested,
        impl=impl,
        iters=cfg.iters,
        warmup=cfg.warmup,
    )


def _gloo_call(dist: Any, torch: Any, op: str, g: Any, tdt: Any, rop: Any, rank: int, root: int) -> Callable[[], Any]:
    """One torch.distributed call on preallocated tensors (as a user writes it)."""
    n, c, b = g.world_size, g.count, g.block
    if op == "all_reduce":
        t = torch.ones(c, dtype=tdt)
        return lambda: dist.all_reduce(t, op=rop)
    if op == "broadcast":
        t = torch.ones(c, dtype=tdt)
        return lambda: dist.broadcast(t, src=root)
    if op == "reduce":
        t = torch.ones(c, dtype=tdt)
        return lambda: dist.reduce(t, dst=root, op=rop)
    if op == "all_gather":
        x, y = torch.ones(b, dtype=tdt), torch.empty(n * b, dtype=tdt)
        return lambda: dist.all_gather_into_tensor(y, x)
    if op == "reduce_scatter":
        x, y = torch.ones(n * b, dtype=tdt), torch.empty(b, dtype=tdt)
        return lambda: dist.reduce_scatter_tensor(y, x, op=rop)
    if op == "all_to_all":
        x, y = torch.ones(n * b, dtype=tdt), torch.empty(n * b, dtype=tdt)
        return lambda: dist.all_to_all_single(y, x)
    if op == "gather":
        x = torch.ones(b, dtype=tdt)
        outs = [torch.empty(b, dtype=tdt) for _ in range(n)] if rank == root else None
        return lambda: dist.gather(x, gather_list=outs, dst=root)
    if op == "scatter":
        y = torch.empty(b, dtype=tdt)
        ins = [torch.ones(b, dtype=tdt) for _ in range(n)] if rank == root else None
        return lambda: dist.scatter(y, scatter_list=ins, src=root)
    raise ValueError(op)


def _mpi_call(comm: Any, op: str, g: Any, dt: np.dtype, rop: Any, rank: int, root: int) -> Callable[[], Any]:
    """One mpi4py buffer call on preallocated numpy arrays (out-of-place except Bcast)."""
    n, c, b = g.world_size, g.count, g.block
    if op == "all_reduce":
        x, y = np.ones(c, dt), np.empty(c, dt)
        return lambda: comm.Allreduce(x, y, op=rop)
    if op == "broadcast":
        x = np.ones(c, dt)
        return lambda: comm.Bcast(x, root=root)
    if op == "reduce":
        x, y = np.ones(c, dt), np.empty(c, dt)
        return lambda: comm.Reduce(x, y if rank == root else None, op=rop, root=root)
    if op == "all_gather":
        x, y = np.ones(b, dt), np.empty(n * b, dt)
        return lambda: comm.Allgather(x, y)
    if op == "reduce_scatter":
        x, y = np.ones(n * b, dt), np.empty(b, dt)
        return lambda: comm.Reduce_scatter_block(x, y, op=rop)
    if op == "all_to_all":
        x, y = np.ones(n * b, dt), np.empty(n * b, dt)
        return lambda: comm.Alltoall(x, y)
    if op == "gather":
        x, y = np.ones(b, dt), np.empty(n * b, dt)
        return lambda: comm.Gather(x, y if rank == root else None, root=root)
    if op == "scatter":
        x, y = np.ones(n * b, dt), np.empty(b, dt)
        return lambda: comm.Scatter(x if rank == root else None, y, root=root)
    raise ValueError(op)


def gloo(ns: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    cfgs = _configs(ns.config)
    cfg = cfgs[0]  # dtype, reduction and root are the same in every band
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=ns.init, rank=ns.rank, world_size=ns.world_size)
    n, rank, root = ns.world_size, ns.rank, cfg.root
    dt = cfg.np_dtype
    tdt = getattr(
        torch,
        {
            "float32": "float32",
            "float64": "float64",
            "float16": "float16",
            "bfloat16": "bfloat16",
            "int32": "int32",
            "int64": "int64",
            "int8": "int8",
            "uint8": "uint8",
        }[str(dt)],
    )
    rop = {
        "sum": dist.ReduceOp.SUM,
        "prod": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
        "avg": dist.ReduceOp.AVG,
        "band": dist.ReduceOp.BAND,
        "bor": dist.ReduceOp.BOR,
        "bxor": dist.ReduceOp.BXOR,
    }[cfg.redop]
    _emit({"event": "hello", "rank": rank, "torch": torch.__version__})
    for band, cfg, op, requested in _steps(cfgs):
        g = geometry(op, requested, dt, n)
        if g.size == 0:
            continue
        call = _gloo_call(dist, torch, op, g, tdt, rop, rank, root)
        try:
            call()
            ok = 1.0
            why = ""
        except (RuntimeError, ValueError, NotImplementedError) as exc:  # e.g. not supported by Gloo
            ok, why = 0.0, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        # every rank must agree before timing (an unsupported op fails on all of them)
        flag = torch.tensor([ok], dtype=torch.float64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item() < 1:
            if rank == 0:
                _emit(
                    {
                        "event": "unsupported",
                        "op": op,
                        "size": g.size,
                        "band": band,
                        "reason": why or "failed on a peer",
                    }
                )
            continue
        stats = torch.from_numpy(_time(call, dist.barrier, cfg))
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        if rank == 0:
            _emit({"event": "row", "row": {**_row(g, cfg, stats.numpy(), "gloo", requested), "band": band}})
    dist.barrier()
    dist.destroy_process_group()
    _emit({"event": "done", "rank": rank})


def mpi(ns: argparse.Namespace) -> None:
    from mpi4py import MPI

    cfgs = _configs(ns.config)
    cfg = cfgs[0]
    comm = MPI.COMM_WORLD
    n, rank, root = comm.Get_size(), comm.Get_rank(), cfg.root
    dt = cfg.np_dtype
    if str(dt) == "bfloat16":
        raise SystemExit("MPI has no bfloat16 type")
    rop = {
        "sum": MPI.SUM,
        "prod": MPI.PROD,
        "min": MPI.MIN,
        "max": MPI.MAX,
        "band": MPI.BAND,
        "bor": MPI.BOR,
        "bxor": MPI.BXOR,
    }.get(cfg.redop)
    if rop is None:
        raise SystemExit(f"MPI has no {cfg.redop} reduction")
    if rank == 0:
        _emit(
            {
                "event": "hello",
                "rank": rank,
                "mpi": MPI.Get_library_version().splitlines()[0].strip(),
                "mpi4py": __import__("mpi4py").__version__,
            }
        )
    for band, cfg, op, requested in _steps(cfgs):
        g = geometry(op, requested, dt, n)
        if g.size == 0:
            continue
        call = _mpi_call(comm, op, g, dt, rop, rank, root)
        mine = _time(call, comm.Barrier, cfg)
        worst = np.empty_like(mine)
        comm.Reduce(mine, worst, op=MPI.MAX, root=0)
        if rank == 0:
            _emit({"event": "row", "row": {**_row(g, cfg, worst, "mpi", requested), "band": band}})
    comm.Barrier()
    if rank == 0:
        _emit({"event": "done", "rank": rank})


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("peer", choices=("gloo", "mpi"))
    p.add_argument("--config", required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--init", default=None, help="torch.distributed init_method (gloo)")
    ns = p.parse_args()
    {"gloo": gloo, "mpi": mpi}[ns.peer](ns)


if __name__ == "__main__":
    main()
