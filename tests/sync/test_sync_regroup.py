"""``netcoll.sync``'s blocking regroup and elastic connect: the same rounds as the
async API (tests/rendezvous/test_regroup.py), from plain threads."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import netcoll.sync
from tests.sync.conftest import in_threads


def test_regroup_blocks_shrinks_and_admits_an_elastic_newcomer(coordinator: str) -> None:
    shrunk = threading.Barrier(3)  # ranks 0 and 2 regrouped; the newcomer may come

    def rank_main(rank: int) -> dict[str, Any]:
        if rank == 3:
            shrunk.wait(30)
            with netcoll.sync.connect(coordinator, elastic=True, timeout=30) as comm:
                step = comm.broadcast(np.zeros(1, np.int64), root=0)
                y = comm.all_reduce(np.full(2, comm.rank + 1.0))
                return {"rank": comm.rank, "size": comm.world_size, "joined": comm.joined, "step": int(step[0]), "y": y}
        with netcoll.sync.connect(coordinator, world_size=3, rank=rank) as comm:
            assert comm.regroup(timeout=30) is comm  # nothing changed: the same communicator
            if rank == 1:
                return {}  # leaves
            new = comm.regroup(timeout=30)
            assert comm.closed and not new.closed and (new.rank, new.world_size) == ({0: 0, 2: 1}[rank], 2)
            shrunk.wait(30)
            grown = new
            while grown is new:
                grown = new.regroup(timeout=30)
            step = grown.broadcast(np.array([11 if grown.rank == 0 else 0]), root=0)
            y = grown.all_reduce(np.full(2, grown.rank + 1.0))
            out = {"rank": grown.rank, "size": grown.world_size, "joined": grown.joined, "step": int(step[0]), "y": y}
        # leaving the first communicator's block closed the current one and ended the session
        assert grown.closed and not grown._runner.thread.is_alive()
        return out

    got = in_threads(4, rank_main)
    assert got[1] == {}
    for r, rank in ((0, 0), (2, 1), (3, 2)):
        out = got[r]
        assert (out["rank"], out["size"], out["joined"], out["step"]) == (rank, 3, r == 3, 11), out
        np.testing.assert_array_equal(out["y"], [6.0, 6.0])
