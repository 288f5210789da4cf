"""How a group's cost-model parameters are agreed and versioned, per communicator
(fitted by :mod:`.fit`).

* :class:`Tuner` — per communicator: the agreed versions, each applying from
  a sequence number; the local samples; the overrides; per size band, the
  calls' measured times and the schedule of their agreements (trials:
  :meth:`Tuner.trial_due`, :func:`~.cost.learnt`). A version whose
  agreement is still running is *pending*: a call that would use it waits
  (:class:`Pending`), so no rank ever chooses with parameters another rank
  does not have yet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from .cost import (
    FORMULAS,
    SIZE_UNKNOWN,
    Params,
    Terms,
    band,
    slot,
    terms,
)
from .fit import Sample

#: local samples kept for refinement
MAX_SAMPLES: Final = 512
#: refine after these many collectives, then every REFINE_EVERY; the agreed result
#: applies REFINE_LAG calls after the refinement was issued
REFINE_FIRST: Final = (4, 8, 16, 32, 64, 128)
REFINE_EVERY: Final = 256
REFINE_LAG: Final = 4
#: versions of the parameters a Tuner keeps for calls about to be issued: more than the
#: calls a version may be added ahead of (REFINE_LAG, TRIAL_LAG), plus the one in force
VERSIONS_KEPT: Final = 8
#: a size band's measured times are agreed after every TRIAL_CALLS of its calls while there
#: can be an algorithm left to try, then after TRIAL_AGAIN × 2**k × TRIAL_CALLS calls
#: (tracking drift at a falling rate); the result applies TRIAL_LAG calls later
TRIAL_CALLS: Final = 4
TRIAL_AGAIN: Final = 16
TRIAL_LAG: Final = 2
#: smaller calls are not tried: an agreement (an exchange between every pair of ranks) costs
#: more than the call (measured: 1-2 ms at 4 ranks on 2 cores; a 4 KiB all_reduce 0.8 ms, and
#: trials there doubled it), and their times are noise-bound; the model alone chooses there.
#: From 64 KiB, where the formulas' contention-free bandwidth term starts to matter: on an
#: emulated 1 Gbit/s, 200 µs network the model alone ran all-pairs at 64 KiB, 13.1 ms against
#: doubling's 1.4 (2026-11-27), and it was 256 KiB until then
TRIAL_MIN_BYTES: Final = 64 * 1024
#: the latest measured times kept per algorithm and size band (their median is this rank's value)
MEASURE_KEEP: Final = 8
#: the size :attr:`Tuner.asked` names for a broadcast: only its root knows the size when it is
#: issued (and chooses alone, by the agreed measured times of broadcasts), so its trials follow
#: the count of broadcasts, whatever their size, and always exchange
ROOT_SIZED: Final = -1


#: what a call chose: (collective, algorithm, nbytes, segment_bytes, predicted seconds or None)
Choice = tuple[str, str, int, int, float | None]


def describe(choice: Choice | None) -> str:
    """The choice, for the DEBUG line of a finished operation."""
    if choice is None:
        return ""
    predicted = "" if choice[4] is None else f", predicted {choice[4]:.6f}s"
    return f" ({choice[1]}, segment_bytes={choice[3]}{predicted})"


class Pending(Exception):
    """The parameters a call must choose with are still being agreed: wait for
    ``version``'s agreement, ``future``; then plan the call with that version
    (:meth:`Tuner.params_of`), whatever versions were added meanwhile."""

    def __init__(self, version: Version) -> None:
        super().__init__("cost-model parameters are being agreed")
        assert version.future is not None
        self.version = version
        self.future: asyncio.Future[Any] = version.future
        self.name = ""  # the collective that must wait (set by the plan)


@dataclass(slots=True)
class Version:
    """Agreed parameters applying from sequence number ``start`` (``future``: the
    agreement, while it runs; its result is a :class:`Params` or None)."""

    start: int
    params: Params | None
    future: asyncio.Future[Any] | None = None
    #: a parent group's version: its measured times (another world size) and rates (other
    #: ranks) are not used
    inherited: bool = False
    #: until settled, the version added before this one (a failed agreement keeps the
    #: parameters before it: :meth:`Tuner.params_before`)
    before: Version | None = None


@dataclass(slots=True)
class Tuner:
    """A communicator's model state (see the module docstring)."""

    every: int = REFINE_EVERY
    lag: int = REFINE_LAG
    versions: list[Version] = field(default_factory=lambda: [Version(0, None)])
    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    active: bool = False  # calibrated (or inherited): samples are kept and refined
    collectives: int = 0  # collectives issued (every rank counts the same)
    cost_seq: int = 0  # the next sequence number of the group's model operations
    #: collective -> [algorithm, segment, predicted, last seconds, sum of seconds, calls]
    last: dict[str, list[Any]] = field(default_factory=dict)
    #: what the last plan asked ``"auto"`` to choose for: (collective, nbytes), set before
    #: its parameters are looked up (so even a deferred call has it)
    asked: tuple[str, int] | None = None
    band_calls: dict[tuple[str, int], int] = field(default_factory=dict)  # (collective, band) -> auto calls
    #: slot -> this rank's latest measured seconds (:data:`MEASURE_KEEP`)
    times: dict[int, deque[float]] = field(default_factory=dict)
    agreeing: int = 0  # agreements exchanging now (their traffic and CPU perturb calls)
    agreed_at: float = -math.inf  # time.perf_counter() when the last one ended

    def overlapped(self, seconds: float) -> bool:
        """Whether a call that ended now after ``seconds`` ran while an agreement exchanged."""
        return self.agreeing > 0 or self.agreed_at > time.perf_counter() - seconds

    def trial_due(self) -> tuple[str, int, bool] | None:
        """Whether the ``"auto"`` call just issued (``asked``, of at least
        :data:`TRIAL_MIN_BYTES`) is followed by an agreement of measured
        times: in its size band, after every
        :data:`TRIAL_CALLS` calls while there can still be an algorithm to try
        (one trial per algorithm, plus one), then after :data:`TRIAL_AGAIN`,
        32, 64... times that many (``again``: a re-measure). A function of the
        calls issued only (not of the parameters, which may still be being
        agreed), so the same on every rank. Returns ``(collective, nbytes,
        again)`` or None. A broadcast (``asked`` names :data:`ROOT_SIZED`) follows
        the count of broadcasts instead, and is always ``again``: only its root
        knows what is on trial."""
        if not self.active or self.asked is None:
            return None
        name, nbytes = self.asked
        algos = len(FORMULAS[name])
        rooted = nbytes == ROOT_SIZED
        if algos < 2 or (nbytes < TRIAL_MIN_BYTES and not rooted):
            return None
        key = (name, ROOT_SIZED if rooted else band(nbytes))
        n = self.band_calls[key] = self.band_calls.get(key, 0) + 1
        k, rest = divmod(n, TRIAL_CALLS)
        if rest or not (k <= algos + 1 or (k >= TRIAL_AGAIN and k.bit_count() == 1)):
            return None
        return (name, nbytes, rooted or k > algos + 1)

    def measured(self) -> tuple[tuple[int, float], ...]:
        """This rank's measured seconds per slot, as :attr:`Params.measured`: the
        median of the latest (a first call that grows buffers, or one stall,
        says nothing of the algorithm)."""
        return tuple((key, statistics.median(self.times[key])) for key in sorted(self.times) if self.times[key])

    def due(self) -> bool:
        """Whether the collective just counted is followed by a refinement (the
        same answer on every rank: they count the same collectives)."""
        n = self.collectives
        return self.active and (n in REFINE_FIRST or n % self.every == 0)

    def params_at(self, seq: int) -> Params | None:
        """The agreed parameters for the call with sequence number ``seq``, which is
        being issued now (None: none agreed, use the table). Raises :class:`Pending`."""
        return self.params_of(self.version_at(seq))

    def version_at(self, seq: int) -> Version | None:
        """The version that applies to the call ``seq`` being issued now: the newest
        added that applies from ``seq`` or earlier. Every version added later applies
        from later (refinements and trials from a few calls on, a calibration from the
        next call): so it stays that call's version, to plan a call deferred behind its
        agreement and to start a sub-group made by the call, however many versions are
        added (and old ones dropped) before then."""
        for i in range(len(self.versions) - 1, -1, -1):
            if self.versions[i].start <= seq:
                return self.versions[i]
        return None

    def params_of(self, version: Version | None) -> Params | None:
        """``version``'s parameters (None for none), settled if its agreement ended.
        Raises :class:`Pending` while it runs."""
        if version is None:
            return None
        if version.future is not None:
            if not version.future.done():
                raise Pending(version)
            self._settle(version)
        return version.params

    def _settle(self, v: Version) -> None:
        assert v.future is not None and v.future.done()
        got = None if v.future.cancelled() or v.future.exception() is not None else v.future.result()
        previous = self.params_before(v)
        v.params = got if isinstance(got, Params) else previous
        if v.inherited and v.params is not None:
            v.params = dataclasses.replace(v.params, measured=(), rates=())
        v.future = v.before = None

    @staticmethod
    def params_before(v: Version) -> Params | None:
        """The parameters of the newest settled version added before ``v``."""
        b = v.before
        while b is not None and b.future is not None:
            b = b.before
        return None if b is None else b.params

    def add(self, start: int, future: asyncio.Future[Any]) -> None:
        """A new version, agreed by ``future``, applying from ``start`` (a call issued
        later than now). The oldest are dropped beyond :data:`VERSIONS_KEPT`: a call
        issued now finds its version among the newest (:meth:`version_at`)."""
        self.versions.append(Version(start, None, future, before=self.versions[-1] if self.versions else None))
        if len(self.versions) > VERSIONS_KEPT:
            del self.versions[0]

    def pending(self) -> list[asyncio.Future[Any]]:
        """The agreements still running."""
        return [v.future for v in self.versions if v.future is not None and not v.future.done()]

    def current(self) -> Params | None:
        """The newest settled parameters (a prior for a local fit, the stats; not for choosing)."""
        for i in range(len(self.versions) - 1, -1, -1):
            v = self.versions[i]
            if v.future is not None and v.future.done():
                self._settle(v)
            if v.future is None and v.params is not None:
                return v.params
        return None

    def learn(self, choice: Choice, seconds: float, world_size: int) -> None:
        """A finished call: keep its choice and time for the stats, and (once
        calibrated) a sample for the next refinement and, from
        :data:`TRIAL_MIN_BYTES` on, its time for its size band's trials (not
        the first call of an algorithm in a band, which allocates and warms up,
        nor a call that overlapped an agreement). A broadcast's ``choice`` is what
        it ran (:class:`~netcoll.engine.Call`'s ``ran``: its size and, for
        ``sized``, the root's shape). A call whose size the ranks do not all know even
        then (a scatter's: planned as 0 bytes) or whose algorithm has no formula gives
        no sample: its time would be charged to the wrong terms."""
        name, algo, nbytes, seg, predicted = choice
        t = None
        known = name not in SIZE_UNKNOWN or nbytes > 0
        if self.active and known and algo in FORMULAS.get(name, {}):
            t = terms(name, algo, nbytes, world_size, seg)
            if nbytes >= TRIAL_MIN_BYTES and not self.overlapped(seconds):
                key = slot(name, algo, nbytes)
                times = self.times.get(key)
                if times is None:  # the first call of an algorithm in a band warms it up: not timed
                    self.times[key] = deque(maxlen=MEASURE_KEEP)
                else:
                    times.append(seconds)
        self.record(name, algo, seg, predicted, seconds, t)

    def record(self, name: str, algo: str, seg: int, predicted: float | None, seconds: float, t: Terms | None) -> None:
        """A finished call: its choice and time (and a sample, when ``t`` is given)."""
        if t is not None:
            self.samples.append((name, algo, t, seconds))
        row = self.last.get(name)
        if row is None or row[0] != algo or row[1] != seg:
            self.last[name] = [algo, seg, predicted, seconds, seconds, 1]
            return
        row[2], row[3] = predicted, seconds
        row[4] += seconds
        row[5] += 1

    def stats(self) -> dict[str, Any]:
        """Per collective: the last choice, its predicted and measured seconds (last
        call, and the mean over the calls with that choice), and the parameters."""
        params = self.current()
        choices = {
            name: {
                "algorithm": algo,
                "segment_bytes": seg,
                "predicted_s": predicted,
                "measured_s": last,
                "mean_s": total / calls,
                "calls": calls,
            }
            for name, (algo, seg, predicted, last, total, calls) in self.last.items()
        }
        return {"model": None if params is None else params.as_dict(), "choices": choices}

    def inherit(self, parent: Tuner, version: Version | None) -> None:
        """Start from ``parent``'s ``version`` (:meth:`version_at` the call that made this
        sub-group, taken when it was issued): the same on every member, settled or still
        being agreed."""
        self.active = parent.active
        if version is None:
            return
        params = self.params_before(version) if version.future else version.params
        self.versions = [Version(0, params and dataclasses.replace(params, measured=(), rates=()))]
        if version.future is not None:
            self.versions.append(Version(0, None, version.future, inherited=True, before=self.versions[0]))


__all__ = [
    "MAX_SAMPLES",
    "Choice",
    "REFINE_EVERY",
    "REFINE_LAG",
    "TRIAL_AGAIN",
    "TRIAL_CALLS",
    "TRIAL_LAG",
    "TRIAL_MIN_BYTES",
    "MEASURE_KEEP",
    "Pending",
    "ROOT_SIZED",
    "Tuner",
    "Version",
    "describe",
]
