"""Data-parallel training with unmodified torch DistributedDataParallel on the
netcoll backend, checked against the same training in one process.

    netcoll run -n 4 examples/training/torch_ddp.py            # 20 steps, then the checks
    netcoll run -n 4 examples/training/torch_ddp.py --compression int8 --error-feedback

Two lines differ from the same script on Gloo: ``import netcoll.torch`` and
``init_process_group("netcoll")`` (``netcoll run`` sets RANK, WORLD_SIZE,
MASTER_ADDR/PORT and netcoll's NETCOLL_* variables, so env:// needs nothing
else). Each rank trains on its own shard of every batch. At the end every rank
checks that its parameters are bit-identical with every other rank's, and rank
0 replays the 20 steps in one process on the whole batches (the shards of all
ranks together: DDP's averaged gradient is that batch's gradient) and prints
how far the two are apart. Exit status 1 if a check fails.

``--compression fp16|bf16|int8`` registers netcoll's DDP communication hook
(``netcoll.torch.compression_hook``): the gradient buckets cross the wire encoded, so
the parameters differ from the single-process ones; that check becomes the final loss
(on a batch not trained on) within ``RTOL`` of the single-process model's, or
``ATOL`` times the first step's loss. ``--error-feedback`` carries each bucket's
compression error over to the next step. ``--losses FILE`` writes the loss of every
step (the whole batch's: the mean of the ranks' shards) as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import netcoll.torch  # registers the "netcoll" backend

SHARD = 16  # samples per rank and step
TOLERANCE = 1e-5  # float32 sums in another order: DDP vs one process
RTOL, ATOL = 0.05, 1e-6  # compressed: final loss vs one process's, relative / times the first loss
HELD_OUT = 10**6  # the batch the final loss is measured on (never trained on)


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


def train(model: torch.nn.Module, steps: int, batch: Batch, lr: float = 0.05) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
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


def held_out_loss(model: torch.nn.Module, world: int) -> float:
    x, y = whole_batch(HELD_OUT, world)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--compression", default="none", choices=["none", "fp16", "bf16", "int8"])
    parser.add_argument("--error-feedback", action="store_true", help="carry each bucket's compression error over")
    parser.add_argument("--losses", help="write the loss of every step to this JSON file (rank 0)")
    return parser.parse_args()


def check(args: argparse.Namespace, model: torch.nn.Module, losses: list[float], world: int) -> bool:
    """Rank 0: the same training in one process, against this one."""
    alone = make_model()  # the same model, trained on the whole batches in one process
    train(alone, args.steps, lambda step: whole_batch(step, world), args.lr)
    final, reference = held_out_loss(model, world), held_out_loss(alone, world)
    if args.losses:
        with open(args.losses, "w") as f:
            fields = {"compression": args.compression, "error_feedback": args.error_feedback, "lr": args.lr}
            json.dump({**fields, "ranks": world, "loss": losses, "final": final, "reference": reference}, f)
    if args.compression == "none":
        diff = float((flat(alone) - flat(model)).abs().max())
        print(f"{world} ranks x {args.steps} steps: max |DDP - single process| = {diff:.3g} (tolerance {TOLERANCE:g})")
        return diff <= TOLERANCE
    allowed = RTOL * reference + ATOL * losses[0]
    feedback = " with error feedback" if args.error_feedback else ""
    print(
        f"{world} ranks x {args.steps} steps, {args.compression}{feedback}: final loss {final:.4g}, "
        f"single process uncompressed {reference:.4g} (allowed: {allowed:.2g} apart)"
    )
    return abs(final - reference) <= allowed


def main() -> int:
    args = arguments()
    dist.init_process_group("netcoll")  # was: dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(make_model())
    if args.compression != "none":  # gradient buckets through netcoll's codec
        model.register_comm_hook(*netcoll.torch.compression_hook(args.compression, error_feedback=args.error_feedback))
    losses = train(model, args.steps, lambda step: shard(step, rank), args.lr)

    params = flat(model.module)
    everyone = [torch.empty_like(params) for _ in range(world)]
    dist.all_gather(everyone, params)
    identical = all(torch.equal(p, params) for p in everyone)
    print(f"rank {rank}: loss {losses[0]:.4f} -> {losses[-1]:.4f}; parameters bit-identical on all ranks: {identical}")
    curves = [torch.empty(args.steps, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(curves, torch.tensor(losses, dtype=torch.float64))  # the whole batch's: the shards' mean
    ok = identical
    if rank == 0:
        ok = check(args, model.module, torch.stack(curves).mean(0).tolist(), world) and ok
        print("OK" if ok else "FAILED")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
