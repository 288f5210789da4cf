"""One rank of the compression hook's test: ``python hook_worker.py`` under ``netcoll run``.

Trains the same DDP model (several gradient buckets) a few steps three ways: the plain
all_reduce, netcoll's compression hook with fp16, and with int8 and error feedback; counts
the payload bytes this rank sent meanwhile (``link_stats()``'s ``bytes_sent``), gathers
every rank's parameters and prints one JSON line: what it saw."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import netcoll.torch

RANK, WORLD, STEPS = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), 5


def sent() -> int:
    session = netcoll.torch.world()
    assert session is not None
    return sum(int(link["bytes_sent"]) for link in session.link_stats().values())


def train(compression: str | None, error_feedback: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 16))
    model = DistributedDataParallel(module, bucket_cap_mb=0.01)  # 2600 floats a bucket: 2 after step 1
    state, seen = None, {}
    if compression is not None:
        state, hook = netcoll.torch.compression_hook(compression, error_feedback=error_feedback)

        def recording(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations as objects
            seen[bucket.index()] = bucket.buffer().numel()  # the last step's buckets
            return hook(state, bucket)

        model.register_comm_hook(state, recording)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = sent()
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + RANK)
        x = torch.randn(8, 64, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x[:, :16].cos()).backward()
        opt.step()
    bytes_sent = sent() - before
    params = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    everyone = [torch.empty_like(params) for _ in range(WORLD)]
    dist.all_gather(everyone, params)
    return {
        "bytes": bytes_sent,
        "identical": all(torch.equal(p, params) for p in everyone),
        "params": params.numel(),
        "residual_bytes": 0 if state is None else state.residual_bytes,
        "residual_keys": 0 if state is None or state.feedback is None else len(state.feedback.held()),
        "buckets": seen,
        "flat": params,
    }


def main() -> None:
    dist.init_process_group("netcoll")
    runs = {"none": train(None, False), "fp16": train("fp16", False), "int8_ef": train("int8", True)}
    reference = runs["none"]["flat"]
    for run in runs.values():
        run["max_abs_diff"] = float((run.pop("flat") - reference).abs().max())
    print(json.dumps(runs))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
