"""Typed failures of :func:`netcoll.elastic.heal` (every rank of the heal raises the same one,
except where said otherwise)::

    NetcollError
    └── HealError            a heal failed (also: a peer's layout message is malformed)
        ├── NoSources        every rank is a joiner: nobody holds the state
        ├── LayoutMismatch   the live members hold different states (keys, shapes, dtypes, values)
        └── ChecksumMismatch a slice arrived corrupt twice (from two sources, when there are two)

Failures of the transfers themselves (a peer lost, a deadline passed) are the
collectives' own :class:`~netcoll.errors.CollectiveError` subclasses.
"""

from __future__ import annotations

from ..errors import NetcollError


class HealError(NetcollError):
    """A heal failed; the joiners' state is then undefined (partly written): heal again."""


class NoSources(HealError):
    """Every rank of the group is a joiner (``comm.joined``): there is no state to heal from."""


class LayoutMismatch(HealError):
    """The live members' states differ (keys, shapes, dtypes or scalar values): the message
    names the ranks on each side and the first entry that differs."""


class ChecksumMismatch(HealError):
    """A slice's checksum did not match on a joiner, once from its own source and again from
    the next one (``.slice``, ``.joiner``, ``.sources``: the ranks that sent it)."""

    def __init__(self, message: str, *, slice: int, joiner: int, sources: tuple[int, ...]) -> None:
        super().__init__(message)
        self.slice = slice
        self.joiner = joiner
        self.sources = sources


__all__ = ["ChecksumMismatch", "HealError", "LayoutMismatch", "NoSources"]
