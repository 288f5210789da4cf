"""A group's medium and ranks per core from the agreed layout (link kinds,
host keys, cores), and the table's choice by them (netcoll.selection.media,
netcoll.selection.table)."""

from __future__ import annotations

import numpy as np
import pytest

from netcoll.algorithms import ALGORITHMS
from netcoll.selection import choose, media, table

SHM, TCP, TLS, MEM = (media.CODES[k] for k in ("shm", "tcp", "tls", "memory"))


def layout(kinds: np.ndarray, hosts: list[int] | None = None, cores: list[int] | None = None) -> media.Layout:
    n = kinds.shape[0]
    return media.Layout(kinds, np.array(hosts or [7] * n, np.int64), np.array(cores or [2] * n, np.int64))


def matrix(size: int, code: int, **pairs: int) -> np.ndarray:
    """Every pair linked by ``code``; ``pairs``: ``"i_j"`` -> another code (both sides)."""
    m = np.full((size, size), code, np.uint8)
    np.fill_diagonal(m, 0)
    for key, c in pairs.items():
        i, j = (int(x) for x in key.strip("p").split("_"))
        m[i, j] = m[j, i] = c
    return m


def test_row_codes_each_peer_and_leaves_self_and_unknown_zero() -> None:
    got = media.row({0: "shm", 2: "tcp", 3: "tls", 4: "memory", 5: "carrier-pigeon", 9: "shm", -1: "tcp"}, 6)
    assert got.dtype == np.uint8 and got.tolist() == [SHM, 0, TCP, TLS, MEM, 0]


@pytest.mark.parametrize(
    ("m", "members", "want"),
    [
        (matrix(4, SHM), range(4), "shm"),
        (matrix(4, TCP), range(4), "socket"),
        (matrix(4, TLS, p1_2=TCP), range(4), "socket"),
        (matrix(4, SHM, p1_3=TCP), range(4), "socket"),  # mixed: the socket sets the pace
        (matrix(4, SHM, p1_3=TCP), (0, 1, 2), "shm"),  # a sub-group without that pair
        (matrix(4, SHM, p1_3=TCP), (3, 1), "socket"),
        (matrix(4, MEM), range(4), None),  # the in-process hub: no column in the table
        (matrix(4, SHM, p0_2=0), range(4), None),  # a pair without a known link
        (matrix(4, SHM), (0,), None),  # a group of one has no links
        (matrix(4, SHM), (0, 4), None),  # a member the matrix does not cover
        (None, range(4), None),  # not agreed
        (np.zeros((2, 3), np.uint8), (0, 1), None),
    ],
)
def test_medium(m: np.ndarray | None, members: range | tuple[int, ...], want: str | None) -> None:
    assert media.medium(None if m is None else layout(m), tuple(members)) == want


def test_sides_of_a_pair_that_disagree_make_it_unknown() -> None:
    m = matrix(3, SHM)
    m[0, 1] = TCP  # rank 0 says TCP, rank 1 says shared memory
    assert media.medium(layout(m), (0, 1, 2)) is None
    assert media.medium(layout(m), (1, 2)) == "shm"


def test_codes_turn_anything_unknown_into_no_link() -> None:
    rows = np.array([[0, 3, 1e9], [np.nan, -1, 2.5], [4, 2, 1]], np.float64)
    assert media.codes(rows).tolist() == [[0, 3, 0], [0, 0, 0], [4, 2, 1]]


def test_layout_of_an_exchanged_table_reads_anything_odd_as_unknown() -> None:
    key = (5 << 32) | 9
    rows = np.array(
        [
            [0, 3, 1, 5, 9, 2],
            [3, 0, 7.5, 5, 9, 4],  # a code that is no code
            [1, 1, 0, np.nan, 2.0**32, -3],  # no host key, negative cores
        ],
        np.float64,
    )
    got = media.Layout.of(rows)
    assert got.kinds.tolist() == [[0, 3, 1], [3, 0, 0], [1, 1, 0]]
    assert got.hosts.tolist() == [key, key, 0] and got.cores.tolist() == [2, 4, 0]


def test_host_fields_are_a_key_and_cores() -> None:
    hi, lo, cores = media.host_fields().tolist()
    assert all(v == int(v) and 0 <= v < 2**32 for v in (hi, lo)) and (hi or lo)
    assert media.host_fields().tolist() == [hi, lo, cores] and cores >= 1  # the same every time
    rows = np.array([[0, 3, hi, lo, cores], [3, 0, hi, lo, cores]], np.float64)
    assert media.ranks_per_core(media.Layout.of(rows), (0, 1)) == 2 / cores


def test_ranks_per_core_counts_every_world_rank_on_a_members_host() -> None:
    kinds = matrix(6, TCP)
    hosts = [1, 1, 1, 1, 2, 2]  # four ranks on host 1, two on host 2
    got = layout(kinds, hosts, [2, 2, 2, 1, 8, 8])  # host 1: one rank may run on one core only
    assert media.ranks_per_core(got, range(6)) == 4.0
    assert media.ranks_per_core(got, (4, 5)) == 2 / 8
    assert media.ranks_per_core(got, (0, 4)) == 4.0  # a sub-group shares host 1 with the others
    assert media.ranks_per_core(layout(kinds, [1, 1, 1, 1, 0, 0]), (4,)) is None  # a host unknown
    assert media.ranks_per_core(layout(kinds, hosts, [2, 2, 2, 2, 0, 8]), (5,)) is None  # cores unknown
    assert media.ranks_per_core(got, (0, 6)) is None and media.ranks_per_core(None, (0,)) is None


def test_crowded_hosts_run_small_all_reduce_as_the_tree() -> None:
    crowded = table.CROWDED_RANKS_PER_CORE
    for size in (4, 16):
        assert choose("all_reduce", 4, size) == choose("all_reduce", 4, size, None, crowded - 0.5) == "doubling"
        assert choose("all_reduce", 4, size, "shm", crowded) == "tree"
        assert choose("all_reduce", 16 << 10, size, "socket", crowded) == "tree"
    assert choose("all_reduce", 64 << 20, 16, "shm", crowded) == "ring"  # large ones as before
    assert choose("all_reduce", 4, 2, "shm", crowded) == "doubling"  # two ranks: one exchange either way


def test_reduce_by_medium() -> None:
    big = table.REDUCE_RING_MIN_BYTES
    assert choose("reduce", big, 4) == choose("reduce", big, 4, "shm") == "ring"
    assert choose("reduce", big - 1, 4, "shm") == "tree"
    assert choose("reduce", big, 4, "socket") == "tree"
    assert choose("reduce", (64 << 20) - 1, 8, "socket") == "tree"
    assert choose("reduce", table.REDUCE_RING_MIN_BYTES_SOCKET, 4, "socket") == "ring"
    assert choose("reduce", 1 << 30, 2, "socket") == "tree"  # two ranks: the tree is one message


def test_all_gather_by_medium() -> None:
    mid = 16 << 20
    assert choose("all_gather", mid, 4) == choose("all_gather", mid, 4, "socket") == "ring"
    assert choose("all_gather", mid, 4, "shm") == choose("all_gather", mid, 3, "shm") == "doubling"
    assert choose("all_gather", table.ALL_GATHER_DOUBLING_MAX_BYTES_4_SHM, 4, "shm") == "ring"
    assert choose("all_gather", mid, 8, "shm") == "ring"  # from 5 ranks: the link-blind threshold


def test_all_to_all_by_medium() -> None:
    mid = 16 << 20
    assert choose("all_to_all", mid, 4) == choose("all_to_all", mid, 4, "socket") == "pairwise"
    assert choose("all_to_all", mid, 4, "shm") == "linear"
    assert choose("all_to_all", table.ALL_TO_ALL_LINEAR_MAX_BYTES_4_SHM, 4, "shm") == "pairwise"
    assert choose("all_to_all", mid, 8, "shm") == "pairwise"  # from 5 ranks: the link-blind threshold


def test_every_medium_picks_a_known_algorithm() -> None:
    for medium in (None, "shm", "socket"):
        for coll in ALGORITHMS:
            for nbytes in (0, 1 << 10, 1 << 20, 1 << 26, 1 << 30):
                for size in (1, 2, 4, 8, 64):
                    assert choose(coll, nbytes, size, medium) in ALGORITHMS[coll]


def test_hosts_a_group_spans() -> None:
    layout = media.Layout(
        kinds=np.zeros((4, 4), np.uint8), hosts=np.array([7, 7, 9, 0], np.int64), cores=np.array([2, 2, 2, 2])
    )
    assert media.hosts(layout, [0, 1]) == 1
    assert media.hosts(layout, [0, 1, 2]) == 2
    assert media.hosts(layout, [0, 3]) is None  # a member whose host is unknown
    assert media.hosts(layout, [0, 4]) is None  # a member the layout does not cover
    assert media.hosts(layout, []) is None
    assert media.hosts(None, [0, 1]) is None


def test_broadcast_by_medium_and_the_roots_verdict() -> None:
    """Only the root knows a broadcast's size: without the model ``auto`` keeps the tree (the
    chain did not win on one host), with it ``auto`` is ``sized`` and the root asks the model;
    a forced ``sized`` without the model uses the table's verdict."""
    from netcoll.selection import broadcast_shape, cost, decide

    big = table.BROADCAST_CHAIN_MIN_BYTES
    for medium in (None, "shm", "socket"):
        assert choose("broadcast", 0, 8, medium) == "tree"
    assert table.broadcast_chain(big, 4, "shm") and not table.broadcast_chain(big - 1, 4, "shm")
    assert not table.broadcast_chain(1 << 30, 4, "socket") and not table.broadcast_chain(big, 3, "shm")
    assert broadcast_shape(big, 4, None, 4 << 20, "shm") == ("ring", None)
    assert broadcast_shape(big, 2, None, 4 << 20, "shm") == ("tree", None)
    # with the model: its prediction (a slow link: the chain from a few MiB; no link cost: the tree)
    slow = cost.Params(alpha=4e-4, overhead=1e-5, beta=8e-9, gamma=1e-10, solo=8e-9)
    shape, predicted = broadcast_shape(16 << 20, 4, slow, 4 << 20, "socket")
    assert shape == "ring" and predicted == cost.predict("broadcast", "ring", 16 << 20, 4, slow, 4 << 20)
    assert broadcast_shape(4 << 10, 4, slow, 4 << 20, "socket")[0] == "tree"
    assert decide("broadcast", 0, 4, slow)[0] == "sized" and decide("broadcast", 0, 2, slow)[0] == "tree"
    assert decide("broadcast", 0, 4, None, medium="shm")[0] == "tree"
