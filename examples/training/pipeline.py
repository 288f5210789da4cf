"""Pipeline parallelism with micro-batches (a GPipe schedule): rank r holds
layer r of the network. Each batch is cut into micro-batches; every stage
receives a micro-batch's activations from the previous stage (recv), runs its
layer and sends the result on (send), the last stage computes the loss, and the
gradients flow back the same way. Each stage accumulates its layer's gradient
over the micro-batches and updates once per batch.

    netcoll run -n 4 examples/training/pipeline.py

At the end, rank 0 checks every stage's weights against training the whole
network on whole batches in one process.
"""

import numpy as np

import netcoll.sync

D, BATCH, MICRO, STEPS, LR = 8, 32, 4, 10, 0.1
FORWARD, BACKWARD = 0, 1  # message tags: activations and gradients are separate streams


def init(n):
    rng = np.random.default_rng(0)
    return [rng.normal(0, 0.4, (D, D)) for _ in range(n)]  # layer k: tanh(x W_k); the last is linear


def data(step):
    x = np.random.default_rng(50 + step).normal(size=(BATCH, D))
    return x, np.cos(x)


def layer(w, x, last):
    return x @ w if last else np.tanh(x @ w)


def layer_backward(w, x, out, d_out, last):
    """Gradients of a layer's weight and input, given its output's gradient."""
    d_pre = d_out if last else d_out * (1.0 - out**2)
    return x.T @ d_pre, d_pre @ w.T


def train_stage(comm, w, step):
    """This rank's part of one batch: forwards of every micro-batch, then backwards."""
    r, n = comm.rank, comm.world_size
    last = r == n - 1
    x_all, t_all = data(step)
    micro = np.split(np.arange(BATCH), MICRO)
    saved, sends, d_w = [], [], np.zeros_like(w)
    for m in micro:  # forward: activations flow 0 -> n-1
        x = x_all[m] if r == 0 else comm.recv(r - 1, FORWARD)
        out = layer(w, x, last)
        saved.append((x, out))
        if not last:
            sends.append(comm.send(out, r + 1, FORWARD, async_op=True))  # don't wait: go on computing
    for m, (x, out) in reversed(list(zip(micro, saved, strict=True))):  # backward: gradients flow n-1 -> 0
        d_out = 2.0 * (out - t_all[m]) / (BATCH * D) if last else comm.recv(r + 1, BACKWARD)
        g, d_x = layer_backward(w, x, out, d_out, last)
        d_w += g
        if r > 0:
            sends.append(comm.send(d_x, r - 1, BACKWARD, async_op=True))
    for work in sends:
        work.wait()
    return w - LR * d_w


with netcoll.sync.connect() as comm:
    w = init(comm.world_size)[comm.rank]
    for step in range(STEPS):
        w = train_stage(comm, w, step)

    stages = comm.gather(w, root=0)
    if comm.rank == 0:
        ref = init(comm.world_size)
        for step in range(STEPS):  # the whole network, whole batches, one process
            x, t = data(step)
            acts = [x]
            for k, wk in enumerate(ref):
                acts.append(layer(wk, acts[-1], k == len(ref) - 1))
            d = 2.0 * (acts[-1] - t) / (BATCH * D)
            for k in reversed(range(len(ref))):
                g, d = layer_backward(ref[k], acts[k], acts[k + 1], d, k == len(ref) - 1)
                ref[k] = ref[k] - LR * g
        diff = max(np.abs(stages[k] - ref[k]).max() for k in range(len(ref)))
        assert diff < 1e-9, diff
        print(
            f"pipeline: {STEPS} batches of {MICRO} micro-batches through {comm.world_size} stages; "
            f"max |difference| from single-process training {diff:.1e}"
        )
