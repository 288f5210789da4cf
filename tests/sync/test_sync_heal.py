"""``SyncCommunicator.heal``: the blocking netcoll.elastic.heal, from plain threads
(the async heal's own schedules are tests/elastic/test_heal.py)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import netcoll.sync
from tests.sync.conftest import in_threads


def state_of(step: int) -> dict[str, Any]:
    """A live member's state after ``step`` steps (the same on every live member)."""
    w = np.arange(3000, dtype=np.float32).reshape(100, 30) * step
    return {"model": {"w": w, "b": np.full(7, step, np.float64)}, "optim": {"m": w / 2}, "step": step}


def test_heal_gives_a_joiner_the_live_members_state_in_place(coordinator: str) -> None:
    shrunk = threading.Barrier(3)

    def rank_main(rank: int) -> dict[str, Any]:
        if rank == 3:  # the joiner: a stale state of the right layout, filled in place
            shrunk.wait(30)
            with netcoll.sync.connect(coordinator, elastic=True, timeout=30) as comm:
                mine = state_of(0)
                w = mine["model"]["w"]
                got = comm.heal(mine, timeout=30, slice_bytes=4096, chunk_bytes=4096)
                assert got["model"]["w"] is w  # in place
                return {"joined": comm.joined, "state": got}
        with netcoll.sync.connect(coordinator, world_size=3, rank=rank) as comm:
            alone = state_of(5)
            assert comm.heal(alone)["model"]["w"] is alone["model"]["w"]  # nobody joined: its own state back
            if rank == 1:
                return {}
            new = comm.regroup(timeout=30)
            shrunk.wait(30)
            grown = new
            while grown is new:
                grown = new.regroup(timeout=30)
            mine = state_of(5)
            got = grown.heal(mine, timeout=30, slice_bytes=4096, chunk_bytes=4096)
            assert got["model"]["w"] is mine["model"]["w"]  # a live member keeps its own
            return {"joined": grown.joined, "state": got}

    got = in_threads(4, rank_main)
    assert not got[0]["joined"] and got[3]["joined"]
    want = state_of(5)
    for r in (0, 2, 3):
        s = got[r]["state"]
        assert s["step"] == 5
        np.testing.assert_array_equal(s["model"]["w"], want["model"]["w"])
        np.testing.assert_array_equal(s["model"]["b"], want["model"]["b"])
        np.testing.assert_array_equal(s["optim"]["m"], want["optim"]["m"])


def test_heal_raises_the_typed_error_in_the_caller(coordinator: str) -> None:
    def rank_main(rank: int) -> str:
        with netcoll.sync.connect(coordinator, world_size=2, rank=rank) as comm:
            with pytest.raises(TypeError) as info:
                comm.heal({"model": {"w": object()}, "step": 1})
            return str(info.value)

    for message in in_threads(2, rank_main):
        assert "model/w" in message
