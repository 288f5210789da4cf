"""The torch.distributed backend "netcoll": every collective torch calls gives
Gloo's results (both backends in the same ranks, loopback), async Works,
sub-groups, errors, and unmodified DistributedDataParallel training; ranks
start under ``netcoll run`` (env://)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import netcoll.torch
from netcoll.torch.issue import NetcollWork
from netcoll.torch.world import _connect

from .launch import run

pytestmark = pytest.mark.tcp
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backend_worker.py")
N = 3
CALLS = [
    *(f"all_reduce torch.{d} {op}" for d in ("float32", "float64", "int32", "int64", "uint8", "bfloat16", "float16")
      for op in ("SUM", "PRODUCT", "MIN", "MAX")),
    "all_reduce BAND", "all_reduce BOR", "all_reduce BXOR", "all_reduce non-contiguous", "all_reduce complex64",
    *(f"{c} root {r}" for r in range(N) for c in ("broadcast", "reduce", "gather", "scatter")),
    "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single even",
    "all_to_all_single splits", "send/recv tags", "barrier", "reduce_scatter", "all_to_all", "all_reduce_coalesced",
    "reduce_scatter list", "all_to_all list",
]  # fmt: skip
EXTRAS = [
    "batch_isend_irecv",
    "all_gather_object",
    "broadcast_object_list",
    "all_gather uneven",
    "coalescing manager",
    "functional all_reduce",
]
ERRORS = ["PREMUL_SUM", "recv any source", "float8", "mismatch"]


@pytest.mark.timeout(400)
def test_every_collective_matches_gloo_and_what_torch_builds_on_them() -> None:
    done = run(N, WORKER, "collectives", "extras", "async", "groups", "errors")
    assert done.returncode == 0, done.output[-5000:]
    for rank in range(N):
        checked = done.reports[rank][-1]["checked"]
        groups = [
            f"new_group {g} {c}"
            for g in ([0, N - 1], list(range(1, N)))
            if rank in g
            for c in ("all_reduce", "broadcast")
        ]
        assert checked == [*CALLS, *EXTRAS, "async all_reduce", *groups, *ERRORS], checked


@pytest.mark.timeout(400)
def test_ddp_trains_bit_identically_across_ranks_and_close_to_gloo() -> None:
    done = run(N, WORKER, "ddp")
    assert done.returncode == 0, done.output[-5000:]
    for rank in range(N):
        diffs, summary = done.reports[rank]
        assert summary["checked"] == ["ddp default", "ddp small buckets"]  # bit-identical across ranks
        for name, diff in diffs["ddp_max_abs_diff_vs_gloo"].items():
            assert diff < 1e-6, (name, diff)  # the same training as on Gloo, up to float rounding


def test_import_registers_the_backend() -> None:
    assert netcoll.torch.BACKEND == "netcoll"
    assert "netcoll" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["netcoll"] == ["cpu"]
    assert dist.Backend.NETCOLL == "netcoll"


def test_without_a_coordinator_the_error_says_how_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NETCOLL_COORDINATOR", raising=False)
    with pytest.raises(RuntimeError, match="netcoll run -n N"):
        _connect(0, 2, 5.0)


def test_work_waits_raises_and_reports_completion() -> None:
    fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
    work = NetcollWork(fut)
    assert not work.is_completed() and work.exception() is None
    with pytest.raises(TimeoutError, match=r"within 0\.01s"):
        work.wait(timedelta(milliseconds=10))
    fut.set_exception(ValueError("all_reduce failed on rank 1"))
    assert work.is_completed() and not work.is_success()
    assert isinstance(work.exception(), ValueError)
    with pytest.raises(ValueError, match="rank 1"):
        work.wait()
    ok: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
    good = NetcollWork(ok)
    ok.set_result([torch.ones(2)])
    assert good.wait() and good.is_success() and good.get_future().value() is ok.value()
    assert torch.equal(good.result()[0], torch.ones(2))
