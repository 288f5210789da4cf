"""Collective algorithms, one module per family, and the table that picks one.

Algorithms are coroutines over a :class:`~netcoll.transport.base.Channel`
(one operation's ``send``/``recv`` to group ranks); they know nothing of
sockets, the coordinator or the wire. They work in place on caller buffers
(C-contiguous numpy arrays), fold with :func:`netcoll.ops.reduce_into`, and
never call :func:`netcoll.ops.finalize` — ``avg`` comes back as a sum and the
caller divides once. Every rank of one operation must run the same algorithm
with the same sizes and the same ``segment_bytes``.

Uniform signatures, per collective (``ALGORITHMS[collective][name]``); every
one also takes ``segment_bytes: int = DEFAULT_SEGMENT_BYTES`` as a keyword:

==================  =========================  ==============================================
collective          algorithms                 call
==================  =========================  ==============================================
``all_reduce``      ring, tree, doubling,      ``fn(ch, buf, op) -> None``  (buf in place,
                    allpairs, halving          bit-identical on every rank)
``broadcast``       tree, ring                 ``fn(ch, buf_or_None, root, meta=None)
                                               -> (buf, meta)``
``reduce``          tree, ring                 ``fn(ch, buf, op, root) -> None``  (result in
                                               the root's buf; others' buf clobbered)
``all_gather``      ring, doubling             ``fn(ch, buf) -> None``  (P equal blocks, own
                                               block filled; the rest are filled)
``reduce_scatter``  ring, halving              ``fn(ch, buf, op, out) -> None``  (buf: P
                                               blocks, read-only; out: one block)
``all_to_all``      pairwise, linear           ``fn(ch, send, recv) -> None``  (P blocks each)
``gather``          direct                     ``fn(ch, send, recv_or_None, root) -> None``
``scatter``         direct                     ``fn(ch, send_or_None, recv, root) -> None``
``barrier``         doubling                   ``fn(ch) -> None``
==================  =========================  ==============================================

Block buffers (all_gather, all_to_all, gather, scatter) are handled as raw
bytes; reduction buffers keep their dtype. :func:`choose` maps
``algorithm="auto"`` to a name by the table below; :func:`decide` maps it to
``(name, segment_bytes, predicted seconds)`` by the cost model
(:mod:`.cost`) when the group's parameters are known, and
:func:`overrides_from_env` reads ``NETCOLL_ALGO``. Point-to-point messages of any size use
:func:`netcoll.algorithms.direct.send_message` / ``recv_message``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..errors import ConfigError
from . import allpairs, cost, direct, doubling, halving, linear, pairwise, probe, ring, tree, tuning
from ._common import DEFAULT_SEGMENT_BYTES

__all__ = [
    "ALGORITHMS",
    "ALGO_ENV",
    "DEFAULT_SEGMENT_BYTES",
    "allpairs",
    "choose",
    "cost",
    "decide",
    "overrides_from_env",
    "parse_overrides",
    "probe",
    "tuning",
    "direct",
    "doubling",
    "linear",
    "pairwise",
    "ring",
    "tree",
]

#: all_reduce thresholds, measured on 2 cores with 2, 4 and 8 rank processes over loopback TCP
#: (docs/benchmarks.md, "Algorithm crossovers"): below ALL_REDUCE_DOUBLING_MAX_BYTES recursive
#: doubling (latency-bound: log2 P rounds); with 3+ ranks, below ALL_REDUCE_TREE_MAX_BYTES the
#: pipelined binomial tree (reduce + broadcast: fewer, larger messages than the ring's 2(P-1)
#: steps); above, the ring (bandwidth-optimal). Two ranks: the ring from 64 KiB on. Three and
#: four ranks: doubling below 128 KiB (two rounds; at 64 KiB it beat the tree by 31 % in the
#: crossover table, and in 2026-11-26's 400-call medians by 8 % over TCP and level over shared
#: memory; at 128 KiB the tree was 7 % ahead over TCP); from 5 ranks doubling's log2 P rounds of
#: whole buffers lose to the tree earlier (8 ranks, 64 KiB: tree 0.064 GB/s, doubling 0.053).
ALL_REDUCE_DOUBLING_MAX_BYTES: Final = 32 * 1024
ALL_REDUCE_DOUBLING_MAX_BYTES_4: Final = 128 * 1024
ALL_REDUCE_DOUBLING_MAX_BYTES_2: Final = 64 * 1024
#: The tree's limit was 2 MiB (the ring overtook it between 1 and 4 MiB at 4 ranks, before the
#: tree read its input in place and folded out of the shared-memory ring). Measured 2026-11-26
#: (``python -m netcoll.bench.versus all_reduce``, each algorithm's own run, µs per call, tree /
#: ring, mean of 20, best of 3-4 rounds, two runs at 4 ranks): 4 ranks over shared memory
#: 2 MiB 7521 / 8552 and 3838 / 6341, 4 MiB 11231 / 10454 and 7676 / 8822, 8 MiB 12808 / 12814,
#: 16 MiB 33795 / 19962; over TCP 2 MiB 5858 / 7480 and 6496 / 8750, 4 MiB 10908 / 12409 and
#: 14586 / 12742, 8 MiB 23551 / 27049, 16 MiB 55099 / 49168; 8 ranks over shared memory 2 MiB
#: 12624 / 25373, 4 MiB 21080 / 26214, 8 MiB 37800 / 37546; over TCP 2 MiB 13406 / 26035,
#: 4 MiB 31437 / 36380, 8 MiB 55549 / 57318. So the tree runs below 4 MiB at 3-4 ranks (even
#: at 4 MiB) and below 8 MiB from 5 ranks (even at 8 MiB).
ALL_REDUCE_TREE_MAX_BYTES_4: Final = 4 * 1024 * 1024
ALL_REDUCE_TREE_MAX_BYTES: Final = 8 * 1024 * 1024
#: reduce of at least this many bytes, with 3+ ranks, uses the ring (reduce-scatter, then
#: chunks to the root: the root takes in (P-1)/P N instead of the tree's N per level);
#: measured at 4 ranks: 1 MiB tree 1.7 / ring 2.1 ms, 4 MiB 7.0 / 5.8, 16 MiB 30.5 / 22.5.
REDUCE_RING_MIN_BYTES: Final = 4 * 1024 * 1024
#: all_gather with an output (all P blocks) below this uses Bruck, else the ring. Measured
#: (ms per call, ring / Bruck): 4 ranks 1 MiB 1.52 / 1.10, 4 MiB 3.9 / 3.7, 16 MiB 16.6 / 16.2,
#: 64 MiB 63.8 / 67.9; 8 ranks 1 MiB 5.0 / 2.9, 4 MiB 11.5 / 9.2, 16 MiB 38.0 / 38.0.
ALL_GATHER_DOUBLING_MAX_BYTES: Final = 16 * 1024 * 1024
#: reduce_scatter of an input (all P blocks) below this uses recursive halving (log2 P rounds),
#: else the ring (P-1 steps). Measured 2026-11-26 after halving's rounds fold as pieces arrive
#: (``python -m netcoll.bench.versus reduce_scatter``, each algorithm's own run, µs per call,
#: ring / halving, mean of 20, best of 3 rounds; two runs where two are given): 4 ranks over
#: shared memory 256 KiB 1928 / 1290, 1 MiB 3125 / 1843 and 2522 / 2477, 2 MiB 3742 / 3538,
#: 4 MiB 6132 / 5635 and 4928 / 5328, 16 MiB 16010 / 21436; over TCP 256 KiB 2239 / 1655,
#: 1 MiB 3540 / 2844 and 3397 / 3008, 2 MiB 5287 / 4547, 4 MiB 7583 / 11549 and 7880 / 11395;
#: 8 ranks over shared memory 1 MiB 11383 / 7332, 2 MiB 13095 / 9521, 4 MiB 17878 / 13554,
#: 8 MiB 24326 / 22504; over TCP 1 MiB 14499 / 9809, 2 MiB 18980 / 13571, 4 MiB 24500 / 27494.
REDUCE_SCATTER_HALVING_MAX_BYTES: Final = 4 * 1024 * 1024
#: all_to_all of an input (all P blocks) below this uses the linear algorithm (every transfer at
#: once), else pairwise (one peer per step). Measured 2026-11-26 (``python -m netcoll.bench.versus
#: all_to_all``, each algorithm's own run, µs per call, pairwise / linear, mean of 20, best of 3
#: rounds): 4 ranks over shared memory 16 KiB 1136 / 945, 64 KiB 1051 / 915, 1 MiB 1572 / 1559,
#: 4 MiB 4404 / 6065, 16 MiB 17196 / 18046; over TCP 16 KiB 1477 / 865, 256 KiB 1374 / 1128,
#: 1 MiB 2667 / 1470, 4 MiB 6790 / 6283, 16 MiB 29014 / 29570; 8 ranks over shared memory
#: 64 KiB 6731 / 4313, 1 MiB 10147 / 6548, 4 MiB 15624 / 16330; over TCP 64 KiB 5307 / 5662,
#: 1 MiB 10134 / 7200, 4 MiB 16686 / 17280, 16 MiB 56284 / 57509.
ALL_TO_ALL_LINEAR_MAX_BYTES: Final = 4 * 1024 * 1024
#: broadcast of at least this many bytes uses the pipelined chain (every rank
#: sends N once) instead of the binomial tree (the root sends N*log2 P), when
#: there are enough ranks for that to matter. Only usable when every rank
#: knows N (not when non-roots receive into ``None``).
BROADCAST_CHAIN_MIN_BYTES: Final = 16 * 1024 * 1024
BROADCAST_CHAIN_MIN_RANKS: Final = 4

ALGORITHMS: Final[dict[str, dict[str, Callable[..., Any]]]] = {
    "all_reduce": {
        "ring": ring.all_reduce,
        "tree": tree.all_reduce,
        "doubling": doubling.all_reduce,
        "allpairs": allpairs.all_reduce,
        "halving": halving.all_reduce,
    },
    "broadcast": {"tree": tree.broadcast, "ring": ring.broadcast},
    "reduce": {"tree": tree.reduce, "ring": ring.reduce},
    "all_gather": {"ring": ring.all_gather, "doubling": doubling.all_gather},
    "reduce_scatter": {"ring": ring.reduce_scatter, "halving": halving.reduce_scatter},
    "all_to_all": {"pairwise": pairwise.all_to_all, "linear": linear.all_to_all},
    "gather": {"direct": direct.gather},
    "scatter": {"direct": direct.scatter},
    "barrier": {"doubling": doubling.barrier},
}


def choose(collective: str, nbytes: int, world_size: int) -> str:
    """The algorithm ``algorithm="auto"`` runs.

    Args:
        collective: a key of :data:`ALGORITHMS`.
        nbytes: the byte size of the collective's buffer: the array reduced
            (all_reduce, reduce), the whole ``P``-block array (all_gather's
            output, gather's output, reduce_scatter's and all_to_all's
            input). EVERY RANK MUST PASS THE SAME VALUE, or ranks would pick
            different algorithms: for broadcast and scatter only the root
            knows the size, so pass ``0`` there.
        world_size: ``P``.

    Raises:
        ValueError: unknown collective.
    """
    if collective not in ALGORITHMS:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(ALGORITHMS)}")
    if collective == "all_reduce":
        if world_size <= 2:
            return "doubling" if nbytes < ALL_REDUCE_DOUBLING_MAX_BYTES_2 or world_size == 1 else "ring"
        if nbytes < (ALL_REDUCE_DOUBLING_MAX_BYTES_4 if world_size <= 4 else ALL_REDUCE_DOUBLING_MAX_BYTES):
            return "doubling"
        return (
            "tree"
            if nbytes < (ALL_REDUCE_TREE_MAX_BYTES_4 if world_size <= 4 else ALL_REDUCE_TREE_MAX_BYTES)
            else "ring"
        )
    if collective == "all_gather":
        return "doubling" if nbytes < ALL_GATHER_DOUBLING_MAX_BYTES else "ring"
    if collective == "reduce_scatter":
        return "halving" if nbytes < REDUCE_SCATTER_HALVING_MAX_BYTES else "ring"
    if collective == "all_to_all":
        return "linear" if nbytes < ALL_TO_ALL_LINEAR_MAX_BYTES else "pairwise"
    if collective == "reduce":
        return "ring" if world_size >= 3 and nbytes >= REDUCE_RING_MIN_BYTES else "tree"
    if collective == "broadcast":
        if nbytes >= BROADCAST_CHAIN_MIN_BYTES and world_size >= BROADCAST_CHAIN_MIN_RANKS:
            return "ring"
        return "tree"
    return next(iter(ALGORITHMS[collective]))


#: collectives whose size only the root knows: the Communicator passes 0, so the model
#: cannot weigh their algorithms (the table's choice, at the default segment size)
SIZE_UNKNOWN: Final = ("broadcast", "scatter")


def decide(
    collective: str,
    nbytes: int,
    world_size: int,
    params: cost.Params | None,
    segment: int | None = None,
) -> tuple[str, int | None, float | None]:
    """``algorithm="auto"`` with the cost model: ``(algorithm, segment_bytes,
    predicted seconds)``: :func:`cost.learnt` (the model's candidates, then
    the fastest measured in this size band). ``params`` None (not agreed yet,
    or the model is off) or a size only the root knows: the table
    (:func:`choose`), segment and prediction None. ``segment``: the
    communicator's fixed segment size (set by the user), else the model picks
    one of :data:`cost.SEGMENTS`. Every rank passing the same arguments gets
    the same answer."""
    if params is None or collective in SIZE_UNKNOWN or world_size < 2:
        return choose(collective, nbytes, world_size), None, None
    return _decided(collective, nbytes, world_size, params, segment)


@functools.lru_cache(maxsize=4096)
def _decided(
    collective: str, nbytes: int, world_size: int, params: cost.Params, segment: int | None
) -> tuple[str, int | None, float]:
    """:func:`decide` by the model, remembered (every call of a training loop asks the same)."""
    segments = cost.SEGMENTS if segment is None else (segment,)
    algo, seg, predicted = cost.learnt(collective, nbytes, world_size, params, segments=segments)
    return algo, (None if segment is not None else seg), predicted


ALGO_ENV: Final = "NETCOLL_ALGO"


def parse_overrides(text: str, what: str = ALGO_ENV) -> dict[str, str]:
    """``"all_reduce=ring,broadcast=tree"`` (per collective) or ``"ring"`` (every
    collective that has it) -> ``{collective: algorithm}``; empty: no overrides.

    Raises:
        ConfigError: an unknown collective or algorithm, naming ``what`` and the choices.
    """
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" not in part:
            have = [c for c, table in ALGORITHMS.items() if part in table]
            if not have and part != "auto":
                names = sorted({a for table in ALGORITHMS.values() for a in table})
                raise ConfigError(f"{what}: no collective has an algorithm {part!r}; known: {', '.join(names)}")
            out.update(dict.fromkeys(have, part))
            continue
        coll, _, algo = (x.strip() for x in part.partition("="))
        if coll not in ALGORITHMS:
            raise ConfigError(f"{what}: unknown collective {coll!r}; known: {', '.join(ALGORITHMS)}")
        if algo != "auto" and algo not in ALGORITHMS[coll]:
            choices = ", ".join(["auto", *sorted(ALGORITHMS[coll])])
            raise ConfigError(f"{what}: {coll} has no algorithm {algo!r}; choose one of {choices}")
        out[coll] = algo
    return {c: a for c, a in out.items() if a != "auto"}


def overrides_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """:func:`parse_overrides` of ``$NETCOLL_ALGO`` (unset: none)."""
    env = os.environ if environ is None else environ
    return parse_overrides(env.get(ALGO_ENV, ""))
