"""ZeRO-3 / FSDP style sharding with a plain numpy model: each rank keeps only
its 1/N shard of the (flattened) parameters and of the optimizer state. Every
step it gathers the whole parameters for the forward and backward pass
(all_gather), drops them again, and gets back just its shard of the averaged
gradient (reduce_scatter), which it applies to its shard with momentum SGD.

    netcoll run -n 4 examples/training/zero3.py

At the end, rank 0 checks the gathered parameters against the same training
done on whole batches in one process.
"""

import numpy as np
from mlp import STEPS, batch, flatten, grads, init_params, shard, train_single_process, unflatten

import netcoll.sync

LR, MOMENTUM = 0.05, 0.9

with netcoll.sync.connect() as comm:
    n, rank = comm.world_size, comm.rank
    like = init_params()  # shapes only, to unflatten the gathered vector
    full = flatten(like)
    size = -(-full.size // n)  # shard length; the flat vector is padded to n * size
    padded = np.zeros(n * size)
    padded[: full.size] = full
    my_params = padded[rank * size : (rank + 1) * size].copy()  # all this rank keeps
    my_velocity = np.zeros(size)  # and its share of the optimizer state

    for step in range(STEPS):
        params = comm.all_gather(my_params).reshape(-1)[: full.size]  # whole parameters, for this step only
        x, y = shard(batch(step), rank, n)
        g = np.zeros(n * size)
        g[: full.size] = flatten(grads(unflatten(params, like), x, y))
        del params  # ZeRO-3: the whole parameters do not outlive the step
        my_grad = comm.reduce_scatter(g.reshape(n, size), op="avg")  # row `rank` of the average
        my_velocity = MOMENTUM * my_velocity + my_grad
        my_params = my_params - LR * my_velocity

    final = comm.gather(my_params, root=0)  # only for the check below
    if rank == 0:
        final = final.reshape(-1)[: full.size]
        reference = flatten(train_single_process(LR, MOMENTUM))
        diff = np.abs(final - reference).max()
        assert np.allclose(final, reference, rtol=1e-9, atol=1e-12), diff
        print(
            f"zero3: {STEPS} steps on {n} ranks, {size} of {full.size} parameters per rank; "
            f"max |difference| from single-process training {diff:.1e}"
        )
