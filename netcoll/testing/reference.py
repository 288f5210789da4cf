"""Every rank's input to a program step, and the result numpy says it must get.

Inputs are a pure function of ``(seed, step, world rank)``, different for every
step, so a frame delivered to the wrong operation shows as a wrong value. The
values keep every reduction exact in any fold order: small integers (sums of
up to hundreds of ranks stay exact in float16 and bfloat16), factors of a
product from {-1, 1, 2} ({1, 2} unsigned), integers that wrap alike in any
order. Collectives that only move data move random bytes.

Results are compared byte for byte (so ``all_reduce`` is checked bit-identical
on every rank) with one exception: a complex product, whose zero imaginary
parts may be +0 or -0 by fold order, is compared by value. ``avg`` is the sum
divided once, correctly rounded (in float64, then cast: the double rounding is
innocuous for these exact inputs).

A compressed step's result is computed as its plan makes it
(:mod:`netcoll.algorithms.compressed`): every contribution but the receiver's own
through the codec, reduced in rank order in the input dtype, an all_reduce's reduced
shards (and every moved block) through the codec once more, then ``avg`` divided as
:func:`netcoll.ops.finalize` does; compared byte for byte like the rest.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..compression import decode, encode
from ..ops import BFLOAT16, finalize, reduce_into
from .program import REDUCING, Program, Step

Array = np.ndarray[Any, Any]


def dtype_of(name: str) -> np.dtype[Any]:
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def passes_input(step: Step, group_rank: int) -> bool:
    """Whether this rank passes an array (a broadcast's or scatter's non-roots pass None)."""
    return step.kind not in ("broadcast", "scatter") or group_rank == step.root


@functools.lru_cache(maxsize=256)
def _pristine(seed: int, step: Step, rank: int) -> Array:
    dt = dtype_of(step.dtype)
    rng = np.random.default_rng([seed, step.index, rank, 5])
    n = int(np.prod(step.shape, dtype=np.int64))
    if dt.kind == "b":
        flat = rng.integers(0, 2, n).astype(dt)
    elif step.kind not in REDUCING:
        flat = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)
    elif step.op == "prod":
        flat = np.array([1, 2, 1] if dt.kind == "u" else [-1, 1, 2])[rng.integers(0, 3, n)].astype(dt)
    elif dt.kind == "u":
        flat = rng.integers(0, 16, n).astype(dt)
    elif dt.kind == "c":
        flat = (rng.integers(-4, 5, n) + 1j * rng.integers(-4, 5, n)).astype(dt)
    elif dt.kind == "i":
        flat = rng.integers(-8, 9, n).astype(dt)
    else:
        flat = rng.integers(-8, 9, n).astype(np.float32).astype(dt)
    out = flat.reshape(step.shape)
    out.flags.writeable = False
    return out


def data(seed: int, step: Step, rank: int) -> Array:
    """World rank ``rank``'s input to ``step``: a new array (the caller may hand it to netcoll)."""
    return _pristine(seed, step, rank).copy()


def untouched(seed: int, step: Step, rank: int, given: Array) -> bool:
    """Whether ``given`` (an input handed to netcoll) still holds what :func:`data` made."""
    return given.tobytes() == _pristine(seed, step, rank).tobytes()


def out_buffer(step: Step, group_rank: int, size: int) -> Array | None:
    """The ``out=`` buffer this rank passes to ``step`` (None: none), full of garbage
    bytes; a broadcast's non-roots pass it as their buffer."""
    kind = step.kind
    if not step.out or (kind in ("reduce", "gather") and group_rank != step.root):
        return None
    if kind == "broadcast" and group_rank == step.root:
        return None
    if kind in ("all_gather", "gather"):
        shape = (size, *step.shape)
    elif kind in ("scatter", "reduce_scatter"):
        shape = step.shape[1:]
    else:
        shape = step.shape
    buf = np.empty(shape, dtype_of(step.dtype))
    buf.reshape(-1).view(np.uint8)[:] = 0xA5
    return buf


def _fold(op: str, arrays: list[Array]) -> Array:
    dt = arrays[0].dtype
    if op == "avg":
        wide = np.complex128 if dt.kind == "c" else np.float64
        total = np.sum([a.astype(wide) for a in arrays], axis=0)
        mean: Array = (
            (total.real / len(arrays) + 1j * (total.imag / len(arrays))) if dt.kind == "c" else total / len(arrays)
        )
        return mean.astype(dt)
    fn = {
        "sum": np.add,
        "prod": np.multiply,
        "min": np.minimum,
        "max": np.maximum,
        "band": np.bitwise_and,
        "bor": np.bitwise_or,
        "bxor": np.bitwise_xor,
    }[op]
    acc = arrays[0].copy()
    with np.errstate(all="ignore"):
        for a in arrays[1:]:
            acc = np.asarray(fn(acc, a)).astype(dt)
    return acc


def expected(program: Program, step: Step, rank: int) -> Any:
    """What world rank ``rank`` must get from ``step`` (an array, or None; a split: its
    sub-group's ``(rank, size)`` or None; calibrate: not checked here, returns None)."""
    members = program.members(step)
    g = members.index(rank)
    if step.kind == "split":
        color = step.colors[rank]
        if color is None:
            return None
        mine = program.members(Step(-1, "x", on=(step.index, color)))
        return (mine.index(rank), len(mine))
    if step.kind in ("barrier", "calibrate"):
        return None
    xs = [_pristine(program.seed, step, w) for w in members]
    kind = step.kind
    if step.compression != "none" and len(xs) > 1:  # (a group of one sends nothing: exact)
        return _compressed(step, xs, g)
    if kind == "p2p":
        return xs[step.src] if g == step.dst else None
    if kind in ("reduce", "gather") and g != step.root:
        return None
    if kind in ("all_reduce", "reduce"):
        return _fold(step.op, xs)
    if kind == "reduce_scatter":
        return _fold(step.op, [x[g] for x in xs])
    if kind == "broadcast":
        return xs[step.root]
    if kind in ("all_gather", "gather"):
        return np.stack(xs)
    if kind == "scatter":
        return xs[step.root][g]
    assert kind == "all_to_all", kind
    return np.stack([x[g] for x in xs])


def _through(codec: str, x: Array) -> Array:
    """``x`` encoded and decoded (what a receiver of it holds)."""
    return decode(codec, encode(codec, x), np.empty(x.size, x.dtype)).reshape(x.shape)


def _in_order(step: Step, parts: list[Array], own: int) -> Array:
    """The parts reduced in rank order, every one but ``own`` through the codec."""
    acc = parts[0].copy() if own == 0 else _through(step.compression, parts[0])
    for k in range(1, len(parts)):
        reduce_into(step.op, acc, parts[k] if k == own else _through(step.compression, parts[k]))
    return acc


def _compressed(step: Step, xs: list[Array], g: int) -> Any:
    """What group rank ``g`` gets from a compressed ``step`` (see the module docstring)."""
    kind, codec, n = step.kind, step.compression, len(xs)
    if kind == "broadcast":
        return _through(codec, xs[step.root])
    if kind == "all_gather":
        return np.stack([_through(codec, x) for x in xs])
    if kind == "reduce" and g != step.root:
        return None
    if kind == "reduce":
        got = _in_order(step, [x.reshape(-1) for x in xs], step.root).reshape(xs[0].shape)
    elif kind == "reduce_scatter":
        got = _in_order(step, [x[g] for x in xs], g)
    else:
        flat = [x.reshape(-1) for x in xs]
        q, rem = divmod(flat[0].size, n)
        bounds = np.cumsum([0] + [q + (1 if i < rem else 0) for i in range(n)])
        shards = [_in_order(step, [f[bounds[k] : bounds[k + 1]] for f in flat], k) for k in range(n)]
        got = np.concatenate([_through(codec, s) for s in shards]).reshape(xs[0].shape)
    finalize(step.op, got, n)
    return got


def differs(step: Step, got: Any, want: Any) -> str | None:
    """How ``got`` differs from ``want`` (None: it does not)."""
    if want is None or got is None:
        return None if got is None and want is None else f"got {_short(got)}, expected {_short(want)}"
    if not isinstance(got, np.ndarray):
        return f"got a {type(got).__name__}, expected an array: {_short(got)}"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    by_value = step.op == "prod" and want.dtype.kind == "c"
    same = np.array_equal(got, want) if by_value else got.tobytes() == want.tobytes()
    if same:
        return None
    g, w = got.reshape(-1), want.reshape(-1)
    bad = np.flatnonzero(g != w) if by_value else _wrong(g, w)
    first = int(bad[0])
    return (
        f"{bad.size} of {w.size} elements wrong; first at flat index {first}: got {g[first]!r}, "
        f"expected {w[first]!r} (got[:8]={g[:8].tolist()}, expected[:8]={w[:8].tolist()})"
    )


def _wrong(g: Array, w: Array) -> Array:
    item = g.dtype.itemsize
    gb = np.frombuffer(g.tobytes(), np.uint8).reshape(-1, item)
    wb = np.frombuffer(w.tobytes(), np.uint8).reshape(-1, item)
    return np.flatnonzero((gb != wb).any(axis=1))


def _short(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype}{list(x.shape)}"
    return repr(x)[:80]


__all__ = ["data", "differs", "dtype_of", "expected", "out_buffer", "passes_input", "untouched"]
