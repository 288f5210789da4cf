"""The fixed table behind ``algorithm="auto"``: per collective, thresholds in
bytes measured on the 2-core reference machine (the measurements are in
docs/algorithms.md, "The fixed table"), and, where shared memory and sockets
disagree, one per *medium* (:mod:`.media`): the group's links, agreed when it
formed.

Every rank of a group passes the same arguments (the buffer's size is the same
on every rank, the medium is agreed), so every rank picks the same algorithm.
"""

from __future__ import annotations

from typing import Final

from .media import SHM, SOCKET

# Each threshold is where forced algorithms crossed on the 2-core reference machine (2, 4 and 8
# rank processes, both link kinds); the figures behind each are in docs/algorithms.md, "The fixed
# table" (`python -m netcoll.bench.versus COLLECTIVE` measures them again).

#: all_reduce: recursive doubling (log2 P rounds) below these (5+ ranks; 3-4 ranks; 2 ranks,
#: where the ring runs above), then with 3+ ranks the pipelined binomial tree below
#: ALL_REDUCE_TREE_MAX_BYTES, the ring (bandwidth-optimal) above
ALL_REDUCE_DOUBLING_MAX_BYTES: Final = 32 * 1024
ALL_REDUCE_DOUBLING_MAX_BYTES_4: Final = 128 * 1024
ALL_REDUCE_DOUBLING_MAX_BYTES_2: Final = 64 * 1024
#: with at least this many rank processes per core on a host of the group (3+ ranks), small
#: all_reduce runs the tree instead of recursive doubling: on a crowded host total work counts
#: more than depth (doubling sends P log2 P messages per call in all, the tree 2(P-1))
CROWDED_RANKS_PER_CORE: Final = 8
ALL_REDUCE_TREE_MAX_BYTES: Final = 8 * 1024 * 1024
#: reduce of at least this many bytes, with 3+ ranks, uses the ring (reduce-scatter, then
#: chunks to the root: the root takes in (P-1)/P N instead of the tree's N per level)
REDUCE_RING_MIN_BYTES: Final = 4 * 1024 * 1024
#: the same over sockets (a group with a TCP or TLS link): the tree's synchronous non-root sends
#: and its folding as it reads keep it ahead up to 16 MiB (docs/performance.md)
REDUCE_RING_MIN_BYTES_SOCKET: Final = 64 * 1024 * 1024
#: all_gather with an output (all P blocks) below this uses Bruck, else the ring
ALL_GATHER_DOUBLING_MAX_BYTES: Final = 16 * 1024 * 1024
#: the same for 3-4 ranks linked by shared memory, where Bruck's two steps stay ahead at 16 MiB
ALL_GATHER_DOUBLING_MAX_BYTES_4_SHM: Final = 32 * 1024 * 1024
#: reduce_scatter of an input (all P blocks) below this uses recursive halving (log2 P rounds),
#: else the ring (P-1 steps)
REDUCE_SCATTER_HALVING_MAX_BYTES: Final = 4 * 1024 * 1024
#: all_to_all of an input (all P blocks) below this uses the linear algorithm (every transfer at
#: once), else pairwise (one peer per step)
ALL_TO_ALL_LINEAR_MAX_BYTES: Final = 4 * 1024 * 1024
#: the same for 3-4 ranks linked by shared memory, where every transfer at once stays ahead
ALL_TO_ALL_LINEAR_MAX_BYTES_4_SHM: Final = 32 * 1024 * 1024
#: the root of a ``sized`` broadcast (:mod:`netcoll.algorithms.sized`: only the root knows N, so
#: it chooses and the others follow) runs the pipelined chain (every rank sends N once) instead
#: of the binomial tree (the root sends N*log2 P) from this many bytes and ranks, unless sockets
#: link the group, when it has no cost model to ask (:func:`broadcast_chain`). ``auto`` itself
#: keeps the tree on one host; with the cost model (by default between hosts), ``auto`` is
#: ``sized`` and the model decides (docs/emulated-network.md).
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
