"""netcoll.torch's DDP compression hook: DDP with it keeps the replicas bit-identical,
sends the codec's share of the bytes (``link_stats()``), keeps one residual per bucket
under error feedback; and what it refuses."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import netcoll.torch
from tests.support import REPO

from .launch import run

N, STEPS = 3, 5  # hook_worker.py's


@pytest.mark.tcp
@pytest.mark.timeout(400)
def test_ddp_with_the_hook_is_identical_on_every_rank_and_sends_fewer_bytes() -> None:
    done = run(N, str(REPO / "tests" / "torch" / "hook_worker.py"))
    assert done.returncode == 0, done.output[-5000:]
    for rank in range(N):
        (runs,) = done.reports[rank]
        params = runs["none"]["params"]
        ring = 2 * (N - 1) / N * 4 * params * STEPS  # float32 bytes a ring all_reduce sends per rank
        for name, ratio in (("fp16", 0.5), ("int8_ef", 0.25 + 1 / 512)):
            got = runs[name]
            assert got["identical"], (rank, name)
            assert got["bytes"] <= ratio * ring * 1.01 + 256, (rank, name, got["bytes"], ring)
            assert got["bytes"] < runs["none"]["bytes"], (rank, name)
            assert sorted(got["buckets"]) == ["0", "1"] and sum(got["buckets"].values()) == params, got["buckets"]
        assert runs["none"]["identical"]
        assert 0 < runs["fp16"]["max_abs_diff"] < 1e-4  # the codec's error, after 5 steps
        assert 0 < runs["int8_ef"]["max_abs_diff"] < 1e-2
        assert runs["fp16"]["residual_bytes"] == 0  # no error feedback asked for
        assert runs["int8_ef"]["residual_bytes"] == 4 * params  # one float32 residual per bucket
        assert runs["int8_ef"]["residual_keys"] == 2


def test_the_state_refuses_a_group_that_is_not_netcoll_and_a_bad_codec() -> None:
    state, hook = netcoll.torch.compression_hook("int8", process_group=object())
    assert hook is netcoll.torch.compressed_allreduce_hook
    assert state.compression == "int8" and state.error_feedback and state.residual_bytes == 0
    with pytest.raises(TypeError, match="needs a netcoll process group"):
        state.group()
    with pytest.raises(ValueError, match="compression must be one of"):
        netcoll.torch.compression_hook("fp8")


class Bucket:
    """What the hook reads of torch's GradBucket."""

    def __init__(self, index: int, values: list[float], last: bool) -> None:
        import torch

        self._index, self._buffer, self._last = index, torch.tensor(values, dtype=torch.float32), last

    def index(self) -> int:
        return self._index

    def buffer(self) -> object:
        return self._buffer

    def is_last(self) -> bool:
        return self._last


class Group:
    def rank(self) -> int:
        return 1

    def size(self) -> int:
        return 2


def test_residuals_follow_the_buckets() -> None:
    state, _ = netcoll.torch.compression_hook("fp16", error_feedback=True)
    x = 1.0 + 2.0**-12  # fp16 rounds it to 1.0: shard 0 (not rank 1's own) loses 2**-12
    for index, last in ((0, False), (1, False), (2, True)):
        state.compensated(Group(), Bucket(index, [x] * 4, last))  # type: ignore[arg-type]
    assert state.residual_bytes == 3 * 4 * 4
    got = state.compensated(Group(), Bucket(0, [x] * 4, False))  # type: ignore[arg-type]
    assert got.tolist() == [x + 2.0**-12] * 2 + [x] * 2  # type: ignore[attr-defined]
    state.compensated(Group(), Bucket(1, [x] * 4, True))  # type: ignore[arg-type]  # now 2 buckets: 2's goes
    assert state.feedback is not None and state.feedback.held() == [0, 1]
    assert state.residual_bytes == 2 * 4 * 4


def test_compensated_adds_the_residual_in_the_buckets_own_buffer() -> None:
    state, _ = netcoll.torch.compression_hook("fp16", error_feedback=True)
    x = 1.0 + 2.0**-12  # as above: shard 0 loses 2**-12 each step
    first = Bucket(0, [x] * 4, True)
    assert state.compensated(Group(), first) is first.buffer()  # type: ignore[arg-type]
    assert first.buffer().tolist() == [x] * 4  # type: ignore[attr-defined]  # no residual yet
    second = Bucket(0, [x] * 4, True)
    assert state.compensated(Group(), second) is second.buffer()  # type: ignore[arg-type]  # in place: no copy
    assert second.buffer().tolist() == [x + 2.0**-12] * 2 + [x] * 2  # type: ignore[attr-defined]
    assert state.feedback is not None
    residual = state.feedback.residual(0)
    assert residual is not None and residual.tolist() == [2.0**-11] * 2 + [0.0] * 2  # 1 + 2**-11 rounds to 1.0
    state.compensated(Group(), Bucket(0, [x] * 2, True))  # type: ignore[arg-type]  # DDP rebuilt the buckets
    assert state.residual_bytes == 2 * 4
    plain, _ = netcoll.torch.compression_hook("fp16", error_feedback=False)
    bucket = Bucket(0, [x] * 4, True)
    assert plain.compensated(Group(), bucket) is bucket.buffer()  # type: ignore[arg-type]  # without feedback: itself
    assert bucket.buffer().tolist() == [x] * 4  # type: ignore[attr-defined]  # untouched
    assert plain.residual_bytes == 0
