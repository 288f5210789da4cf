"""What joins a group's ranks, as the algorithm table needs to know it.

Which algorithm is fastest depends on the links: over shared memory a
reduce's ring beats the tree from 4 MiB, over TCP the tree is faster up to at
least 16 MiB (docs/algorithms.md, "Choosing by link kind"). But every rank of
a group must choose the same algorithm, and a rank knows only its own links'
kinds, so a group agrees on them once, when it forms: each rank contributes a
*row*, the kind of its link to every world rank (:func:`row`), and every rank
gets the same *matrix* (an all_gather; ``Communicator`` does it in
:func:`netcoll.comm.form_group`). From the matrix, any group over those
ranks — the world, a split, a torch sub-group — computes its *medium* without
talking (:func:`medium`):

* ``"shm"``: every pair of members is linked by shared memory;
* ``"socket"``: some pair is linked by a socket (TCP or TLS), which then sets
  the pace (a mixed group counts as a socket one);
* ``None``: unknown (no agreement, e.g. a group made directly on a transport
  in tests, or a kind the table has no column for, such as the in-process hub),
  and the table's link-blind thresholds apply.

Sans-IO: rows and matrices are numpy arrays; nothing here sends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

SHM: Final = "shm"
SOCKET: Final = "socket"
#: a link kind's code in a row (0: no link — this rank itself, or a kind unknown here)
CODES: Final[dict[str, int]] = {"tcp": 1, "tls": 2, "shm": 3, "memory": 4}
_MEDIUM_OF: Final[dict[int, str | None]] = {1: SOCKET, 2: SOCKET, 3: SHM, 4: None}


def row(kinds: Mapping[int, str], size: int) -> np.ndarray:
    """This rank's row: ``kinds`` (world rank -> link kind, as in
    :meth:`~netcoll.transport.base.Transport.link_stats`) as ``size`` codes."""
    out = np.zeros(size, np.uint8)
    for peer, kind in kinds.items():
        if 0 <= peer < size:
            out[peer] = CODES.get(kind, 0)
    return out


def codes(table: np.ndarray) -> np.ndarray:
    """``table`` (rows as exchanged, any numbers) as codes: anything that is not
    a known code becomes 0 (no known link), so a malformed row can only make
    the medium unknown."""
    known = np.isin(table, list(CODES.values()))
    return np.where(known, table, 0).astype(np.uint8)


def medium(matrix: np.ndarray | None, members: Sequence[int]) -> str | None:
    """The medium of the group of world ranks ``members`` by the agreed
    ``matrix`` (``matrix[i, j]``: rank ``i``'s code for its link to ``j``):
    ``"shm"``, ``"socket"`` or ``None`` (module docstring). None also when
    the matrix does not cover the members, a pair has no known link, or the two
    sides of a pair disagree."""
    if matrix is None or len(members) < 2:
        return None
    n = matrix.shape[0] if matrix.ndim == 2 and matrix.shape[0] == matrix.shape[1] else 0
    if any(not 0 <= m < n for m in members):
        return None
    sub = matrix[np.ix_(members, members)]
    pairs = sub[np.triu_indices(len(members), 1)]
    if not np.array_equal(sub, sub.T) or pairs.size == 0:
        return None
    found = {_MEDIUM_OF.get(int(code), None) for code in np.unique(pairs)}
    if None in found:
        return None
    return SOCKET if SOCKET in found else SHM


__all__ = ["CODES", "SHM", "SOCKET", "codes", "medium", "row"]
