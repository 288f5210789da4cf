"""``netcoll.elastic``: what elastic training needs beyond regrouping (DESIGN.md,
"Elastic groups").

``state = await netcoll.elastic.heal(comm, state)``: every rank calls it after a
``regroup`` that admitted newcomers (``comm.joined``); the newcomers' arrays,
tensors and step counter become the live members', streamed in slices from
every live member at once, each slice checked by CRC-32 (:mod:`.healing`).
"""

from __future__ import annotations

from .errors import ChecksumMismatch, HealError, LayoutMismatch, NoSources
from .healing import CHUNK_BYTES, SLICE_BYTES, heal

__all__ = ["CHUNK_BYTES", "SLICE_BYTES", "ChecksumMismatch", "HealError", "LayoutMismatch", "NoSources", "heal"]
