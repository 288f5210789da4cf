"""Data-parallel training with unmodified torch DistributedDataParallel on the
netcoll backend, checked against the same training in one process.

    netcoll run -n 4 examples/training/torch_ddp.py            # 20 steps, then the checks

Two lines differ from the same script on Gloo: ``import netcoll.torch`` and
``init_process_group("netcoll")`` (``netcoll run`` sets RANK, WORLD_SIZE,
MASTER_ADDR/PORT and netcoll's NETCOLL_* variables, so env:// needs nothing
else). Each rank trains on its own shard of every batch. At the end every rank
checks that its parameters are bit-identical with every other rank's, and rank
0 replays the 20 steps in one process on the whole batches (the shards of all
ranks together: DDP's averaged gradient is that batch's gradient) and prints
how far the two are apart. Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import netcoll.torch  # noqa: F401  registers the "netcoll" backend

SHARD = 16  # samples per rank and step
TOLERANCE = 1e-5  # float32 sums in another order: DDP vs one process


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def shard(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s part of batch ``step`` (the same on every run)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(SHARD, 32, generator=g)
    return x, x[:, :8].sin() + 0.1 * torch.randn(SHARD, 8, generator=g)


Batch = Callable[[int], tuple[torch.Tensor, ...]]


def whole_batch(step: int, world: int) -> tuple[torch.Tensor, ...]:
    """Every rank's shard of batch ``step``, together."""
    xs, ys = zip(*(shard(step, r) for r in range(world)), strict=True)
    return torch.cat(xs), torch.cat(ys)


def train(model: torch.nn.Module, steps: int, batch: Batch) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    steps = parser.parse_args().steps

    dist.init_process_group("netcoll")  # was: dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(make_model())
    losses = train(model, steps, lambda step: shard(step, rank))

    params = flat(model.module)
    everyone = [torch.empty_like(params) for _ in range(world)]
    dist.all_gather(everyone, params)
    identical = all(torch.equal(p, params) for p in everyone)
    print(f"rank {rank}: loss {losses[0]:.4f} -> {losses[-1]:.4f}; parameters bit-identical on all ranks: {identical}")
    ok = identical
    if rank == 0:
        alone = make_model()  # the same model, trained on the whole batches in one process
        train(alone, steps, lambda step: whole_batch(step, world))
        diff = float((flat(alone) - params).abs().max())
        ok = ok and diff <= TOLERANCE
        print(f"{world} ranks x {steps} steps: max |DDP - single process| = {diff:.3g} (tolerance {TOLERANCE:g})")
        print("OK" if ok else "FAILED")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
