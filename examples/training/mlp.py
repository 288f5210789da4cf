"""The small numpy model the data-parallel examples train (ddp.py, zero3.py):
a two-layer MLP regressing y = sin(sum(x)), its gradients by hand, the data,
and plain single-process training to compare against."""

import numpy as np

D_IN, D_HID, D_OUT = 8, 32, 1
BATCH = 48  # the global batch: split over the ranks (1, 2, 3, 4, 6 or 8 of them)
STEPS = 20
NAMES = ("w1", "b1", "w2", "b2")


def init_params(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.normal(0.0, 0.5, (D_IN, D_HID)),
        "b1": np.zeros(D_HID),
        "w2": rng.normal(0.0, 0.5, (D_HID, D_OUT)),
        "b2": np.zeros(D_OUT),
    }


def batch(step):
    """The global batch of ``step`` (every rank can make it; each uses its shard)."""
    x = np.random.default_rng(1000 + step).normal(size=(BATCH, D_IN))
    return x, np.sin(x.sum(axis=1, keepdims=True))


def shard(arrays, rank, world_size):
    """Rank ``rank``'s equal share of each array's rows."""
    assert BATCH % world_size == 0, f"the batch of {BATCH} must split evenly over {world_size} ranks"
    n = BATCH // world_size
    return [a[rank * n : (rank + 1) * n] for a in arrays]


def grads(p, x, y):
    """Gradients of the mean squared error over the rows of ``x``."""
    h = np.tanh(x @ p["w1"] + p["b1"])
    d_out = 2.0 * (h @ p["w2"] + p["b2"] - y) / len(x)
    d_h = (d_out @ p["w2"].T) * (1.0 - h**2)
    return {"w1": x.T @ d_h, "b1": d_h.sum(axis=0), "w2": h.T @ d_out, "b2": d_out.sum(axis=0)}


def loss(p, x, y):
    """The mean squared error of the model ``p`` on the rows of ``x``."""
    h = np.tanh(x @ p["w1"] + p["b1"])
    return float(np.mean((h @ p["w2"] + p["b2"] - y) ** 2))


def flatten(tensors):
    return np.concatenate([tensors[k].ravel() for k in NAMES])


def unflatten(flat, like):
    out, at = {}, 0
    for k in NAMES:
        out[k] = flat[at : at + like[k].size].reshape(like[k].shape)
        at += like[k].size
    return out


def train_single_process(lr, momentum=0.0, steps=STEPS, data=batch):
    """The reference: whole batches (``data(step)``), one process, SGD (with momentum)."""
    p = init_params()
    velocity = {k: np.zeros_like(v) for k, v in p.items()}
    for step in range(steps):
        g = grads(p, *data(step))
        for k in NAMES:
            velocity[k] = momentum * velocity[k] + g[k]
            p[k] = p[k] - lr * velocity[k]
    return p
