"""What joins a group's ranks, and how crowded their hosts are, as the
algorithm table needs to know it.

Which algorithm is fastest depends on the links: over shared memory a
reduce's ring beats the tree from 4 MiB, over TCP the tree is faster up to
16 MiB (docs/algorithms.md, "Choosing by link kind"). It depends on the host
too: with many more rank processes than cores, the tree's fewer messages beat
recursive doubling's fewer rounds. But every rank of a group must choose the
same algorithm, and a rank knows only its own links and host, so a world group
agrees on them once, when it forms: each rank contributes a *row*, the kind of
its link to every world rank (:func:`row`) and its host's key and cores
(:func:`host_fields`), and every rank gets the same :class:`Layout` (an
exchange; ``Communicator.agree_links``, called by
:func:`netcoll.comm.form_group`). From it, any group over those ranks — the
world, a split, a torch sub-group — computes without talking its *medium*
(:func:`medium`):

* ``"shm"``: every pair of members is linked by shared memory;
* ``"socket"``: some pair is linked by a socket (TCP or TLS), which then sets
  the pace (a mixed group counts as a socket one);
* ``None``: unknown (no agreement, e.g. a group made directly on a mesh
  in tests, or a kind the table has no column for, such as the in-process hub),
  and the table's link-blind thresholds apply;

its :func:`ranks_per_core`: the most rank processes per core on any of its
members' hosts (every world rank on a host counts: they share its cores); and
how many :func:`hosts` it spans. The table's thresholds were measured with
every rank on one host; a group over several hosts has the cost model choose
by default instead (:func:`netcoll.comm.calibrate_if_enabled`).

Nothing here sends; :func:`host_fields` reads the kernel's boot id.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

SHM: Final = "shm"
SOCKET: Final = "socket"
#: a link kind's code in a row (0: no link — this rank itself, or a kind unknown here)
CODES: Final[dict[str, int]] = {"tcp": 1, "tls": 2, "shm": 3, "memory": 4}
_MEDIUM_OF: Final[dict[int, str | None]] = {1: SOCKET, 2: SOCKET, 3: SHM, 4: None}
#: what :func:`host_fields` adds to a row: the host key's two 32-bit halves and the cores
HOST_FIELDS: Final = 3
_BOOT_ID: Final = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True, slots=True, eq=False)
class Layout:
    """The world's agreed rows: ``kinds[i, j]``, rank i's code for its link to
    j; ``hosts[i]``, rank i's host key (0: unknown); ``cores[i]``, the cores
    it may run on (0: unknown)."""

    kinds: np.ndarray
    hosts: np.ndarray
    cores: np.ndarray

    @classmethod
    def of(cls, table: np.ndarray) -> Layout:
        """From the exchanged table (a row per world rank: ``size`` link codes,
        then :data:`HOST_FIELDS`), any numbers: whatever is not a known code, a
        32-bit half or a count of cores reads as unknown."""
        size = table.shape[0]
        kinds = codes(table[:, :size])
        extra = np.nan_to_num(table[:, size : size + HOST_FIELDS], nan=-1.0)
        ok = (extra >= 0) & (extra < 2.0**32) & (extra == np.floor(extra))
        fields = np.where(ok, extra, 0).astype(np.int64)
        return cls(kinds, (fields[:, 0] << 32) | fields[:, 1], fields[:, 2])


def row(kinds: Mapping[int, str], size: int) -> np.ndarray:
    """This rank's row: ``kinds`` (world rank -> link kind, as in
    :meth:`~netcoll.mesh.channel.Mesh.link_stats`) as ``size`` codes."""
    out = np.zeros(size, np.uint8)
    for peer, kind in kinds.items():
        if 0 <= peer < size:
            out[peer] = CODES.get(kind, 0)
    return out


def host_fields() -> np.ndarray:
    """This rank's host key (two 32-bit halves of a hash of the kernel's boot
    id, shared by containers on one host, else of the host name) and the cores
    it may run on, as a row's last :data:`HOST_FIELDS` numbers."""
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            ident = f.read().strip()
    except OSError:
        ident = ""
    ident = ident or os.uname().nodename
    key = int.from_bytes(hashlib.blake2b(ident.encode(), digest_size=8).digest(), "big") or 1
    return np.array([key >> 32, key & 0xFFFFFFFF, len(os.sched_getaffinity(0))], np.float64)


def codes(table: np.ndarray) -> np.ndarray:
    """``table`` (rows as exchanged, any numbers) as codes: anything that is not
    a known code becomes 0 (no known link), so a malformed row can only make
    the medium unknown."""
    known = np.isin(table, list(CODES.values()))
    return np.where(known, table, 0).astype(np.uint8)


def medium(layout: Layout | None, members: Sequence[int]) -> str | None:
    """The medium of the group of world ranks ``members`` by the agreed
    ``layout``: ``"shm"``, ``"socket"`` or ``None`` (module docstring). None
    also when the layout does not cover the members, a pair has no known link,
    or the two sides of a pair disagree."""
    if layout is None or len(members) < 2:
        return None
    matrix = layout.kinds
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


def ranks_per_core(layout: Layout | None, members: Sequence[int]) -> float | None:
    """The most world ranks per core on a host of the group's ``members``
    (ranks on one host share its cores: the fewest any of them may run on);
    None when unknown (no layout, a member it does not cover, or a host of
    unknown key or cores)."""
    if layout is None or not members or any(not 0 <= m < layout.hosts.size for m in members):
        return None
    worst = 0.0
    for key in {int(layout.hosts[m]) for m in members}:
        on_host = layout.hosts == key
        cores = int(layout.cores[on_host].min())
        if key == 0 or cores <= 0:
            return None
        worst = max(worst, int(on_host.sum()) / cores)
    return worst


def hosts(layout: Layout | None, members: Sequence[int]) -> int | None:
    """How many hosts the group of world ranks ``members`` spans by the agreed
    ``layout``; None when unknown (no layout, a member it does not cover, or a
    member whose host key is unknown)."""
    if layout is None or not members or any(not 0 <= m < layout.hosts.size for m in members):
        return None
    keys = {int(layout.hosts[m]) for m in members}
    return None if 0 in keys else len(keys)


__all__ = [
    "CODES",
    "HOST_FIELDS",
    "SHM",
    "SOCKET",
    "Layout",
    "codes",
    "host_fields",
    "hosts",
    "medium",
    "ranks_per_core",
    "row",
]
