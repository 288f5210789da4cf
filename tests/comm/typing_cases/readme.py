"""The README's examples and the typed results of every collective, checked by
``mypy --strict`` in tests/comm/test_typing.py (``assert_type`` fails the check
when an inferred type differs). Not run: only type-checked."""

import asyncio
from typing import Any, assert_type

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

import netcoll
import netcoll.sync
from netcoll import ReduceOp, Work

Array = np.ndarray[Any, Any]


# -- README, "Embedded use" (annotated as --strict requires) ---------------------------------------
async def main() -> None:
    async with netcoll.Coordinator() as coord:  # or a `netcoll coordinator` process

        async def rank(i: int) -> npt.NDArray[Any]:
            async with netcoll.connect(coord.address, world_size=4) as comm:  # rank assigned
                grads = np.full(1_000_000, comm.rank, np.float32)
                return await comm.all_reduce(grads, op="avg")

        print((await asyncio.gather(*(rank(i) for i in range(4))))[0][:3])  # [1.5 1.5 1.5]


asyncio.run(main())


# -- README, a Work in flight --------------------------------------------------------------------
async def load_next_batch() -> Array:
    return np.zeros(4)


async def in_flight(comm: netcoll.Communicator, grads: Array) -> Array:
    work = comm.all_reduce(grads)  # sequence number taken here
    assert_type(work, Work[Array])
    other = await load_next_batch()
    grads = await work
    return grads + other


# -- README, "Training scripts" ------------------------------------------------------------------
def training(grads: Array, shard: Array) -> None:
    with netcoll.sync.connect() as comm:
        grads = comm.all_reduce(grads, op="avg")
        work = comm.all_gather(shard, async_op=True)
        params = work.wait()
        print(grads, params)


# -- README, the job service from Python ---------------------------------------------------------
async def client(a0: Array, a1: Array, a2: Array, a3: Array) -> None:
    async with netcoll.Client("127.0.0.1:29400") as client:
        job = await client.run("all_reduce", inputs=[a0, a1, a2, a3])
        print(job["state"], job["result"], job["timings"])


# -- the result of every collective --------------------------------------------------------------
async def results(comm: netcoll.Communicator, x: npt.NDArray[np.float32], rows: Array) -> None:
    assert_type(await comm.all_reduce(x), Array)
    assert_type(await comm.all_reduce([1.0, 2.0], op=ReduceOp.MAX), Array)
    assert_type(await comm.all_reduce(3.5, op="sum", timeout=10, algorithm="ring"), Array)
    assert_type(await comm.reduce(x, root=1), Array | None)
    assert_type(await comm.reduce_scatter(rows, op="min"), Array)
    assert_type(await comm.reduce_scatter([x, x]), Array)
    assert_type(await comm.all_gather(x), Array)
    assert_type(await comm.all_gather(x, uneven=True), list[Array])
    assert_type(await comm.gather(x, root=0), Array | None)
    assert_type(await comm.gather(x, uneven=True), list[Array] | None)
    assert_type(await comm.broadcast(x, root=0), Array)
    assert_type(await comm.broadcast(None, root=0), Any)  # as the root sent it: an array or a tensor
    assert_type(await comm.scatter(rows), Array)
    assert_type(await comm.all_to_all(rows, out=np.empty_like(rows)), Array)
    assert_type(await comm.all_to_all([x, x]), list[Any])
    assert_type(await comm.barrier(), None)
    assert_type(await comm.send(x, 1, tag=3), None)
    assert_type(await comm.recv(0), Any)
    assert_type(await comm.split(comm.rank % 2), netcoll.Communicator | None)
    assert_type(comm.rank, int)


# -- torch tensors in: the same type out; torch.distributed.ReduceOp values as ops -------------------
async def tensors(comm: netcoll.Communicator, t: torch.Tensor, p: torch.nn.Parameter) -> None:
    assert_type(await comm.all_reduce(t, op=dist.ReduceOp.SUM), torch.Tensor)
    assert_type(await comm.all_reduce(p), torch.Tensor)  # a new tensor, as detach() gives
    assert_type(await comm.all_gather(t), torch.Tensor)
    assert_type(await comm.all_gather(t, uneven=True), list[torch.Tensor])
    assert_type(await comm.reduce(t, op=dist.ReduceOp.AVG), torch.Tensor | None)
    assert_type(await comm.broadcast(t), torch.Tensor)
    assert_type(await comm.all_to_all([t, t]), list[torch.Tensor])
    assert_type(await comm.reduce_scatter([t, t]), torch.Tensor)


def untyped_work(work: Work) -> None:  # a bare Work is Work[Any] (no error under --strict)
    assert_type(work.result(), Any)
