"""The training of bench/chaos_training.py: a small MLP in numpy, its data fixed by
the step, and one rank's elastic loop over ``netcoll.sync`` (regroup, agree,
heal, go on), printing one JSON event per line with the rank's wall clock."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import numpy as np

BATCH = 48  # samples per step, split over the live ranks (divides by 1, 2, 3, 4, 6, 8)
IN, HIDDEN, OUT = 32, 64, 8
LR, MOMENTUM = 0.05, 0.9
GROUP = "chaos"
Array = np.ndarray[Any, Any]
Params = dict[str, Array]


def init() -> tuple[Params, Params]:
    """The parameters (the same in every process) and zero momentum."""
    rng = np.random.default_rng(0)
    params = {
        "w1": (rng.standard_normal((IN, HIDDEN)) / np.sqrt(IN)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.standard_normal((HIDDEN, OUT)) / np.sqrt(HIDDEN)).astype(np.float32),
        "b2": np.zeros(OUT, np.float32),
    }
    return params, {k: np.zeros_like(v) for k, v in params.items()}


def batch(step: int) -> tuple[Array, Array]:
    """The whole batch of ``step`` (``step`` -1: the evaluation batch)."""
    rng = np.random.default_rng(1000 + step if step >= 0 else 7)
    n = BATCH if step >= 0 else 1024
    x = rng.standard_normal((n, IN)).astype(np.float32)
    return x, (np.sin(x[:, :OUT]) + 0.1 * rng.standard_normal((n, OUT))).astype(np.float32)


def shard(step: int, rank: int, world: int) -> tuple[Array, Array]:
    n = BATCH // world
    x, y = batch(step)
    return x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]


def loss_and_grads(p: Params, x: Array, y: Array) -> tuple[float, Params]:
    """Mean squared error of the MLP on (x, y) and its gradients."""
    h = np.tanh(x @ p["w1"] + p["b1"])
    err = h @ p["w2"] + p["b2"] - y
    d_out = 2 * err / err.size
    d_h = (d_out @ p["w2"].T) * (1 - h * h)
    grads = {"w1": x.T @ d_h, "b1": d_h.sum(0), "w2": h.T @ d_out, "b2": d_out.sum(0)}
    return float((err * err).mean()), grads


def apply(p: Params, m: Params, grads: Params) -> None:
    for k in p:
        m[k] *= MOMENTUM
        m[k] += grads[k]
        p[k] -= LR * m[k]


def flat(p: Params) -> Array:
    return np.concatenate([p[k].reshape(-1) for k in sorted(p)])


def replay(steps: int) -> Params:
    """``steps`` steps in one process, no failure: the reference."""
    p, m = init()
    for step in range(steps):
        apply(p, m, loss_and_grads(p, *batch(step))[1])
    return p


def compare(done: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """The ranks' final parameters against each other and against :func:`replay`."""
    if not done:
        return {"identical": False, "ranks": 0}
    got = {k: np.asarray(v, np.float32) for k, v in done[0]["params"].items()}
    want = replay(steps)
    loss, ref = loss_and_grads(got, *batch(-1))[0], loss_and_grads(want, *batch(-1))[0]
    return {
        "ranks": len(done),
        "identical": len({d["digest"] for d in done}) == 1,
        "steps": done[0]["step"],
        "eval_loss": round(loss, 6),
        "reference_eval_loss": round(ref, 6),
        "loss_diff_pct": 100 * abs(loss - ref) / ref,
        "max_param_diff": float(np.abs(flat(got) - flat(want)).max()),
    }


# -- one rank ------------------------------------------------------------------------------
def emit(**event: Any) -> None:
    print(json.dumps({**event, "time": time.time()}), flush=True)


def recover(comm: Any, p: Params, m: Params, step: int) -> int:
    """After a regroup, on every rank: the most advanced survivor's state (survivors may
    have stopped a step apart), then heal for the joiners; the step to go on from."""
    steps = comm.all_gather(np.array([-1 if comm.joined else step], np.int64))[:, 0]
    live = steps[steps >= 0]
    if live.min() != live.max():
        source = int(np.argmax(steps))
        both = comm.broadcast(np.concatenate([flat(p), flat(m)]), root=source)
        half = both.size // 2
        for dst, src in ((p, both[:half]), (m, both[half:])):
            offset = 0
            for k in sorted(dst):
                dst[k][...] = src[offset : offset + dst[k].size].reshape(dst[k].shape)
                offset += dst[k].size
        step = int(steps[source])
    state = comm.heal({"params": p, "momentum": m, "step": step}, timeout=60)
    return int(state["step"])


def run_rank(address: str, rank: int | None, steps: int, regroup_every: int, pause: float) -> None:
    import netcoll.sync
    from netcoll.errors import NetcollError

    joining = rank is None
    comm = netcoll.sync.connect(
        address, group=GROUP, world_size=None if joining else 4, rank=rank, elastic=joining, collective_timeout=30
    )
    p, m = init()
    step = 0
    if joining:
        step = recover(comm, p, m, step)
        emit(event="joined", rank=comm.rank, world=comm.world_size, step=step)
    while step < steps:
        try:
            loss, grads = loss_and_grads(p, *shard(step, comm.rank, comm.world_size))
            both = comm.all_reduce(np.append(flat(grads), np.float32(loss)), op="avg")
            offset = 0
            for k in sorted(grads):
                grads[k] = both[offset : offset + grads[k].size].reshape(grads[k].shape)
                offset += grads[k].size
            apply(p, m, grads)
            step += 1
            emit(event="step", step=step, rank=comm.rank, world=comm.world_size, loss=float(both[-1]))
            time.sleep(pause)  # stands for the rest of a step's work (forward and backward of a real model)
            if step % regroup_every or step == steps:
                continue
            new = comm.regroup(timeout=60)
        except NetcollError as exc:
            emit(event="failed", step=step, rank=comm.rank, error=f"{type(exc).__name__}: {exc}"[:200])
            new = comm.regroup(timeout=60)
        if new is not comm:
            old, comm = comm, new
            step = recover(comm, p, m, step)
            emit(event="regrouped", rank=comm.rank, old_rank=old.rank, world=comm.world_size, step=step)
    digest = hashlib.sha256(flat(p).tobytes()).hexdigest()
    emit(event="done", rank=comm.rank, step=step, digest=digest, params={k: v.tolist() for k, v in p.items()})
    comm.close()
