"""Data parallel training (DDP) with a plain numpy model: every rank holds the
whole model and trains on its shard of each batch; after the backward pass the
gradients, flattened into one buffer (DDP's bucket), are averaged with one
all_reduce, so every rank applies the same update.

    netcoll run -n 4 examples/training/ddp.py

At the end, rank 0 checks the result against the same training done on whole
batches in one process, and that every rank holds bit-identical parameters.
"""

import numpy as np
from mlp import NAMES, STEPS, batch, flatten, grads, init_params, shard, train_single_process, unflatten

import netcoll.sync

LR = 0.1

with netcoll.sync.connect() as comm:  # under `netcoll run`: coordinator, rank, size from the environment
    params = init_params()  # the same seed everywhere: every rank starts from the same model
    for step in range(STEPS):
        x, y = shard(batch(step), comm.rank, comm.world_size)
        g = flatten(grads(params, x, y))
        g = comm.all_reduce(g, op="avg")  # blocks; the average over ranks = the whole batch's gradient
        g = unflatten(g, params)
        for k in NAMES:
            params[k] = params[k] - LR * g[k]

    everyone = comm.all_gather(flatten(params))  # row r: rank r's parameters
    if comm.rank == 0:
        assert (everyone == everyone[0]).all(), "ranks disagree"
        reference = flatten(train_single_process(LR))
        diff = np.abs(everyone[0] - reference).max()
        assert np.allclose(everyone[0], reference, rtol=1e-9, atol=1e-12), diff
        print(
            f"ddp: {STEPS} steps on {comm.world_size} ranks; parameters identical on every rank; "
            f"max |difference| from single-process training {diff:.1e}"
        )
