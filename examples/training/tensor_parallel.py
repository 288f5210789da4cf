"""Megatron-style tensor parallelism of an MLP block, Y = act(X A) B + b: the
first weight A is split by columns and the second, B, by rows, so rank r
computes act(X A_r) B_r from its own shards with no communication, and one
all_reduce (sum) of those partial outputs gives Y on every rank. The backward
pass then needs no communication for the weights' gradients.

    netcoll run -n 4 examples/training/tensor_parallel.py

At the end, rank 0 checks the gathered weights against training the unsplit
block in one process.
"""

import numpy as np

import netcoll.sync

D, F, BATCH, STEPS, LR = 8, 32, 16, 20, 0.05


def init():
    rng = np.random.default_rng(0)
    return rng.normal(0, 0.3, (D, F)), rng.normal(0, 0.3, (F, D)), np.zeros(D)


def data(step):
    x = np.random.default_rng(100 + step).normal(size=(BATCH, D))
    return x, np.roll(x, 1, axis=1) * 0.5  # a target the block can learn


def step_block(a, b, bias, x, target, all_reduce=lambda z: z):
    """One SGD step on the block (or on this rank's shards of it); the new weights."""
    h = np.tanh(x @ a)  # (BATCH, F / n): this rank's columns of the hidden layer
    y = all_reduce(h @ b) + bias  # the partial sums of all ranks: Y everywhere
    d_y = 2.0 * (y - target) / y.size
    d_h = (d_y @ b.T) * (1.0 - h**2)
    return a - LR * (x.T @ d_h), b - LR * (h.T @ d_y), bias - LR * d_y.sum(axis=0)


with netcoll.sync.connect() as comm:
    n, r = comm.world_size, comm.rank
    assert F % n == 0, f"the hidden size {F} must split evenly over {n} ranks"
    cols = slice(r * F // n, (r + 1) * F // n)
    a, b, bias = init()
    a, b = a[:, cols].copy(), b[cols, :].copy()  # this rank's column shard of A, row shard of B
    for step in range(STEPS):
        a, b, bias = step_block(a, b, bias, *data(step), all_reduce=lambda z: comm.all_reduce(z, op="sum"))

    a_shards, b_shards = comm.gather(a, root=0), comm.gather(b, root=0)  # only for the check below
    if r == 0:
        ref_a, ref_b, ref_bias = init()
        for step in range(STEPS):
            ref_a, ref_b, ref_bias = step_block(ref_a, ref_b, ref_bias, *data(step))
        got_a, got_b = np.concatenate(list(a_shards), axis=1), np.concatenate(list(b_shards), axis=0)
        diff = max(np.abs(got_a - ref_a).max(), np.abs(got_b - ref_b).max(), np.abs(bias - ref_bias).max())
        assert diff < 1e-9, diff
        print(
            f"tensor_parallel: {STEPS} steps on {n} ranks, hidden {F} split {F // n} per rank; "
            f"max |difference| from the unsplit block {diff:.1e}"
        )
