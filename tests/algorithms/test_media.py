"""A group's medium from the agreed matrix of link kinds, and the table's
choice by it (netcoll.algorithms.media, netcoll.algorithms.table)."""

from __future__ import annotations

import numpy as np
import pytest

from netcoll.algorithms import ALGORITHMS, choose, media, table

SHM, TCP, TLS, MEM = (media.CODES[k] for k in ("shm", "tcp", "tls", "memory"))


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
    assert media.medium(m, tuple(members)) == want


def test_sides_of_a_pair_that_disagree_make_it_unknown() -> None:
    m = matrix(3, SHM)
    m[0, 1] = TCP  # rank 0 says TCP, rank 1 says shared memory
    assert media.medium(m, (0, 1, 2)) is None
    assert media.medium(m, (1, 2)) == "shm"


def test_codes_turn_anything_unknown_into_no_link() -> None:
    rows = np.array([[0, 3, 1e9], [np.nan, -1, 2.5], [4, 2, 1]], np.float64)
    assert media.codes(rows).tolist() == [[0, 3, 0], [0, 0, 0], [4, 2, 1]]


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


def test_every_medium_picks_a_known_algorithm() -> None:
    for medium in (None, "shm", "socket"):
        for coll in ALGORITHMS:
            for nbytes in (0, 1 << 10, 1 << 20, 1 << 26, 1 << 30):
                for size in (1, 2, 4, 8, 64):
                    assert choose(coll, nbytes, size, medium) in ALGORITHMS[coll]
