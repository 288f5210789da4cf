"""Reducing a socket's payload as it is read: a posted receive's :class:`~netcoll.ops.Fold`
applied one cache-sized piece at a time.

A ring reduce-scatter step (and a tree's or halving's) receives a segment it then reduces
into its own data. Read whole into the posted scratch (4 MiB at the default segment size),
the kernel writes those bytes out to memory and the add reads them back in. Read through one
cache-sized buffer per link instead, the reads fill it and each full piece is folded at once
(``out = own op incoming``, the same bits as :func:`~netcoll.ops.reduce_to` on the whole
payload), so the add reads bytes still in cache and overlaps the transfer. The posted
scratch is never written (``docs/performance.md``, "Folding over TCP").
"""

from __future__ import annotations

from typing import Final

import numpy as np

from ..ops import Fold
from ..wire import Pieces

#: bytes folded at a time: the piece buffer's size (one core's L2 here: see ``docs/performance.md``)
PIECE: Final = 1 << 20


class FoldPieces(Pieces):
    """Feeds a payload to ``fold`` through ``piece`` (:data:`PIECE` bytes, reused payload
    after payload): the piece fills read by read, and is folded when full or when the
    payload is complete. The frame then carries ``result``, the posted buffer, left as it
    was (``fold.complete`` says the payload went into ``fold.out``)."""

    __slots__ = ("fold", "piece", "result", "_size", "_filled")

    def __init__(self, fold: Fold, piece: memoryview, result: memoryview) -> None:
        self.fold, self.piece, self.result = fold, piece, result
        item = fold.out.itemsize
        self._size = len(piece) - len(piece) % item  # whole elements per fold
        self._filled = 0  # bytes in the piece, not folded yet

    @staticmethod
    def fits(fold: Fold, piece: int = PIECE) -> bool:
        """Whether a payload for ``fold`` can go through a piece of ``piece`` bytes."""
        return 0 < fold.out.itemsize <= piece

    def room(self) -> memoryview:
        fold, filled = self.fold, self._filled
        end = min(self._size, fold.nbytes - fold.done)
        return self.piece[filled:end]

    def took(self, n: int) -> None:
        fold = self.fold
        self._filled += n
        if self._filled == min(self._size, fold.nbytes - fold.done):
            fold.apply(self.piece[: self._filled])
            self._filled = 0


def piece_buffer() -> memoryview:
    """A link's piece buffer (uninitialized: its pages are touched as bytes land)."""
    return np.empty(PIECE, dtype=np.uint8).data


__all__ = ["PIECE", "FoldPieces", "piece_buffer"]
