"""Calls ``mypy --strict`` must reject; each line marked ``# E: code`` is
expected to fail with that error code, and no other line may fail
(tests/comm/test_typing.py). Not run: only type-checked."""

from typing import Any

import numpy as np

import netcoll
import netcoll.sync

Array = np.ndarray[Any, Any]


async def wrong(comm: netcoll.Communicator, x: Array, op_name: str) -> None:
    await comm.all_reduce(x, op="average")  # E: call-overload
    await comm.all_reduce(x, op=op_name)  # E: call-overload
    await comm.all_reduce(x, algorithm="rign")  # E: call-overload
    await comm.reduce_scatter(x, op="mean")  # E: call-overload
    await comm.barrier(algorithm="ring")  # E: arg-type
    await comm.send(x, dst="1")  # E: arg-type
    y: str = await comm.all_reduce(x)  # E: assignment
    (await comm.reduce(x)).sum()  # E: union-attr
    (await comm.gather(x, uneven=True))[0]  # E: index
    print(y)


def wrong_sync(comm: netcoll.sync.SyncCommunicator, x: Array) -> None:
    comm.all_reduce(x, op="average")  # E: arg-type
    comm.all_gather(x, algorithm="tree")  # E: arg-type
