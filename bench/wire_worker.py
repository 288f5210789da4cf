"""One rank of ``bench/wire.py``, run in its rank's network namespace: torch.distributed
with the ``netcoll`` backend as the default group (netcoll's session, whose communicator
also runs the plain netcoll calls) and a Gloo group over the same ranks
(``new_group(backend="gloo")``: its own TCP connections between the same addresses).

For each case (Gloo, or netcoll with a codec and an algorithm) it times one 64 MiB float32
all_reduce per repetition, the cases interleaved (their order rotated every repetition),
each call between two barriers; with ``--ddp`` it then times DDP training steps of
``bench/ddp.py``'s MLP on Gloo and on netcoll (with each codec, and a comm hook if named),
interleaved likewise, every backend's DDP with the same settings (``bench.ddp.DDP_OPTIONS``).
It prints one JSON line per measurement (``{"case", "rep", "seconds",
...}``); the parent takes the slowest rank's time of each.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np

#: the relative error (largest over the largest reference value) a codec's result is checked against
TOLERANCE = {"none": 1e-6, "fp16": 2e-3, "bf16": 2e-2, "int8": 3e-2}


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.wire_worker", allow_abbrev=False)
    p.add_argument("--cases", required=True, help="JSON list of {label, impl, compression, algorithm}")
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--ddp", default="", help="JSON list of DDP cases {label, impl, compression, hook}; empty: none")
    p.add_argument("--ddp-width", type=int, default=1536)
    p.add_argument("--ddp-batch", type=int, default=32)
    p.add_argument("--ddp-steps", type=int, default=6)
    p.add_argument("--ddp-warmup", type=int, default=2)
    return p.parse_args(argv)


def _data(n: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's input ((rank + 1) times one shared random array) and the sum's reference."""
    base = np.random.default_rng(36).standard_normal(n).astype(np.float32)
    world = int(os.environ["WORLD_SIZE"])
    return base * np.float32(rank + 1), base.astype(np.float64) * (world * (world + 1) // 2)


def all_reduce_cases(args: argparse.Namespace, comm: Any, gloo: Any) -> None:
    """Every case ``--warmup`` times, then ``--reps`` interleaved repetitions."""
    import torch
    import torch.distributed as dist

    cases = json.loads(args.cases)
    rank = dist.get_rank()
    x, ref = _data(args.size // 4, rank)
    t = torch.from_numpy(x.copy())
    out = np.empty_like(x)
    scale = float(np.abs(ref).max())

    def call(case: dict[str, Any]) -> tuple[float, float]:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        seconds, got = one(case)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        # every rank done before any checks its result: a rank that finished early would
        # otherwise compute the error (two 128 MB float64 temporaries) on a core the slowest
        # rank, whose time is the case's, still needs
        if case["impl"] == "gloo":
            dist.barrier(group=gloo)
        else:
            comm.barrier()
        err = float(np.abs(got - ref).max()) / scale
        case["err"] = max(case.get("err", 0.0), err)
        return seconds, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime

    def one(case: dict[str, Any]) -> tuple[float, np.ndarray]:
        if case["impl"] == "gloo":
            t.copy_(torch.from_numpy(x))
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            dist.all_reduce(t, group=gloo)
            seconds = time.perf_counter() - t0
            got = t.numpy()
        else:
            comm.barrier()
            t0 = time.perf_counter()
            comm.all_reduce(x, out=out, compression=case["compression"], algorithm=case["algorithm"])
            seconds = time.perf_counter() - t0
            got = out
        return seconds, got

    for case in cases:
        for _ in range(args.warmup):
            call(case)
    for rep in range(args.reps):
        k = rep % len(cases)
        for case in cases[k:] + cases[:k]:
            seconds, cpu = call(case)
            ok = case["err"] <= TOLERANCE.get(case.get("compression") or "none", 1e-6)
            emit(kind="all_reduce", case=case["label"], rep=rep, seconds=seconds, cpu=cpu, err=case["err"], right=ok)


def _hook(spec: str | None, codec: str) -> Callable[[Any, Any], None] | None:
    """``feedback``: ``netcoll.torch.compression_hook(codec, error_feedback=True)`` registered
    on the DDP model (branch ``feedback``); ``module:name``: called with the DDP model and its
    process group, registers a comm hook itself."""
    if not spec:
        return None
    if spec == "feedback":

        def register(net: Any, _group: Any) -> None:
            import netcoll.torch

            hook = getattr(netcoll.torch, "compression_hook")  # noqa: B009 - branch feedback's, not here yet
            net.register_comm_hook(*hook(codec, error_feedback=True))

        return register
    module, _, name = spec.partition(":")
    fn: Callable[[Any, Any], None] = getattr(importlib.import_module(module), name)
    return fn


def ddp_cases(args: argparse.Namespace, gloo: Any) -> None:
    """Per repetition, every DDP case trains ``--ddp-steps`` steps (the first ``--ddp-warmup`` not counted)
    from the same initial parameters; one line per counted step."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from bench.ddp import DDP_OPTIONS, make_model

    cases = json.loads(args.ddp)
    rank, w = dist.get_rank(), args.ddp_width
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(args.ddp_batch, w, generator=g), torch.randn(args.ddp_batch, w // 2, generator=g)
    params = sum(p.numel() for p in make_model(w).parameters())
    for rep in range(args.reps):
        k = rep % len(cases)
        for case in cases[k:] + cases[:k]:
            os.environ["NETCOLL_COMPRESSION"] = case.get("compression") or "none"
            group = gloo if case["impl"] == "gloo" else None
            net = DistributedDataParallel(make_model(w), process_group=group, **DDP_OPTIONS)  # the same for all
            hook = _hook(case.get("hook"), case.get("codec") or "fp16")
            if hook is not None:
                hook(net, None)
            opt = torch.optim.SGD(net.parameters(), lr=1e-3)
            for step in range(args.ddp_steps):
                dist.barrier(group=gloo)
                r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                opt.zero_grad()
                torch.nn.functional.mse_loss(net(x), y).backward()  # type: ignore[no-untyped-call]
                opt.step()
                seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
                cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime  # every thread of this rank
                if step >= args.ddp_warmup:
                    emit(kind="ddp", case=case["label"], rep=rep, step=step, seconds=seconds, cpu=cpu, params=params)
            del net, opt
    os.environ["NETCOLL_COMPRESSION"] = "none"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch
    import torch.distributed as dist

    import netcoll.torch

    torch.set_num_threads(1)
    dist.init_process_group("netcoll")  # RANK, WORLD_SIZE, MASTER_*, NETCOLL_* from bench/wire.py
    gloo = dist.new_group(backend="gloo")
    session = netcoll.torch.world()
    assert session is not None
    comm = session
    emit(kind="hello", rank=dist.get_rank(), links=sorted({str(s["kind"]) for s in comm.link_stats().values()}))
    all_reduce_cases(args, comm, gloo)
    if args.ddp:
        ddp_cases(args, gloo)
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
