"""netcoll.sync's all_reduce(partial=True): blocking, it returns the array; with
async_op=True the Work names the contributors."""

from __future__ import annotations

import numpy as np

import netcoll.sync
from tests.sync.conftest import in_threads


def test_partial_blocks_and_async_op_names_the_contributors(coordinator: str) -> None:
    def rank(r: int) -> tuple[np.ndarray, object, np.ndarray]:
        with netcoll.sync.connect(coordinator, world_size=3, rank=r, timeout=30) as comm:
            y = comm.all_reduce(np.full(6, r + 1.0), op="avg", partial=True, timeout=30)
            work = comm.all_reduce(np.full(6, r + 1.0), partial=True, deadline=20.0, async_op=True)
            z = work.wait(60)
            return y, work.contributors, z

    for y, contributors, z in in_threads(3, rank):
        np.testing.assert_array_equal(y, np.full(6, 2.0))
        assert contributors == (0, 1, 2)
        np.testing.assert_array_equal(z, np.full(6, 6.0))
