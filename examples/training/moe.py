"""Mixture-of-experts token routing with all_to_all: rank r holds expert r and
a batch of tokens (a different number on each rank). A router sends each token
to its best-scoring expert: one all_to_all of per-destination lists (uneven
sizes, as MPI's alltoallv) carries the tokens to their experts, the experts run,
and a second all_to_all brings the outputs back in the order they were sent.

    netcoll run -n 4 examples/training/moe.py

Every rank checks its outputs against running each token through its expert
in one process.
"""

import numpy as np

import netcoll.sync

D = 8


def tokens(rank):
    """Rank ``rank``'s tokens: 5, 8, 11, ... of them (uneven on purpose)."""
    return np.random.default_rng(rank).normal(size=(5 + 3 * rank, D))


def weights(n):
    rng = np.random.default_rng(1234)
    return rng.normal(size=(D, n)), [rng.normal(0, 0.5, (D, D)) for _ in range(n)]  # router, experts


def route(x, router):
    """Each token's expert (top-1) and gate (its softmax probability)."""
    scores = x @ router
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    expert = probs.argmax(axis=1)
    return expert, probs[np.arange(len(x)), expert]


def expert_fn(w, x):
    return np.maximum(x @ w, 0.0)


with netcoll.sync.connect() as comm:
    n, r = comm.world_size, comm.rank
    router, experts = weights(n)
    x = tokens(r)
    expert, gate = route(x, router)

    order = np.argsort(expert, kind="stable")  # tokens grouped by destination expert
    outgoing = [x[order][expert[order] == j] for j in range(n)]  # list j: the tokens for expert j
    incoming = comm.all_to_all(outgoing)  # list i: the tokens rank i sent to our expert
    processed = [expert_fn(experts[r], t) for t in incoming]  # (one call on the concatenation, in practice)
    returned = comm.all_to_all(processed)  # list j: our tokens, back from expert j, in the order sent
    y = np.empty_like(x)
    y[order] = np.concatenate(returned)  # undo the grouping
    y *= gate[:, None]

    reference = np.stack([gate[t] * expert_fn(experts[expert[t]], x[t]) for t in range(len(x))])
    assert np.allclose(y, reference, rtol=1e-12, atol=1e-12)
    counts = comm.all_gather(np.bincount(expert, minlength=n))  # row i: tokens rank i sent to each expert
    if r == 0:
        print(
            f"moe: {counts.sum()} tokens on {n} ranks routed to {n} experts; tokens per expert "
            f"{counts.sum(axis=0).tolist()}; every rank's outputs match the single-process computation"
        )
