"""How the weighted all_reduce (:mod:`.weighted`) divides a buffer: the ranks' *shares*
(:func:`shares`, from their measured rates), the *slices* their owners reduce in and the
*messages* each link carries (:class:`Grid`). Pure functions of sizes and rates, so
every rank computes the same cuts without talking.

Shares: rank ``i`` sends and receives ``n - s_i + (P-1) s_i = n + (P-2) s_i`` elements,
at its rate ``w_i``, so it takes ``(n + (P-2) s_i) / w_i``. :func:`shares` minimises the
largest of these, ``T`` (in closed form over the ranks fast enough to own anything, at
least ``n`` over the slowest rate), and among such shares takes the most nearly equal
(water-filling up to each rank's cap ``(T w_i - n)/(P-2)``: where the slowest rank sets
``T``, noise in the others' measured rates does not skew their shares), then rounds to whole elements
(largest remainders; ties to the faster rank, then the lower rank). With equal rates
every share is ``n/P`` (±1): the ring's bytes. A rank slow enough owns nothing and
moves only its own input out and the result in (``n`` each way), the least any
all_reduce can: at 4 ranks with one rank 4x slower (``w/4``), ``4n/w`` against the
ring's ``6n/w`` (the bound: 1.5x). At 2 ranks every share costs the same (``n`` each
way): the shares are equal.

Messages: a link carries whole slices per message, in proportion to the slower end's
rate (a rank at a quarter of the fastest rate moves a quarter of a piece per message,
:meth:`Grid.per_message`), and every stream starts and ends with one slice
(:func:`taper`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "FINE",
    "Grid",
    "MIN_PIECE_BYTES",
    "MIN_SLICE_BYTES",
    "PIECES",
    "bounds",
    "busiest",
    "ideal",
    "piece",
    "shares",
    "taper",
]

#: messages per share, at least (:func:`piece`), each of at least MIN_PIECE_BYTES (fewer,
#: larger messages cost less per byte where links are fast). Measured on the emulated
#: network (bench/slowrank.py: 4 ranks, 1 Gbit/s, rank 2 at 250 Mbit/s, a loaded 2-core
#: machine), 64 MiB against the ring's 3.7-3.9 s: pieces of 2 MiB 3.2-3.3 s, 512 KiB 2.7 s,
#: 256 KiB 3.1 s; 16 MiB against 0.95-1.05 s: 512 KiB 0.69 s, 128 KiB 0.72-0.76 s
PIECES = 32
MIN_PIECE_BYTES = 256 * 1024
#: slices per piece (a slice: the unit an owner reduces in and the links' messages are made
#: of), each of at least MIN_SLICE_BYTES (fewer slices cost less Python per byte)
FINE = 16
MIN_SLICE_BYTES = 16 * 1024


def _usable(rates: Sequence[float] | None, p: int) -> list[float] | None:
    """``rates`` as floats if there is one positive, finite rate per rank, else None."""
    if rates is None or len(rates) != p:
        return None
    out = [float(w) for w in rates]
    return out if all(math.isfinite(w) and w > 0 for w in out) else None


def ideal(n: float, rates: Sequence[float] | None, p: int) -> list[float]:
    """The real-valued shares of ``n`` minimising ``T = max_i (n + (P-2) s_i) / w_i``,
    and among those the most nearly equal (equal shares when ``P <= 2`` or the rates are
    not one positive number per rank).

    ``T`` is the larger of the level time of the ranks fast enough to own something and
    ``n / min(w)`` (every rank moves at least ``n`` each way). When the slowest rank sets
    ``T`` the others have slack, and levelling them would turn small differences of
    measured rates into very unequal shares (50.9 / 11.2 / 1.9 MiB of 64 was seen under
    load): each rank instead gets at most its cap ``(T w_i - n) / (P-2)`` (so none
    finishes after ``T``) and otherwise an equal part (water-filling up to the caps).
    Without slack the caps are the level shares themselves."""
    w = _usable(rates, p)
    if w is None or p <= 2:
        return [n / p] * p
    order = sorted(range(p), key=lambda i: (-w[i], i))
    total, t = 0.0, 0.0
    for k, i in enumerate(order, start=1):  # the k fastest own something
        total += w[i]
        tk = n * (p - 2 + k) / total
        if tk * w[i] < n:  # the k-th fastest would own less than nothing
            break
        t = tk
    t = max(t, n / min(w))
    caps = [max(0.0, (t * wi - n) / (p - 2)) for wi in w]
    out, left, level = [0.0] * p, n, -1.0
    owners = sorted((i for i in range(p) if caps[i] > 0), key=lambda i: (caps[i], i))
    for k, i in enumerate(owners):  # the smallest caps first: what they cannot take goes on
        if level < 0 and caps[i] * (len(owners) - k) >= left:
            level = left / (len(owners) - k)  # this one and the rest take one level: the same float
        out[i] = level if level >= 0 else caps[i]
        left -= out[i]
    return out


def shares(n: int, rates: Sequence[float] | None, p: int) -> list[int]:
    """Whole-element shares of ``n`` elements for ``p`` ranks of ``rates`` (any unit;
    only ratios matter): :func:`ideal` rounded down, the remainder one element each to
    the largest fractions (ties: the faster rank, then the lower rank). Non-negative,
    summing to ``n``; a slower rank never gets more; a pure function of its arguments
    (plain float arithmetic), so every rank computes the same shares."""
    if p < 1 or n < 0:
        raise ValueError(f"shares: need p >= 1 and n >= 0, got p={p}, n={n}")
    real = ideal(float(n), rates, p)
    scale = n / s if (s := sum(real)) > 0 else 0.0
    real = [x * scale for x in real]
    out = [min(n, math.floor(x)) for x in real]
    w = _usable(rates, p) or [1.0] * p
    by = sorted(range(p), key=lambda i: (-round(real[i] - out[i], 9), -w[i], i))  # float noise is no fraction
    rest = n - sum(out)
    while rest < 0:  # (floating rounding above n: take back from the largest)
        i = max(range(p), key=lambda j: (out[j], j))
        out[i] -= 1
        rest += 1
    for i in by[:rest]:
        out[i] += 1
    return out


def busiest(n: float, rates: Sequence[float] | None, p: int) -> float:
    """The busiest rank's elements moved each way, in the slowest rank's time:
    ``max_i (n + (P-2) s_i) · min(w) / w_i`` for :func:`ideal` shares (what the cost
    model charges ``beta``, the slowest rank's rate, for; equal rates: ``2(P-1)/P n``)."""
    if p < 2:
        return 0.0
    s = ideal(n, rates, p)
    w = _usable(rates, p) or [1.0] * p
    slow = min(w)
    return max((n - s[i] + (p - 1) * s[i]) * slow / w[i] for i in range(p))


def bounds(sizes: Sequence[int]) -> list[int]:
    """Offsets of consecutive shares: ``bounds(s)[i]`` is where rank ``i``'s share starts."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


def piece(n: int, itemsize: int, p: int, segment_bytes: int) -> int:
    """Elements per message on the fastest links: at most ``segment_bytes``, and small
    enough that a share is :data:`PIECES` messages (so a rank's sends and receives
    overlap: the owners reduce and send back each piece as soon as it is in), but not
    below :data:`MIN_PIECE_BYTES`."""
    most = max(1, segment_bytes // max(1, itemsize))
    want = max(-(-n // (p * PIECES)), MIN_PIECE_BYTES // max(1, itemsize))
    return max(1, min(most, want))


def taper(k: int, m: int) -> list[int]:
    """Sizes of the messages that carry ``k`` slices, at most ``m`` each, doubling from 1
    at the start and halving to 1 at the end (``1, 2, 4, m, ..., m, 4, 2, 1``): a stream's
    first message is small, so its receiver starts early, and so is its last, so it ends
    soon after the last slice is reduced."""
    front: list[int] = []
    back: list[int] = []
    step = 1
    while k > 0:
        for side in (front, back):
            if (take := min(step, m, k)) > 0:
                side.append(take)
                k -= take
        step = min(2 * step, m)
    return front + back[::-1]


@dataclass(frozen=True, slots=True)
class Grid:
    """Where one call's shares, slices and messages start and end, the same on every rank.

    A share is cut in *slices* of :attr:`size` elements (the last shorter), the unit its
    owner reduces in; a message between ranks ``i`` and ``q`` about ``q``'s share carries
    whole slices, as many as the slower of the two is fast (:meth:`per_message`: a link
    at a quarter of the fastest rate moves a quarter of a piece per message), tapered
    at both ends (:func:`taper`). Both directions of a link use the same bounds."""

    at: list[int]  #: ``at[q]``: where rank ``q``'s share starts (``at[P]``: the size)
    size: int  #: elements per slice
    full: int  #: slices per message on the fastest links
    rates: list[float]  #: the ranks' rates (all 1 when unusable)

    @classmethod
    def of(cls, n: int, itemsize: int, p: int, segment_bytes: int, rates: Sequence[float] | None) -> Grid:
        """The grid of ``n`` elements of ``itemsize`` bytes over ``p`` ranks of ``rates``."""
        per = piece(n, itemsize, p, segment_bytes)
        size = max(1, min(per, max(per // FINE, -(-MIN_SLICE_BYTES // max(1, itemsize)))))
        return cls(bounds(shares(n, rates, p)), size, max(1, per // size), _usable(rates, p) or [1.0] * p)

    def slices(self, q: int) -> int:
        """How many slices rank ``q``'s share has."""
        return -(-(self.at[q + 1] - self.at[q]) // self.size)

    def slice_bounds(self, q: int) -> list[tuple[int, int]]:
        """``[a, b)`` of each slice of rank ``q``'s share, within the share."""
        n = self.at[q + 1] - self.at[q]
        return [(a, min(n, a + self.size)) for a in range(0, n, self.size)]

    def slice_of(self, e: int) -> int:
        """The slice that element ``e`` of a share is in."""
        return e // self.size

    def per_message(self, i: int, q: int) -> int:
        """Slices per message between ranks ``i`` and ``q`` (a function of the slower's rate)."""
        ratio = min(self.rates[i], self.rates[q]) / max(self.rates)
        return max(1, min(self.full, math.ceil(self.full * ratio - 1e-9)))

    def paced(self, i: int, q: int) -> bool:
        """Whether rank ``i`` paces its input to owner ``q`` by ``q``'s results: when some
        other contributor's link to ``q`` is slower (``q`` reduces at that one's pace, and
        input sent far ahead of it only queues on the network, in front of results)."""
        slowest = min(min(w, self.rates[q]) for c, w in enumerate(self.rates) if c != q)
        return min(self.rates[i], self.rates[q]) > slowest

    def streams(self, i: int) -> bool:
        """Whether rank ``i`` sends its input as one stream (:meth:`interleaved`): when its
        link is the slowest (of rates not all equal), the one every owner's reduction waits for."""
        return self.rates[i] == min(self.rates) < max(self.rates)

    def interleaved(self, i: int) -> list[tuple[int, int, int, int]]:
        """Rank ``i``'s input messages to every other rank as one sequence of ``(q, j, a, b)``
        (message ``j``, ``[a, b)``, of :meth:`messages` ``(i, q)``), in the order of how far
        into ``q``'s share each ends (ties: the lower ``q``): every owner's part advances
        at the same pace, so all of them end together."""
        out = []
        for q in range(len(self.rates)):
            if q != i:
                n = self.at[q + 1] - self.at[q]
                out += [(b / n, q, j, a, b) for j, (a, b) in enumerate(self.messages(i, q))]
        return [(q, j, a, b) for _, q, j, a, b in sorted(out)]

    def full_messages(self) -> int:
        """Messages on a link at the fastest rate about the largest share (a slower link's
        more, smaller messages cost their overhead while its bytes take longer still)."""
        return max((len(taper(self.slices(q), self.full)) for q in range(len(self.rates))), default=0)

    def messages(self, i: int, q: int) -> list[tuple[int, int]]:
        """``[a, b)`` within ``q``'s share of each message between ranks ``i`` and ``q``
        about it (``i``'s input to ``q``, and ``q``'s result to ``i``); none if it is empty."""
        n, k = self.at[q + 1] - self.at[q], 0
        out = []
        for m in taper(self.slices(q), self.per_message(i, q)):
            out.append((k * self.size, min(n, (k + m) * self.size)))
            k += m
        return out
