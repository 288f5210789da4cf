"""The cost model behind ``algorithm="auto"``: one formula per collective ×
algorithm, and the choice of algorithm and segment size that minimises it.

Pure functions, no I/O. A call's predicted time is linear in five per-group
parameters (:class:`Params`)::

    T = alpha·steps + o·msgs + beta·bytes + gamma·reduced + solo·solo_bytes

* ``alpha``: the latency of one dependent step (a message that must
  arrive before the next can go: wire latency plus the wake-up of the ranks);
* ``overhead`` (o): the software cost of one message sent or received
  (framing, the event loop, the mailbox: large in Python);
* ``beta``: seconds per byte through the busiest rank's link
  (``max(sent, received)`` per phase);
* ``gamma``: seconds per byte reduced (numpy add bandwidth);
* ``solo``: seconds per byte of the busiest rank while the others mostly wait
  (the root of a tree or a flat gather/scatter: :data:`SOLO`); ``beta`` is the
  rate with every rank moving data, which on ranks sharing cores is slower.

:func:`terms` gives ``(steps, msgs, bytes, reduced, solo_bytes)`` on the critical path
(the busiest rank) for ``P`` ranks, ``N`` bytes and segments of ``s`` bytes;
each formula repeats the cost header of its algorithm's module. Pipelined
algorithms add a *fill*: ``depth-1`` segment times (one segment's ``alpha + o +
beta m (+ gamma m)``), which is what makes smaller segments pay off for deep trees
and larger ones for everything else. :func:`best` evaluates every algorithm
of a collective at every candidate segment size and returns the cheapest
(ties: the earlier algorithm, then the larger segment). Every rank computes
it from the same agreed :class:`Params`, so every rank chooses the same.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import numpy as np

#: (steps, msgs, bytes, reduced, solo bytes): the coefficients of (alpha, o, beta, gamma, solo)
Terms = tuple[float, float, float, float, float]
#: a formula's own (steps, msgs, bytes, reduced); :func:`terms` files the bytes under solo for SOLO
Counts = tuple[float, float, float, float]

#: collectives whose size only the root knows (planned as 0 bytes on every rank): the
#: model neither weighs their algorithms nor learns from their calls
SIZE_UNKNOWN: Final = ("broadcast", "scatter")

KiB: Final = 1024
MiB: Final = 1024 * 1024
#: segment sizes ``best`` tries: powers of four up to the default 4 MiB (larger
#: segments save little per-message cost and need segment-sized scratch buffers)
SEGMENTS: Final = (64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB)
#: how much faster (predicted) a smaller segment must be to be chosen over a larger one
SEGMENT_MARGIN: Final = 0.2
#: each parameter is clamped to this range: sane for anything from shared memory to a WAN
BOUNDS: Final = {
    "alpha": (1e-7, 1.0),
    "overhead": (1e-8, 0.1),
    "beta": (1e-12, 1e-6),
    "gamma": (1e-13, 1e-6),
    "solo": (1e-12, 1e-6),
}


#: a number, or a numpy array of them (:func:`split_cost` of many samples)
_N = TypeVar("_N", float, np.ndarray)

#: an algorithm's efficiency factors are clamped to this range
FACTOR_BOUNDS: Final = (0.1, 50.0)
#: size bands of measured times: band ``b`` holds sizes of ``b`` bits (``[2**(b-1), 2**b)``
BANDS: Final = 48
#: an algorithm not yet measured in a size band is tried unless the model predicts it
#: slower than this factor times the best time measured there (the model prunes; traffic decides)
EXPLORE: Final = 4.0


@dataclass(frozen=True, slots=True)
class Params:
    """The model's parameters (seconds, seconds per byte; see the module docstring)
    and, per (collective, algorithm) of :data:`PAIRS`, two efficiency factors
    learnt from traffic: one on its latency terms (alpha, overhead), one on its
    bandwidth terms (beta, gamma). ``factors`` is flat, two per pair; empty: all 1."""

    alpha: float
    overhead: float
    beta: float
    gamma: float
    factors: tuple[float, ...] = ()
    #: seconds per byte of a transfer while the other ranks are idle (None: ``beta``)
    solo: float | None = None
    #: measured seconds per call, agreed: ``(slot, seconds)`` sorted by slot (:func:`slot`)
    measured: tuple[tuple[int, float], ...] = ()
    #: each rank's measured bandwidth (bytes/s, by group rank; :func:`~.probe.rate`), agreed:
    #: what :mod:`netcoll.algorithms.weighted` sizes its shares by (empty: not measured)
    rates: tuple[float, ...] = ()

    def vector(self) -> tuple[float, float, float, float, float]:
        return (self.alpha, self.overhead, self.beta, self.gamma, self.beta if self.solo is None else self.solo)

    def factor(self, collective: str, algo: str) -> tuple[float, float]:
        if not self.factors:
            return (1.0, 1.0)
        i = 2 * PAIR_INDEX[(collective, algo)]
        return (self.factors[i], self.factors[i + 1])

    def seen(self, collective: str, algo: str, nbytes: int) -> float | None:
        """The agreed measured seconds of ``algo`` in ``nbytes``' size band (None: not measured)."""
        if not self.measured:
            return None
        key = slot(collective, algo, nbytes)
        for k, seconds in self.measured:
            if k == key:
                return seconds
        return None

    def row(self) -> list[float]:
        """Everything, as one row of numbers (what ranks exchange to agree): the five
        parameters, two factors per pair, then one measured time per slot (0: none)."""
        dense = [0.0] * (len(PAIRS) * BANDS)
        for k, seconds in self.measured:
            dense[k] = seconds
        return [*self.vector(), *(self.factors or [1.0] * (2 * len(PAIRS))), *dense]

    @classmethod
    def of(cls, values: Iterable[float], factors: Iterable[float] = (), measured: Iterable[float] = ()) -> Params:
        """From five numbers (and factors, and a dense row of measured times),
        each clamped (NaN: the lower bound; a time that is not finite and
        positive: not measured)."""
        a, o, b, g, solo = (clamp(name, v) for name, v in zip(BOUNDS, values, strict=True))
        lo, hi = FACTOR_BOUNDS
        fs = tuple(min(hi, max(lo, f)) if math.isfinite(f) else 1.0 for f in factors)
        times = np.asarray(measured, dtype=np.float64)[: len(PAIRS) * BANDS]
        keep = np.flatnonzero(np.isfinite(times) & (times > 0))
        seen = tuple(zip(keep.tolist(), times[keep].tolist(), strict=True))
        return cls(a, o, b, g, fs if any(f != 1.0 for f in fs) else (), solo, seen)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(zip(BOUNDS, self.vector(), strict=True))
        if self.factors:
            out["factors"] = {f"{c}/{a}": list(self.factor(c, a)) for c, a in PAIRS if self.factor(c, a) != (1.0, 1.0)}
        if self.measured:
            out["measured_s"] = {_slot_name(k): seconds for k, seconds in self.measured}
        if self.rates:
            out["rates_Bps"] = list(self.rates)
        return out


def band(nbytes: int) -> int:
    """The size band of ``nbytes``: its bit length (a factor of 2 per band), capped."""
    return min(max(0, int(nbytes)).bit_length(), BANDS - 1)


def slot(collective: str, algo: str, nbytes: int) -> int:
    """Where a measured time of ``algo`` at ``nbytes`` is kept (:attr:`Params.measured`)."""
    return PAIR_INDEX[(collective, algo)] * BANDS + band(nbytes)


def _slot_name(k: int) -> str:
    (collective, algo), b = PAIRS[k // BANDS], k % BANDS
    return f"{collective}/{algo}/<{1 << b}B"


def clamp(name: str, value: float) -> float:
    lo, hi = BOUNDS[name]
    if not math.isfinite(value):
        return hi if value > 0 else lo
    return min(hi, max(lo, float(value)))


#: a loopback-like guess, used only as the prior of a fit
DEFAULT_PARAMS: Final = Params(alpha=50e-6, overhead=20e-6, beta=0.5e-9, gamma=0.3e-9, solo=0.5e-9)


def _log2_ceil(p: int) -> int:
    return (p - 1).bit_length()


def _pow2_floor(p: int) -> int:
    return 1 << (p.bit_length() - 1)


def _nseg(nbytes: float, seg: int) -> int:
    return max(1, math.ceil(nbytes / seg))


def _pipe(depth: int, segs: int, msgs: float, nbytes: float, red: float, seg_bytes: float, reduces: bool) -> Counts:
    """A pipeline of ``depth`` stages and ``segs`` segments (``depth+segs-1``
    segment times): ``depth`` dependent steps (the segments behind the first
    follow at the link's pace: their latency overlaps), and the fill (``depth-1``
    segment times) on top of the busiest rank's load."""
    fill = max(0, depth - 1)
    return (
        float(depth),
        msgs + fill,
        nbytes + fill * seg_bytes,
        red + (fill * seg_bytes if reduces else 0.0),
    )


# -- all_reduce ------------------------------------------------------------------------------
def ar_ring(p: int, n: int, s: int) -> Counts:
    """ring.py: ``2(P-1)`` steps (``2(P-1)S`` messages per rank); ``2(P-1)/P N``
    bytes sent per rank; ``(P-1)/P N`` reduced."""
    c = n / p
    segs = _nseg(c, s)
    return (float(2 * (p - 1)), 4.0 * (p - 1) * segs, 2.0 * (p - 1) * c, (p - 1) * c)


def ar_tree(p: int, n: int, s: int) -> Counts:
    """tree.py: ``2L`` levels (reduce, then broadcast), ``L+S-1`` segment times
    each; the root takes in ``L N``, reduces ``L N`` and sends ``L N``."""
    lv, segs = _log2_ceil(p), _nseg(n, s)
    up = _pipe(lv, segs, lv * segs, lv * n, lv * n, n / segs, True)
    down = _pipe(lv, segs, lv * segs, lv * n, 0.0, n / segs, False)
    return _add(up, down)


def ar_doubling(p: int, n: int, s: int) -> Counts:
    """doubling.py: ``log2 P'`` steps, plus 2 if ``P != P'``; ``N log2 P'`` bytes
    sent per rank, plus ``N`` for ranks paired with an extra one."""
    k, extra, segs = _pow2_floor(p).bit_length() - 1, p != _pow2_floor(p), _nseg(n, s)
    rounds = k + (2 if extra else 0)
    return (float(rounds), 2.0 * rounds * segs, float(rounds * n), float((k + extra) * n))


def ar_halving(p: int, n: int, s: int) -> Counts:
    """halving.py: ``2 log2 P'`` steps (plus 2 with extra ranks); ``2 (P'-1)/P' N``
    bytes sent per rank (plus ``2N`` for ranks paired with an extra one)."""
    q = _pow2_floor(p)
    k, extra = q.bit_length() - 1, p != q
    msgs = 4.0 * sum(_nseg(n / (1 << i), s) for i in range(1, k + 1))
    nbytes = 2.0 * (q - 1) / q * n + (2 * n if extra else 0)
    red = (q - 1) / q * n + (n if extra else 0)
    return (float(2 * k + (2 if extra else 0)), msgs + (4 * _nseg(n, s) if extra else 0), nbytes, red)


def ar_allpairs(p: int, n: int, s: int) -> Counts:
    """allpairs.py: 1 step; ``(P-1) N`` bytes sent and received per rank,
    ``P-1`` reductions of ``N`` bytes."""
    segs = _nseg(n, s)
    return (1.0, 2.0 * (p - 1) * segs, float((p - 1) * n), float((p - 1) * n))


# -- rooted and gather-style -------------------------------------------------------------------
def bc_tree(p: int, n: int, s: int) -> Counts:
    """tree.py: ``L`` levels, ``L+S-1`` segment times; the root sends ``L N``."""
    lv, segs = _log2_ceil(p), _nseg(n, s)
    return _pipe(lv, segs, lv * segs, lv * n, 0.0, n / segs, False)


def bc_ring(p: int, n: int, s: int) -> Counts:
    """ring.py (chain): ``P-1`` hops, ``P+S-2`` segment times; every rank but the last sends ``N``."""
    segs = _nseg(n, s)
    return _pipe(p - 1, segs, 2 * segs, float(n), 0.0, n / segs, False)


def rd_tree(p: int, n: int, s: int) -> Counts:
    """tree.py: ``L`` levels, ``L+S-1`` segment times; the root reduces ``L N``."""
    lv, segs = _log2_ceil(p), _nseg(n, s)
    return _pipe(lv, segs, lv * segs, lv * n, lv * n, n / segs, True)


def rd_ring(p: int, n: int, s: int) -> Counts:
    """ring.py: a reduce-scatter (``P-1`` steps, ``(P-1)/P N`` bytes), then the
    root takes in the other ``P-1`` reduced chunks."""
    c = n / p
    segs = _nseg(c, s)
    rs = (float(p - 1), 2.0 * (p - 1) * segs, (p - 1) * c, (p - 1) * c)
    return _add(rs, (1.0, (p - 1) * segs, (p - 1) * c, 0.0))


def ag_ring(p: int, n: int, s: int) -> Counts:
    """ring.py: ``P-1`` steps (``(P-1)S`` messages); ``(P-1)/P N`` bytes sent per rank."""
    b = n / p
    segs = _nseg(b, s)
    return (float(p - 1), 2.0 * (p - 1) * segs, (p - 1) * b, 0.0)


def ag_doubling(p: int, n: int, s: int) -> Counts:
    """doubling.py (Bruck): ``ceil(log2 P)`` steps; ``(P-1) B`` bytes sent per rank
    (a run of blocks that wraps past rank ``P-1`` goes as two messages)."""
    b, lv = n / p, _log2_ceil(p)
    runs = [min(1 << i, p - (1 << i)) for i in range(lv)]
    msgs = sum(2 * (_nseg(m * b, s) + (1 if m > 1 else 0)) for m in runs)
    return (float(lv), float(msgs), (p - 1) * b, 0.0)


def rs_ring(p: int, n: int, s: int) -> Counts:
    """ring.py: ``P-1`` steps; ``(P-1)/P N`` bytes sent and reduced per rank."""
    c = n / p
    segs = _nseg(c, s)
    return (float(p - 1), 2.0 * (p - 1) * segs, (p - 1) * c, (p - 1) * c)


def rs_halving(p: int, n: int, s: int) -> Counts:
    """halving.py: ``log2 P'`` steps (plus 2 with extra ranks); ``(P'-1)/P'`` of the
    ``P'`` slots sent and reduced per rank (plus ``N`` for ranks paired with an extra one)."""
    q = _pow2_floor(p)
    k, extra = q.bit_length() - 1, p != q
    msgs = 2.0 * sum(_nseg(n / (1 << i), s) for i in range(1, k + 1))
    nbytes = (q - 1) / q * n + (n if extra else 0)
    if extra:
        msgs += 2.0 * (_nseg(n, s) + _nseg(n / p, s))
    return (float(k + (2 if extra else 0)), msgs, nbytes, nbytes)


def a2a_pairwise(p: int, n: int, s: int) -> Counts:
    """pairwise.py: ``P-1`` steps; ``(P-1) B`` bytes sent and received per rank."""
    b = n / p
    segs = _nseg(b, s)
    return (float(p - 1), 2.0 * (p - 1) * segs, (p - 1) * b, 0.0)


def a2a_linear(p: int, n: int, s: int) -> Counts:
    """linear.py: 1 step (every transfer at once); ``(P-1) B`` bytes sent and received per rank."""
    b = n / p
    segs = _nseg(b, s)
    return (1.0, 2.0 * (p - 1) * segs, (p - 1) * b, 0.0)


def flat_direct(p: int, n: int, s: int) -> Counts:
    """direct.py (gather, scatter): 1 step; the root moves ``(P-1) B``."""
    b = n / p
    segs = _nseg(b, s)
    return (1.0, (p - 1) * segs, (p - 1) * b, 0.0)


def barrier_doubling(p: int, n: int, s: int) -> Counts:
    """doubling.py (dissemination): ``ceil(log2 P)`` rounds of empty messages."""
    lv = _log2_ceil(p)
    return (float(lv), 2.0 * lv, 0.0, 0.0)


def _add(a: Counts, b: Counts) -> Counts:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


FORMULAS: Final[dict[str, dict[str, Callable[[int, int, int], Counts]]]] = {
    "all_reduce": {
        "ring": ar_ring,
        "tree": ar_tree,
        "doubling": ar_doubling,
        "allpairs": ar_allpairs,
        "halving": ar_halving,
    },
    "broadcast": {"tree": bc_tree, "ring": bc_ring},
    "reduce": {"tree": rd_tree, "ring": rd_ring},
    "all_gather": {"ring": ag_ring, "doubling": ag_doubling},
    "reduce_scatter": {"ring": rs_ring, "halving": rs_halving},
    "all_to_all": {"pairwise": a2a_pairwise, "linear": a2a_linear},
    "gather": {"direct": flat_direct},
    "scatter": {"direct": flat_direct},
    "barrier": {"doubling": barrier_doubling},
}


#: algorithms whose busiest rank (the root) works while the others wait: their bytes go at
#: the ``solo`` rate (one transfer at a time), the others' at ``beta`` (every rank busy, which
#: on ranks sharing cores is slower)
SOLO: Final = frozenset(
    {("all_reduce", "tree"), ("broadcast", "tree"), ("reduce", "tree"), ("gather", "direct"), ("scatter", "direct")}
)

#: every (collective, algorithm) with a formula, in a fixed order (the factors' order)
PAIRS: Final = tuple((c, a) for c, table in FORMULAS.items() for a in table)
PAIR_INDEX: Final = {pair: i for i, pair in enumerate(PAIRS)}


@functools.lru_cache(maxsize=4096)
def terms(collective: str, algo: str, nbytes: int, world_size: int, segment: int) -> Terms:
    """``(steps, msgs, bytes, reduced)`` of one call (``world_size >= 2``; remembered:
    the engine asks for every call it learns from)."""
    if world_size < 2:
        return (0.0, 0.0, 0.0, 0.0, 0.0)
    steps, msgs, nbytes_, red = FORMULAS[collective][algo](world_size, max(0, int(nbytes)), max(1, int(segment)))
    if (collective, algo) in SOLO:
        return (steps, msgs, 0.0, red, nbytes_)
    return (steps, msgs, nbytes_, red, 0.0)


def split_cost(t: Sequence[_N], params: Params) -> tuple[_N, _N]:
    """``(latency part, bandwidth part)`` of terms ``t``: ``alpha steps + o msgs``
    and ``beta bytes + gamma reduced`` (before the algorithm's factors). ``t``
    may also hold one numpy column per term: the parts of many samples at once."""
    a, o, b, g, solo = params.vector()
    return (t[0] * a + t[1] * o, t[2] * b + t[3] * g + t[4] * solo)


def predict(collective: str, algo: str, nbytes: int, world_size: int, params: Params, segment: int) -> float:
    """Predicted seconds of one call (the algorithm's factors applied)."""
    lat, bw = split_cost(terms(collective, algo, nbytes, world_size, segment), params)
    f_lat, f_bw = params.factor(collective, algo)
    return f_lat * lat + f_bw * bw


def best(
    collective: str,
    nbytes: int,
    world_size: int,
    params: Params,
    *,
    segments: Sequence[int] = SEGMENTS,
    algorithms: Sequence[str] | None = None,
) -> tuple[str, int, float]:
    """``(algorithm, segment_bytes, predicted seconds)`` minimising :func:`predict`
    over ``algorithms`` (default: every one the collective has) × ``segments``.
    A segment smaller than an algorithm's best so far must be predicted at least
    :data:`SEGMENT_MARGIN` faster (more messages cost every rank, which the
    busiest-rank terms undercount). Ties go to the earlier algorithm, then the
    larger segment, so the answer is a pure function of the arguments."""
    names = list(algorithms) if algorithms is not None else list(FORMULAS[collective])
    choice: tuple[str, int, float] | None = None
    for algo in names:
        mine: tuple[str, int, float] | None = None
        for seg in sorted(set(segments), reverse=True):
            t = predict(collective, algo, nbytes, world_size, params, seg)
            if mine is None or t < mine[2] * (1 - SEGMENT_MARGIN):
                mine = (algo, seg, t)
        assert mine is not None
        if choice is None or mine[2] < choice[2] * (1 - 1e-9):
            choice = mine
    assert choice is not None
    return choice


def learnt(
    collective: str,
    nbytes: int,
    world_size: int,
    params: Params,
    *,
    segments: Sequence[int] = SEGMENTS,
) -> tuple[str, int, float]:
    """``(algorithm, segment_bytes, predicted seconds)``: the model proposes,
    the agreed measured times (:attr:`Params.measured`) of the size band
    decide. With none measured: :func:`best`. Otherwise an algorithm not yet
    measured there is tried (the cheapest predicted first) unless it is
    predicted slower than :data:`EXPLORE` times the fastest measured time;
    once none is left, the fastest measured one runs (ties: the earlier
    algorithm). A pure function of the arguments, like :func:`best`."""
    names = list(FORMULAS[collective])
    times = [params.seen(collective, a, nbytes) for a in names] if len(names) > 1 else []
    known = [(t, i) for i, t in enumerate(times) if t is not None]
    if not known:
        return best(collective, nbytes, world_size, params, segments=segments)
    options = [best(collective, nbytes, world_size, params, segments=segments, algorithms=[a]) for a in names]
    fastest, i = min(known)
    untried = [o for o, t in zip(options, times, strict=True) if t is None and o[2] < EXPLORE * fastest]
    return min(untried, key=lambda o: o[2]) if untried else options[i]


__all__ = [
    "BANDS",
    "EXPLORE",
    "BOUNDS",
    "DEFAULT_PARAMS",
    "FACTOR_BOUNDS",
    "FORMULAS",
    "PAIRS",
    "PAIR_INDEX",
    "SEGMENTS",
    "SEGMENT_MARGIN",
    "SOLO",
    "Params",
    "Terms",
    "band",
    "best",
    "clamp",
    "learnt",
    "predict",
    "slot",
    "split_cost",
    "terms",
]
