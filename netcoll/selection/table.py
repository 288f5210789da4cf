"""The fixed table behind ``algorithm="auto"``: per collective, thresholds in
bytes measured on the 2-core reference machine (docs/algorithms.md), and, where
shared memory and sockets disagree, one per *medium* (:mod:`.media`): the
group's links, agreed when it formed.

Every rank of a group passes the same arguments (the buffer's size is the same
on every rank, the medium is agreed), so every rank picks the same algorithm.
"""

from __future__ import annotations

from typing import Final

from .media import SHM, SOCKET

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
#: with at least this many rank processes per core on a host of the group (3+ ranks), small
#: all_reduce runs the tree instead of recursive doubling: on a crowded host total work counts
#: more than depth, and doubling sends P log2 P messages per call in all, the tree 2(P-1).
#: Measured 2026-11-26 (``netcoll bench all_reduce --algorithm doubling|tree``, median µs per
#: call, two runs each, 2 cores): 16 ranks over TCP 4 B 3951 / 3922 against 3367 / 3479, 16 KiB
#: 4678 / 4566 against 2930 / 3756, 256 KiB 11347 / 10742 against 5463 / 5751; over shared
#: memory 4 B 6090 / 6256 against 4534 / 4136; 8 ranks (4 per core) level (4 B over TCP 1264 /
#: 1344 against 1184 / 1362). Rechecked 2026-11-27 (git history of docs/algorithms.md, "Many ranks on few cores").
CROWDED_RANKS_PER_CORE: Final = 8
#: The tree's limit was 2 MiB (the ring overtook it between 1 and 4 MiB at 4 ranks, before the
#: tree read its input in place and folded out of the shared-memory ring). Measured 2026-11-26
#: (``python -m netcoll.bench.versus all_reduce``, each algorithm's own run, µs per call, tree /
#: ring, mean of 20, best of 3-4 rounds, two runs at 4 ranks): 4 ranks over shared memory
#: 2 MiB 7521 / 8552 and 3838 / 6341, 4 MiB 11231 / 10454 and 7676 / 8822, 8 MiB 12808 / 12814,
#: 16 MiB 33795 / 19962; over TCP 2 MiB 5858 / 7480 and 6496 / 8750, 4 MiB 10908 / 12409 and
#: 14586 / 12742, 8 MiB 23551 / 27049, 16 MiB 55099 / 49168; 8 ranks over shared memory 2 MiB
#: 12624 / 25373, 4 MiB 21080 / 26214, 8 MiB 37800 / 37546; over TCP 2 MiB 13406 / 26035,
#: 4 MiB 31437 / 36380, 8 MiB 55549 / 57318. So the tree ran below 4 MiB at 3-4 ranks (even
#: at 4 MiB) and below 8 MiB from 5 ranks (even at 8 MiB). Since then (the tree's folding over
#: TCP, lent shared-memory sends) the 4 MiB all_reduce at 4 ranks ran faster as the tree in all 8
#: of the comparisons of 2026-11-27 (ring / tree, µs: over shared memory 5044 / 4807, 6658 /
#: 4286, 7406 / 4870, 4773 / 3846; over TCP 7356 / 6634, 9560 / 8848, 8175 / 7853, 7346 / 6617;
#: ``versus`` and ``versus --interleave``, medians), and the ring at 16 MiB over shared memory
#: (10788-14455 against 14602-23290), level over TCP: the tree now runs below 8 MiB from 3 ranks.
ALL_REDUCE_TREE_MAX_BYTES: Final = 8 * 1024 * 1024
#: reduce of at least this many bytes, with 3+ ranks, uses the ring (reduce-scatter, then
#: chunks to the root: the root takes in (P-1)/P N instead of the tree's N per level);
#: measured at 4 ranks: 1 MiB tree 1.7 / ring 2.1 ms, 4 MiB 7.0 / 5.8, 16 MiB 30.5 / 22.5.
REDUCE_RING_MIN_BYTES: Final = 4 * 1024 * 1024
#: the same over sockets (a group with a TCP or TLS link): there the tree stays ahead up to
#: 16 MiB, its non-roots' synchronous sends and its folding as it reads (docs/performance.md)
#: costing less than the ring's 2(P-1) steps. Measured 2026-11-27 (``python -m
#: netcoll.bench.versus reduce``, each algorithm's own run, µs per call, tree / ring, median of
#: 10-15 calls, best of 2-3 rounds): 4 ranks over TCP 4 MiB 4588 / 4869, 16 MiB 16203 / 18932,
#: 64 MiB 69888 / 73144 (the day's earlier run: 4 MiB 4152 / 5029, 16 MiB 15942 / 18597);
#: 8 ranks over TCP 4 MiB 10674 / 14854, 16 MiB 41396 / 45831, 64 MiB 171617 / 168493; over
#: shared memory, 4 ranks, 4 MiB 4688 / 3993, 16 MiB 13299 / 11754, 64 MiB 57788 / 39986 (the
#: ring from 4 MiB, REDUCE_RING_MIN_BYTES).
REDUCE_RING_MIN_BYTES_SOCKET: Final = 64 * 1024 * 1024
#: all_gather with an output (all P blocks) below this uses Bruck, else the ring. Measured
#: (ms per call, ring / Bruck): 4 ranks 1 MiB 1.52 / 1.10, 4 MiB 3.9 / 3.7, 16 MiB 16.6 / 16.2,
#: 64 MiB 63.8 / 67.9; 8 ranks 1 MiB 5.0 / 2.9, 4 MiB 11.5 / 9.2, 16 MiB 38.0 / 38.0.
ALL_GATHER_DOUBLING_MAX_BYTES: Final = 16 * 1024 * 1024
#: the same for 3-4 ranks linked by shared memory, where Bruck's two steps stay ahead at 16 MiB.
#: Measured 2026-11-27 (``python -m netcoll.bench.versus all_gather``, each algorithm's own run,
#: µs per call, ring / Bruck, medians, best of 3 rounds, five runs at 16 MiB): 4 ranks over
#: shared memory 16 MiB 5858 / 4680, 5112 / 4639, 5111 / 5029, 6659 / 4416, 4319 / 4444; 32 MiB
#: 10151 / 10529; 64 MiB 21010 / 18575 and 20560 / 22340: the ring from 32 MiB. 8 ranks over
#: shared memory 16 MiB 13431 / 17594 (the ring, as the link-blind threshold has it); 3 ranks
#: level (16 MiB, three alternating pairs of ``netcoll bench``: 5615 / 5676); over TCP, 4 ranks,
#: 16 MiB 14183 / 13888, 14939 / 13632, 13472 / 13234, 64 MiB 51394 / 53205.
ALL_GATHER_DOUBLING_MAX_BYTES_4_SHM: Final = 32 * 1024 * 1024
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
#: the same for 3-4 ranks linked by shared memory, where every transfer at once stays ahead.
#: Measured 2026-11-27 (``python -m netcoll.bench.versus all_to_all``, each algorithm's own run,
#: µs per call, pairwise / linear, medians, best of 3 rounds): 4 ranks over shared memory 4 MiB
#: 2277 / 2184, 1963 / 1905, 2159 / 2342, 2170 / 1726, 1760 / 1736; 8 MiB 3148 / 2721; 16 MiB
#: 7431 / 6360, 6792 / 5494, 7948 / 7517, 6632 / 6148; 64 MiB 17609 / 18159, 22359 / 18735.
#: 8 ranks over shared memory 4 MiB 7515 / 9294, 16 MiB 19731 / 19431 (the link-blind
#: threshold); 3 ranks level (16 MiB, three alternating pairs of ``netcoll bench``: 6142 /
#: 6012); over TCP, 4 ranks, 4 MiB 3581 / 4337, 3287 / 3649, 16 MiB 13736 / 14585.
ALL_TO_ALL_LINEAR_MAX_BYTES_4_SHM: Final = 32 * 1024 * 1024
#: the root of a ``sized`` broadcast (:mod:`.sized`: only the root knows N, so it
#: chooses and the others follow) runs the pipelined chain (every rank sends N
#: once) instead of the binomial tree (the root sends N*log2 P) from this many
#: bytes and ranks, unless sockets link the group, when it has no cost model to
#: ask (:func:`broadcast_chain`). ``auto`` itself keeps the tree on one host: over
#: loopback TCP the tree was ahead or level at 4 B-64 MiB (4 MiB 3010 against
#: 3864 µs, 64 MiB 46295 against 57440); over shared memory, 4 ranks, the chain
#: was 1.14x and 1.29x faster at 16 MiB in two ``versus`` runs of 2026-11-27, the
#: tree 1.06-1.31x at 256 KiB-64 MiB in a third, and at 64 MiB 17.0-20.5 against
#: 19.9-22.2 ms (three alternating ``netcoll bench`` runs); and ``sized`` costs a
#: non-root 5-12 µs a call. With the cost model (by default between hosts),
#: ``auto`` is ``sized`` and the model decides (docs/emulated-network.md).
BROADCAST_CHAIN_MIN_BYTES: Final = 16 * 1024 * 1024
BROADCAST_CHAIN_MIN_RANKS: Final = 4


def pick(
    collective: str, nbytes: int, world_size: int, medium: str | None = None, ranks_per_core: float | None = None
) -> str | None:
    """The algorithm of ``collective`` for a buffer of ``nbytes`` among
    ``world_size`` ranks linked by ``medium`` (None: unknown, the link-blind
    thresholds), with at most ``ranks_per_core`` rank processes per core on
    their hosts (None: unknown); None for a collective the table has no rule
    for (one algorithm)."""
    if collective == "all_reduce":
        if world_size <= 2:
            return "doubling" if nbytes < ALL_REDUCE_DOUBLING_MAX_BYTES_2 or world_size == 1 else "ring"
        crowded = ranks_per_core is not None and ranks_per_core >= CROWDED_RANKS_PER_CORE
        if not crowded and nbytes < (
            ALL_REDUCE_DOUBLING_MAX_BYTES_4 if world_size <= 4 else ALL_REDUCE_DOUBLING_MAX_BYTES
        ):
            return "doubling"
        return "tree" if nbytes < ALL_REDUCE_TREE_MAX_BYTES else "ring"
    if collective == "all_gather":
        least = _shm4(medium, world_size, ALL_GATHER_DOUBLING_MAX_BYTES_4_SHM, ALL_GATHER_DOUBLING_MAX_BYTES)
        return "doubling" if nbytes < least else "ring"
    if collective == "reduce_scatter":
        return "halving" if nbytes < REDUCE_SCATTER_HALVING_MAX_BYTES else "ring"
    if collective == "all_to_all":
        least = _shm4(medium, world_size, ALL_TO_ALL_LINEAR_MAX_BYTES_4_SHM, ALL_TO_ALL_LINEAR_MAX_BYTES)
        return "linear" if nbytes < least else "pairwise"
    if collective == "reduce":
        least = REDUCE_RING_MIN_BYTES_SOCKET if medium == SOCKET else REDUCE_RING_MIN_BYTES
        return "ring" if world_size >= 3 and nbytes >= least else "tree"
    if collective == "broadcast":
        return "tree"
    return None


def broadcast_chain(nbytes: int, world_size: int, medium: str | None = None) -> bool:
    """The table's verdict, for the root of a ``sized`` broadcast of ``nbytes``: the chain?"""
    return medium != SOCKET and world_size >= BROADCAST_CHAIN_MIN_RANKS and nbytes >= BROADCAST_CHAIN_MIN_BYTES


def _shm4(medium: str | None, world_size: int, shm4: int, otherwise: int) -> int:
    """``shm4`` for 3-4 ranks linked by shared memory, else ``otherwise``."""
    return shm4 if medium == SHM and world_size <= 4 else otherwise
