"""Elastic torch: ``netcoll.torch.rebuild`` after a regroup, DDP going on across a
kill and a join (examples/training/elastic_ddp.py, processes on loopback, each
ended by PID), and a failed collective's future as torch's C++ side sees it."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

import netcoll.torch  # noqa: E402
from netcoll.errors import PeerLost  # noqa: E402
from netcoll.torch.issue import NetcollWork  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.env import run_session  # noqa: E402

EXAMPLE = REPO / "examples" / "training" / "elastic_ddp.py"


def test_a_failed_collective_is_an_error_of_the_future_torch_reads() -> None:
    fut: torch.futures.Future[object] = torch.futures.Future()
    work = NetcollWork(fut)
    fut.set_exception(PeerLost("lost connection to rank 3"))
    with pytest.raises(PeerLost):  # the typed error, for wait()
        work.wait()
    # DDP's reducer reads get_future() in C++: an error there (a RuntimeError back in Python),
    # not a value that only Python's wait() unwraps into the PeerLost (the reducer crashed on it)
    with pytest.raises(RuntimeError, match="lost connection to rank 3"):
        torch.futures.collect_all([work.get_future()]).wait()


def test_a_finished_collective_gives_its_value_to_torch() -> None:
    fut: torch.futures.Future[object] = torch.futures.Future()
    work = NetcollWork(fut)
    t = torch.ones(3)
    fut.set_result([t])
    assert work.wait() and work.get_future().value()[0] is t


def test_rebuild_refuses_what_is_not_an_open_sync_communicator() -> None:
    with pytest.raises(ValueError, match=r"open netcoll\.sync communicator"):
        netcoll.torch.rebuild(object())  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.tcp
@pytest.mark.timeout(400)
def test_ddp_goes_on_across_a_kill_and_a_join() -> None:
    """4 ranks, rank 3 SIGKILLed after step 6, a replacement admitted by a later
    regroup: the example's own checks (bit-identical, loss down, as without failures)."""
    # 34 steps of 0.2 s after the kill: time for the replacement to import torch on a busy machine
    args = ["--steps", "40", "--kill-at", "6", "--regroup-every", "4", "--pause", "0.2"]
    returncode, out = run_session([sys.executable, str(EXAMPLE), *args])
    assert returncode == 0, out[-5000:]
    assert "SIGKILL rank 3" in out
    for rank in range(3):
        assert f"rank {rank}: rank {rank} -> rank {rank} of 3" in out, out[-3000:]
    assert "replacement: joined as rank 3 of 4" in out, out[-3000:]
    assert "step  40  loss" in out and "(4 ranks)" in out.split("joined as rank 3")[1]
    assert "ok: every rank bit-identical" in out
