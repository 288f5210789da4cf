"""Rank arguments checked before anything runs (no numpy: the command line imports it).

:func:`check_root` is the one check of a collective's root for the Communicator's calls, the
algorithms, the job runner and the command line's choices, with one message.
"""

from __future__ import annotations

import numbers
from typing import Any


def check_root(root: Any, world_size: int | None) -> int:
    """``root`` as an int rank in ``0..world_size-1`` (any ``root >= 0`` while the size is
    not known yet), else ``ValueError`` saying the valid roots (``TypeError`` if not an
    int: a bool, a float, a string)."""
    if isinstance(root, bool) or not isinstance(root, numbers.Integral):
        raise TypeError(f"root must be an int rank, got {root!r}")
    r = int(root)
    if r < 0:
        raise ValueError(f"root must be >= 0, got {r}")
    if world_size is not None and r >= world_size:
        raise ValueError(
            f"root {r} is out of range for {world_size} rank{'s' if world_size != 1 else ''} "
            f"(valid roots are 0..{world_size - 1})"
        )
    return r


__all__ = ["check_root"]
