"""One rank of the torch backend tests: ``python backend_worker.py SCENARIO``
under ``netcoll run``, which sets torch's RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT and netcoll's NETCOLL_* variables. Each scenario runs every call on the netcoll
backend and on Gloo in the same process (a Gloo group over the same ranks),
asserts the results agree, and prints one JSON line: what it checked."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import netcoll.torch

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
checked: list[str] = []


def data(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Per-rank integer-valued data: every reduction order gives the same bits."""
    g = torch.Generator().manual_seed(1000 * seed + RANK)
    values = torch.randint(-4, 5, shape, generator=g)
    if dtype is torch.bool:
        return values > 0
    if dtype.is_complex:
        return torch.complex(values.float(), values.flip(-1).float()).to(dtype)
    return values.to(dtype)


def same(name: str, a: Any, b: Any) -> None:
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), (name, len(a), len(b))
        for x, y in zip(a, b, strict=True):
            same(name, x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, a.shape, b.dtype, b.shape)
    assert torch.equal(a, b), f"{name}: netcoll {a} != gloo {b}"


def both(name: str, call: Callable[[Any], Any], gloo: Any, group: Any = None) -> None:
    """``call(group)`` on netcoll and on Gloo; its results (the tensors it
    wrote) must be equal."""
    same(name, call(group), call(gloo))
    checked.append(name)


def collectives(gloo: Any) -> None:
    n, me = WORLD, RANK
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.bfloat16, torch.float16):
        for op in ("SUM", "PRODUCT", "MIN", "MAX"):

            def all_reduce(g: Any, dtype: torch.dtype = dtype, op: str = op) -> torch.Tensor:
                t = data((5, 3), dtype, seed=1)
                if op == "PRODUCT":
                    t = t.clamp(-2, 2) if dtype is not torch.uint8 else t.clamp(0, 2)
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=g)
                return t

            both(f"all_reduce {dtype} {op}", all_reduce, gloo)
    for op in ("BAND", "BOR", "BXOR"):
        both(f"all_reduce {op}", lambda g, op=op: _reduced(dist.all_reduce, g, op), gloo)
    _strided()
    both("all_reduce complex64", lambda g: _reduced(dist.all_reduce, g, "SUM", torch.complex64), gloo)
    for root in range(n):
        both(f"broadcast root {root}", lambda g, root=root: _broadcast(g, root), gloo)
        both(f"reduce root {root}", lambda g, root=root: _reduce(g, root), gloo)
        both(f"gather root {root}", lambda g, root=root: _gather(g, root), gloo)
        both(f"scatter root {root}", lambda g, root=root: _scatter(g, root), gloo)
    both("all_gather", lambda g: _all_gather(g), gloo)
    both("all_gather_into_tensor", lambda g: _all_gather_into(g), gloo)
    both("reduce_scatter_tensor", lambda g: _reduce_scatter_tensor(g), gloo)
    both("all_to_all_single even", lambda g: _a2a_single(g, None), gloo)
    splits = [(i + me) % 3 for i in range(n)]  # rank me sends (i + me) % 3 rows to rank i
    recv = [(me + j) % 3 for j in range(n)]
    both("all_to_all_single splits", lambda g: _a2a_single(g, (recv, splits)), gloo)
    both("send/recv tags", lambda g: _p2p(g), gloo)
    both("barrier", lambda g: (dist.barrier(group=g), torch.zeros(1))[1], gloo)
    both("reduce_scatter", lambda g: _reduce_scatter_even(g), gloo)
    both("all_to_all", lambda g: _all_to_all_even(g), gloo)
    both("all_reduce_coalesced", lambda g: _coalesced(g), gloo)
    # uneven blocks (netcoll's "v" collectives): checked against the arithmetic
    _reduce_scatter_list()
    _all_to_all_list()


def _reduce_scatter_even(g: Any) -> torch.Tensor:
    out = torch.zeros(2, 2, dtype=torch.int64)
    dist.reduce_scatter(out, [data((2, 2), torch.int64, seed=40 + k) for k in range(WORLD)], group=g)
    return out


def _all_to_all_even(g: Any) -> list[torch.Tensor]:
    outs = [torch.zeros(3) for _ in range(WORLD)]
    dist.all_to_all(outs, [data((3,), seed=50 + k) for k in range(WORLD)], group=g)
    return outs


def _coalesced(g: Any) -> list[torch.Tensor]:
    ts = [data((3,), seed=60), data((2, 2), seed=61), data((0,), seed=62)]
    dist.all_reduce_coalesced(ts, group=g)
    return ts


def _reduced(fn: Callable[..., Any], g: Any, op: str, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    t = data((4, 4), dtype, seed=2)
    fn(t, op=getattr(dist.ReduceOp, op), group=g)
    return t


def _strided() -> None:
    """A non-contiguous view: reduced in place, the rest of its base untouched.
    (Against the arithmetic: Gloo writes elements outside such a view.)"""
    base = data((6, 8), seed=3)
    want = base.clone()
    want.t()[::2] = sum(_rank_data((6, 8), 3, r).t()[::2] for r in range(WORLD))
    dist.all_reduce(base.t()[::2])
    same("all_reduce non-contiguous", base, want)
    checked.append("all_reduce non-contiguous")


def _rank_data(shape: tuple[int, ...], seed: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(-4, 5, shape, generator=g).float()


def _broadcast(g: Any, root: int) -> torch.Tensor:
    t = data((7,), torch.int64, seed=4)
    dist.broadcast(t, src=root, group=g)
    return t


def _reduce(g: Any, root: int) -> torch.Tensor:
    t = data((3, 3), seed=5)
    dist.reduce(t, dst=root, group=g)
    return t if root == RANK else torch.zeros(0)  # non-roots' tensors: unspecified by torch


def _gather(g: Any, root: int) -> list[torch.Tensor]:
    t = data((2, 3), seed=6)
    outs = [torch.zeros(2, 3) for _ in range(WORLD)] if root == RANK else None
    dist.gather(t, outs, dst=root, group=g)
    return outs or []


def _scatter(g: Any, root: int) -> torch.Tensor:
    out = torch.zeros(4, dtype=torch.int32)
    ins = [data((4,), torch.int32, seed=7 + k) for k in range(WORLD)] if root == RANK else None
    dist.scatter(out, ins, src=root, group=g)
    return out


def _all_gather(g: Any) -> list[torch.Tensor]:
    outs = [torch.zeros(3, dtype=torch.bfloat16) for _ in range(WORLD)]
    dist.all_gather(outs, data((3,), torch.bfloat16, seed=8), group=g)
    return outs


def _all_gather_into(g: Any) -> torch.Tensor:
    out = torch.zeros(WORLD * 2, 5)
    dist.all_gather_into_tensor(out, data((2, 5), seed=9), group=g)
    return out


def _reduce_scatter_tensor(g: Any) -> torch.Tensor:
    out = torch.zeros(2, 3)
    dist.reduce_scatter_tensor(out, data((WORLD * 2, 3), seed=10), group=g)
    return out


def _a2a_single(g: Any, splits: tuple[list[int], list[int]] | None) -> torch.Tensor:
    if splits is None:
        inp, out = data((WORLD * 2, 3), seed=11), torch.zeros(WORLD * 2, 3)
        dist.all_to_all_single(out, inp, group=g)
        return out
    recv, send = splits
    inp, out = data((sum(send), 2), seed=12), torch.zeros(sum(recv), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send, group=g)
    return out


def _p2p(g: Any) -> list[torch.Tensor]:
    """A ring with two tags, the second sent first: tags keep them apart."""
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    a, b = torch.full((3,), float(RANK)), torch.full((2, 2), 10.0 * RANK)
    got_a, got_b = torch.zeros(3), torch.zeros(2, 2)
    works = [
        dist.isend(b, right, group=g, tag=2),
        dist.isend(a, right, group=g, tag=1),
        dist.irecv(got_a, left, group=g, tag=1),
        dist.irecv(got_b, left, group=g, tag=2),
    ]
    for w in works:
        w.wait()
    return [got_a, got_b]


def _reduce_scatter_list() -> None:
    ins = [data((k + 1, 2), seed=13 + k) for k in range(WORLD)]
    out = torch.zeros(RANK + 1, 2)
    dist.reduce_scatter(out, ins)
    want = torch.zeros(RANK + 1, 2)
    for r in range(WORLD):
        want += _rank_data((RANK + 1, 2), 13 + RANK, r)
    same("reduce_scatter list", out, want)
    checked.append("reduce_scatter list")


def _all_to_all_list() -> None:
    ins = [torch.full((j + 1,), float(100 * RANK + j)) for j in range(WORLD)]
    outs = [torch.zeros(RANK + 1) for _ in range(WORLD)]
    dist.all_to_all(outs, ins)
    same("all_to_all list", outs, [torch.full((RANK + 1,), float(100 * j + RANK)) for j in range(WORLD)])
    checked.append("all_to_all list")


def extras(gloo: Any) -> None:
    """What torch builds on the process group: batched p2p, object collectives,
    uneven all_gather, the coalescing manager, functional collectives."""
    both("batch_isend_irecv", lambda g: _batch_p2p(g), gloo)
    both("all_gather_object", lambda g: _objects(g), gloo)
    both("broadcast_object_list", lambda g: _object_list(g), gloo)
    outs = [torch.zeros(k + 1) for k in range(WORLD)]
    dist.all_gather(outs, torch.full((RANK + 1,), float(RANK)))  # uneven: netcoll only (Gloo needs one size)
    same("all_gather uneven", outs, [torch.full((k + 1,), float(k)) for k in range(WORLD)])
    checked.append("all_gather uneven")
    both("coalescing manager", lambda g: _coalescing(g), gloo)
    both("functional all_reduce", lambda g: _functional(g), gloo, dist.group.WORLD)


def _batch_p2p(g: Any) -> torch.Tensor:
    a, b = data((4,), seed=70), torch.zeros(4)  # both groups span every rank: group ranks = global ranks
    ops = [dist.P2POp(dist.isend, a, (RANK + 1) % WORLD, g), dist.P2POp(dist.irecv, b, (RANK - 1) % WORLD, g)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return b


def _objects(g: Any) -> torch.Tensor:
    out: list[Any] = [None] * WORLD
    dist.all_gather_object(out, {"rank": RANK, "data": list(range(RANK))}, group=g)
    assert out == [{"rank": r, "data": list(range(r))} for r in range(WORLD)], out
    return torch.tensor([len(o["data"]) for o in out])


def _object_list(g: Any) -> torch.Tensor:
    objs: list[Any] = [f"from {RANK}", RANK] if RANK == 1 else [None, None]
    dist.broadcast_object_list(objs, src=1, group=g)
    assert objs == ["from 1", 1], objs
    return torch.zeros(1)


def _coalescing(g: Any) -> list[torch.Tensor]:
    from torch.distributed.distributed_c10d import _coalescing_manager

    ts = [data((3,), seed=80), data((2, 2), seed=81)]
    with _coalescing_manager(group=g, async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t, group=g)
    cm.wait()
    return ts


def _functional(g: Any) -> torch.Tensor:
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(data((5,), seed=90), "sum", g if g is not None else dist.group.WORLD)


def async_ops(gloo: Any) -> None:
    ts = [data((1000,), seed=20 + k) for k in range(4)]
    refs = [t.clone() for t in ts]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for r in refs:
        dist.all_reduce(r, group=gloo)
    for w, t, r in zip(reversed(works), reversed(ts), reversed(refs), strict=True):  # waited in any order
        assert w.wait()
        assert w.is_completed()
        same("async all_reduce", t, r)
    fut = dist.all_reduce(torch.ones(3), async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    same("get_future().then", doubled, torch.full((3,), 2.0 * WORLD))
    checked.append("async all_reduce")


def groups(gloo: Any) -> None:
    pairs = [[0, WORLD - 1], list(range(1, WORLD))]
    for ranks in pairs:
        ours, theirs = dist.new_group(ranks), dist.new_group(ranks, backend="gloo")
        if RANK in ranks:
            assert dist.get_backend(ours) == "netcoll", dist.get_backend(ours)
            both(f"new_group {ranks} all_reduce", lambda g: _reduced(dist.all_reduce, g, "SUM"), theirs, ours)
            both(f"new_group {ranks} broadcast", lambda g, r=ranks: _bcast_in(g, r[-1]), theirs, ours)
    dist.barrier()


def _bcast_in(g: Any, src: int) -> torch.Tensor:
    t = data((4,), seed=30)
    dist.broadcast(t, src=src, group=g)
    return t


def errors(gloo: Any) -> None:
    def fails(name: str, call: Callable[[], Any], kind: type[BaseException], text: str) -> None:
        try:
            call()
        except kind as exc:
            assert text in str(exc), (name, str(exc))
            checked.append(name)
            return
        raise AssertionError(f"{name}: no error")

    premul = dist._make_nccl_premul_sum(2.0)  # torch's own constructor of a PREMUL_SUM op
    fails("PREMUL_SUM", lambda: dist.all_reduce(torch.ones(2), op=premul), ValueError, "PREMUL_SUM")
    fails("recv any source", lambda: dist.recv(torch.zeros(1)), RuntimeError, "any source")
    fails("float8", lambda: dist.all_reduce(torch.zeros(2, dtype=torch.float8_e5m2)), TypeError, "float8_e5m2")
    fails("mismatch", lambda: dist.all_reduce(torch.zeros(RANK + 1)), Exception, "all_reduce")
    dist.barrier()  # the group goes on after a failed collective


def train(group: Any, steps: int = 20, **ddp: Any) -> torch.Tensor:
    """A small MLP trained with unmodified DDP over ``group``; its parameters, flat."""
    torch.manual_seed(0)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    net = torch.nn.parallel.DistributedDataParallel(model, process_group=group, **ddp)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + RANK)  # each rank its own shard
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def ddp(gloo: Any) -> None:
    results: dict[str, Any] = {}
    for name, kw in {"default": {}, "small buckets": {"bucket_cap_mb": 0.001, "gradient_as_bucket_view": True}}.items():
        ours, theirs = train(None, **kw), train(gloo, **kw)
        rows = [torch.zeros_like(ours) for _ in range(WORLD)]
        dist.all_gather(rows, ours, group=gloo)  # every rank's parameters, through Gloo
        assert all(torch.equal(r, ours) for r in rows), f"{name}: parameters differ across ranks"
        results[name] = float((ours - theirs).abs().max())
        checked.append(f"ddp {name}")
    print(json.dumps({"ddp_max_abs_diff_vs_gloo": results}), flush=True)


def main() -> None:
    dist.init_process_group("netcoll", timeout=timedelta(seconds=60))  # env://, as `netcoll run` sets it
    assert dist.get_backend() == netcoll.torch.BACKEND
    gloo = dist.new_group(backend="gloo")
    for scenario in sys.argv[1:]:
        {
            "collectives": collectives,
            "extras": extras,
            "async": async_ops,
            "groups": groups,
            "errors": errors,
            "ddp": ddp,
        }[scenario](gloo)
    dist.destroy_process_group()
    print(json.dumps({"rank": RANK, "checked": checked}), flush=True)


if __name__ == "__main__":
    main()
