"""States for the heal tests: a live member's (deterministic from a seed) and a joiner's
stale one, and a digest of a state's every key, dtype, shape, byte and scalar."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np


def live_state(seed: int = 0, *, scale: int = 1) -> dict[str, Any]:
    """A training state: nested model and optimizer arrays of several dtypes (one not
    C-contiguous, one empty, one 0-d), a step counter and other scalars."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((64 * scale, 33)).astype(np.float32)
    return {
        "model": {
            "w": w,
            "b": rng.standard_normal(33).astype(ml_dtypes.bfloat16),
            "wt": np.asfortranarray(rng.standard_normal((17, 9))),  # not C-contiguous
            "mask": rng.integers(0, 2, 1000).astype(bool),
        },
        "optim": {"m": rng.standard_normal(5000 * scale), "count": np.int64(seed), "lr": 0.01, "empty": np.zeros(0)},
        "scalar0d": np.array(7, np.int16),
        "step": 1000 + seed,
        "name": "run-a",
        "none": None,
        "blob": b"\x00\x01",
        "hooks": {},
    }


def stale_state() -> dict[str, Any]:
    """A joiner's state: some arrays of the right dtype and shape (filled in place), one of
    the wrong shape and one of the wrong dtype (replaced), keys missing and one extra."""
    return {
        "model": {"w": np.zeros((64, 33), np.float32), "b": np.zeros(30, ml_dtypes.bfloat16), "mask": np.zeros(1000)},
        "optim": {"m": np.zeros(5000)},
        "step": 0,
        "extra": np.ones(3),
    }


def fingerprint(state: Mapping[str, Any]) -> str:
    """A digest of a state: keys (sorted), kinds, dtypes, shapes, bytes and scalars."""
    h = hashlib.sha256()
    _feed(h, state)
    return h.hexdigest()


def _feed(h: Any, node: Mapping[str, Any]) -> None:
    for key in sorted(node):
        x = node[key]
        h.update(repr(key).encode())
        if isinstance(x, Mapping):
            h.update(b"{")
            _feed(h, x)
            h.update(b"}")
        elif hasattr(x, "numpy") and not isinstance(x, np.ndarray):  # a torch tensor
            h.update(b"tensor" + str(x.dtype).encode() + repr(tuple(x.shape)).encode())
            h.update(x.contiguous().view(-1).view(sys.modules["torch"].uint8).numpy().tobytes())
        elif isinstance(x, np.ndarray):
            h.update(str(x.dtype).encode() + repr(x.shape).encode() + np.ascontiguousarray(x).tobytes())
        else:
            h.update(repr(x.item() if isinstance(x, np.generic) else x).encode())
