"""The README's embedded example: four ranks as tasks in one process, joined at
an in-process coordinator, averaging a gradient-sized array over real TCP.

    python3 examples/embedded.py        # prints [1.5 1.5 1.5]
"""

import asyncio

import numpy as np

import netcoll


async def main():
    async with netcoll.Coordinator() as coord:  # or a `netcoll coordinator` process

        async def rank(i):
            async with netcoll.connect(coord.address, world_size=4) as comm:  # rank assigned
                grads = np.full(1_000_000, comm.rank, np.float32)
                return await comm.all_reduce(grads, op="avg")

        print((await asyncio.gather(*(rank(i) for i in range(4))))[0][:3])  # [1.5 1.5 1.5]


asyncio.run(main())
