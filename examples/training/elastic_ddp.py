"""Elastic torch DDP on netcoll: training goes on when a rank is killed, and takes
in a replacement, without restarting anyone.

    python3 examples/training/elastic_ddp.py            # 4 ranks, rank 3 killed, a 5th joins

This one command starts a coordinator and 4 rank processes (this file with
``--rank``), SIGKILLs rank 3 at step ``--kill-at``, starts a replacement (this
file with ``--join``) once the survivors have regrouped, and prints the loss
of every step (rank 0's line) with the membership changes. Each rank runs
unmodified ``DistributedDataParallel`` on the ``"netcoll"`` backend inside the
documented loop (docs/training.md, "Elastic DDP"):

* catch the error of the step (``PeerLost``, ``CollectiveAborted``, ...: a
  ``NetcollError``; DDP's reducer reports it as a ``RuntimeError``);
* ``comm = comm.regroup()``: the survivors (and whoever waits to join);
* ``netcoll.torch.rebuild(comm)``: torch's default group over the new one;
* ``recover``: survivors that stopped a step apart take the most advanced
  one's state; joiners get parameters, momentum and step through ``heal``;
* a new ``DistributedDataParallel`` around the same module, and on.

Every ``--regroup-every`` steps the ranks call ``regroup`` too, which is how a
waiting replacement gets in. The data follow the step, not the rank: batch
``step`` is the same ``BATCH`` samples whatever the world, and rank ``r`` of
``n`` trains on rows ``r*BATCH/n .. (r+1)*BATCH/n`` of it (``BATCH`` divides
by 1, 2, 3, 4, 6 and 8), so DDP's averaged gradient is the whole batch's at
any size and a step done again after a failure is the same step. At the end
the parent checks that every rank's parameters are bit-identical, that the
loss went down, and that they are within ``TOLERANCE`` of the same 80 steps
the same 80 steps replayed in one process without failures; exit status 1 if not. Every
process it started is ended (by PID) before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import netcoll
import netcoll.sync
import netcoll.torch
from netcoll.errors import NetcollError

BATCH = 48  # samples per step, split over whichever ranks are live
GROUP = "elastic-ddp"
SELF = os.path.abspath(__file__)
TOLERANCE = 1e-4  # float32 sums in another order (3 or 4 ranks, or one process)


# -- the model and the data: the same in every process ---------------------------------
def make_model() -> tuple[torch.nn.Module, torch.optim.SGD]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for p in net.parameters():  # momentum buffers from the start (zeros: the same first step), so
        opt.state[p]["momentum_buffer"] = torch.zeros_like(p)  # a joiner's state has the live layout
    return net, opt


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of ``step``: fixed by the step number alone."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 32, generator=g)
    return x, x[:, :8].sin() + 0.1 * torch.randn(BATCH, 8, generator=g)


def shard(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s rows of batch ``step`` in a world of ``world``."""
    if BATCH % world:
        raise ValueError(f"a batch of {BATCH} does not split over {world} ranks")
    n = BATCH // world
    x, y = batch(step)
    return x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]


def state_of(net: torch.nn.Module, opt: torch.optim.SGD, step: int) -> dict[str, Any]:
    """What a joiner needs: parameters, momentum and step (tensors the model uses, filled in place)."""
    named = list(net.named_parameters())
    return {
        "model": {k: p.data for k, p in named},
        "optim": {k: opt.state[p]["momentum_buffer"] for k, p in named},
        "step": step,
    }


# -- one rank ------------------------------------------------------------------------------
def emit(**event: Any) -> None:
    print(json.dumps(event), flush=True)


def recover(comm: netcoll.sync.SyncCommunicator, net: torch.nn.Module, opt: torch.optim.SGD, step: int) -> int:
    """After a regroup, on every rank of the new group: one state, then a new DDP's group.

    Survivors may have stopped a step apart (a collective that ended on some ranks and
    failed on others): the most advanced one's state is right (its step's all_reduce
    had everyone's gradients), so it is broadcast to all. Then ``heal`` fills the
    joiners' parameters, momentum and step from the live members.
    """
    steps = comm.all_gather(np.array([-1 if comm.joined else step], np.int64))[:, 0]
    live = steps[steps >= 0]
    if live.min() != live.max():  # rare: the most advanced survivor's state, to every rank
        tensors = [*state_of(net, opt, step)["model"].values(), *state_of(net, opt, step)["optim"].values()]
        source = int(np.argmax(steps))
        flat = torch.as_tensor(comm.broadcast(torch.cat([t.reshape(-1) for t in tensors]), root=source))
        with torch.no_grad():
            for t, part in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
                t.copy_(part.view_as(t))
        step = int(steps[source])
    healed = comm.heal(state_of(net, opt, step), timeout=60)
    return int(healed["step"])


def run_rank(address: str, rank: int | None, steps: int, regroup_every: int, pause: float) -> int:
    joining = rank is None
    comm = netcoll.sync.connect(
        address, group=GROUP, world_size=None if joining else 4, rank=rank, elastic=joining, collective_timeout=30
    )
    net, opt = make_model()
    step = 0
    netcoll.torch.rebuild(comm)
    if joining:
        step = recover(comm, net, opt, step)
        emit(event="joined", rank=comm.rank, world=comm.world_size, step=step, time=time.time())
    model = DistributedDataParallel(net)
    while step < steps:
        try:
            x, y = shard(step, comm.rank, comm.world_size)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()  # DDP's all_reduce of the gradients (the average over the world)
            opt.step()
            whole = loss.detach().clone()
            dist.all_reduce(whole)  # the loss of the whole batch: the mean of equal shards' means
            step += 1
            emit(event="step", step=step, rank=comm.rank, world=comm.world_size, loss=whole.item() / comm.world_size)
            time.sleep(pause)  # stands for a longer step, so the replacement (torch's import) comes in time
            if step % regroup_every or step == steps:
                continue
            new = comm.regroup(timeout=60)  # every few steps: admit whoever waits
        except (NetcollError, RuntimeError) as exc:  # a rank died (DDP's reducer re-raises as RuntimeError)
            emit(event="failed", step=step, rank=comm.rank, error=f"{type(exc).__name__}: {exc}"[:200])
            new = comm.regroup(timeout=60)  # the survivors, ranks 0..n-1 in their old order
        if new is comm:
            continue
        old, comm = comm, new
        netcoll.torch.rebuild(comm)
        step = recover(comm, net, opt, step)
        model = DistributedDataParallel(net)  # the same module, on the new default group
        emit(event="regrouped", rank=comm.rank, old_rank=old.rank, world=comm.world_size, step=step, time=time.time())
    flat = torch.nn.utils.parameters_to_vector(net.parameters()).detach()
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    emit(event="done", rank=comm.rank, step=step, digest=digest, params=flat.tolist())
    dist.destroy_process_group()
    comm.close()
    return 0


# -- the parent: a coordinator, 4 ranks, a kill and a replacement ---------------------
class Rank:
    """One rank process and the events it printed."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc, self.name = proc, name
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                print(f"[{self.name}] {line.decode(errors='replace').rstrip()}")
                continue
            self.events.append(event)
            show(self.name, event)

    def last(self, kind: str) -> dict[str, Any] | None:
        return next((e for e in reversed(self.events) if e["event"] == kind), None)


def show(name: str, e: dict[str, Any]) -> None:
    """The loss curve (rank 0 of each step) and every membership change, as they come."""
    if e["event"] == "step" and e["rank"] == 0:
        print(f"step {e['step']:3d}  loss {e['loss']:.5f}  ({e['world']} ranks)")
    elif e["event"] == "failed" and e["rank"] == 0:
        print(f"        ranks failed in step {e['step'] + 1}: {e['error'][:120]}")
    elif e["event"] == "regrouped":
        print(f"        {name}: rank {e['old_rank']} -> rank {e['rank']} of {e['world']} (at step {e['step']})")
    elif e["event"] == "joined":
        print(f"        {name}: joined as rank {e['rank']} of {e['world']}, healed to step {e['step']}")


async def spawn(address: str, name: str, args: list[str], opts: argparse.Namespace) -> Rank:
    cmd = [sys.executable, SELF, "--address", address, *args]
    cmd += ["--steps", str(opts.steps), "--regroup-every", str(opts.regroup_every), "--pause", str(opts.pause)]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
    return Rank(proc, name)


async def wait_for(check: Any, ranks: list[Rank], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline or all(r.proc.returncode is not None for r in ranks):
            codes = ", ".join(f"{r.name} {r.proc.returncode}" for r in ranks)
            raise RuntimeError(f"timed out waiting for {what} (exit status: {codes})")
        await asyncio.sleep(0.01)


async def orchestrate(opts: argparse.Namespace) -> list[Rank]:
    ranks: list[Rank] = []
    async with netcoll.Coordinator() as coord:
        try:
            ranks = [await spawn(coord.address, f"rank {r}", ["--rank", str(r)], opts) for r in range(4)]
            victim = ranks[3]
            await wait_for(
                lambda: any(e["event"] == "step" and e["step"] >= opts.kill_at for e in ranks[0].events),
                ranks,
                f"step {opts.kill_at}",
            )
            os.kill(victim.proc.pid, signal.SIGKILL)
            print(f"        SIGKILL rank 3 (pid {victim.proc.pid})")
            await victim.proc.wait()
            await wait_for(lambda: all(r.last("regrouped") for r in ranks[:3]), ranks, "the survivors' regroup")
            ranks.append(await spawn(coord.address, "replacement", ["--join"], opts))
            print(f"        replacement started (pid {ranks[-1].proc.pid})")
            for r in ranks:
                await asyncio.wait_for(r.proc.wait(), 300)
        finally:
            for r in ranks:
                if r.proc.returncode is None:
                    r.proc.kill()
                    await r.proc.wait()
                await asyncio.gather(r.reader, return_exceptions=True)
    return ranks


def replay(steps: int) -> tuple[torch.Tensor, list[float]]:
    """The same training in one process, no failure: the reference."""
    net, opt = make_model()
    losses = []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.nn.utils.parameters_to_vector(net.parameters()).detach(), losses


def check(ranks: list[Rank], steps: int) -> list[str]:
    """What went wrong (nothing: an empty list)."""
    finished = ranks[:3] + ranks[4:]
    problems = [f"{r.name} exited {r.proc.returncode}" for r in finished if r.proc.returncode != 0]
    done = [r.last("done") for r in finished]
    if problems or not all(done):
        return problems or ["a rank did not finish"]
    if len({d["digest"] for d in done if d}) != 1:
        problems.append("the ranks' final parameters differ")
    if not ranks[4].last("joined"):
        problems.append("the replacement never joined")
    curve = {e["step"]: e["loss"] for e in ranks[0].events if e["event"] == "step"}
    if not curve or curve[max(curve)] > 0.5 * curve[min(curve)]:
        problems.append(
            f"the loss did not go down: {curve.get(min(curve, default=0))} -> {curve.get(max(curve, default=0))}"
        )
    want, losses = replay(steps)
    got = torch.tensor(done[0]["params"])  # type: ignore[index]
    diff = float((got - want).abs().max())
    print(
        f"final loss {curve.get(steps, float('nan')):.5f}; one process without failures: {losses[-1]:.5f}; "
        f"max |param difference| {diff:.2e}"
    )
    if diff > TOLERANCE:
        problems.append(f"parameters {diff:.2e} away from the failure-free run (more than {TOLERANCE})")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--kill-at", type=int, default=12, help="kill rank 3 once rank 0 finished this step")
    parser.add_argument("--regroup-every", type=int, default=5)
    parser.add_argument("--pause", type=float, default=0.1, help="seconds each step sleeps (a longer step)")
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--join", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.address:  # a rank process
        return run_rank(opts.address, None if opts.join else opts.rank, opts.steps, opts.regroup_every, opts.pause)
    ranks = asyncio.run(orchestrate(opts))
    problems = check(ranks, opts.steps)
    for p in problems:
        print(f"FAILED: {p}")
    if not problems:
        print("ok: every rank bit-identical, the loss went down, as without failures")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
