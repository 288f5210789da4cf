"""netcoll.algorithms.compressed's encoding of an exchange: every slot but this rank's own
holds its part's encoding and zero padding, whatever the buffer held before; the own slot
(never sent nor read) is left untouched."""

from __future__ import annotations

import numpy as np
import pytest

from netcoll.algorithms.compressed import _encode_into
from netcoll.compression import encode, encoded_nbytes


@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8", "none"])
@pytest.mark.parametrize("skip", [0, 2])
def test_each_slot_is_its_encoding_and_zero_padding_but_the_own_one(codec: str, skip: int) -> None:
    rng = np.random.default_rng(skip)
    parts = [rng.standard_normal(n).astype(np.float32) for n in (1500, 1500, 1499, 1000)]
    slot = max(encoded_nbytes(codec, np.dtype(np.float32), p.size) for p in parts)
    buf = np.full(len(parts) * slot, 0xAB, np.uint8)  # a reused scratch block: anything in it
    _encode_into(codec, parts, slot, skip, buf)
    for k, part in enumerate(parts):
        got = buf[k * slot : (k + 1) * slot]
        if k == skip:
            assert (got == 0xAB).all()
            continue
        n = encoded_nbytes(codec, part.dtype, part.size)
        assert np.array_equal(got[:n], encode(codec, part))
        assert not got[n:].any()
