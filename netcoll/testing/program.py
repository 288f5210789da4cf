"""The explorer's programs: what every rank issues, in one order, and how each
rank schedules its own awaits.

A :class:`Program` is a pure function of ``(seed, ranks, tuning, steps)``
(:func:`generate`): ``K`` steps, each an operation issued in the same order on
every rank (the sequence number is taken at the call, as in MPI) — a
collective of the world or of a sub-group made by an earlier ``split``, a
send/receive pair, a ``split`` itself or (with tuning) a ``calibrate`` — with
its dtype, shape, reduction op, root and algorithm (``"auto"`` or a fixed
one), and now and then one :class:`Cancel`. Sizes run from 0 bytes to a few
MiB, mostly small and log-distributed.

:func:`schedule` gives one rank's order of actions: every issue in program
order, each await after its issue, in a per-rank random order (all issued
first, or interleaved with the issues), each action after a random delay
(``asyncio.sleep(0)`` a few times, or a short sleep). :meth:`Program.describe`
prints the program so a failure can be read and replayed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from ..algorithms import ALGORITHMS
from ..ops import ReduceOp, check_op_dtype

#: operations a program draws from, with their weights
KINDS: Final = {
    "all_reduce": 6,
    "reduce": 2,
    "broadcast": 3,
    "all_gather": 3,
    "gather": 2,
    "scatter": 2,
    "reduce_scatter": 2,
    "all_to_all": 2,
    "barrier": 1,
    "p2p": 3,
    "split": 1,
    "calibrate": 1,
}
REDUCING: Final = ("all_reduce", "reduce", "reduce_scatter")
ROOTED: Final = ("reduce", "broadcast", "gather", "scatter")
#: one row per rank: the input has a leading rank axis (scatter: at the root)
ROWS: Final = ("scatter", "reduce_scatter", "all_to_all")
DTYPES: Final = {
    "float32": 4,
    "float64": 2,
    "int64": 2,
    "int32": 1,
    "int16": 1,
    "int8": 1,
    "uint8": 1,
    "uint16": 1,
    "uint32": 1,
    "uint64": 1,
    "float16": 1,
    "bfloat16": 1,
    "complex64": 1,
    "complex128": 1,
    "bool": 1,
}
MAX_SPLITS: Final = 2
BURST: Final = (4, 9)  # with tuning, a run of 4 to 9 calls alike (:func:`_burst`)
CANCEL_CHANCE: Final = 0.3  # of a program having one cancel
SUB_CHANCE: Final = 0.35  # of a step after a split running on one of its sub-groups
OUT_CHANCE: Final = 0.2  # of a step of :data:`OUTS` passing ``out=`` buffers
TASK_CANCEL_CHANCE: Final = 0.35  # of a cancel being that of the task awaiting the Work
GATHER_CHANCE: Final = 0.3  # of a rank awaiting some Works together, each in a task of its own
COMPRESS_CHANCE: Final = 0.3  # of a step that can be compressed being compressed
#: the collectives that take ``compression=`` (on float dtypes; reductions: sum avg min max)
COMPRESSIBLE: Final = ("all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast")
CODECS: Final = ("fp16", "bf16", "int8")
OUTS: Final = ("all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter", "reduce_scatter", "all_to_all")


@dataclass(frozen=True, slots=True)
class Step:
    """One issued operation. ``on``: ``(split step, colour)`` for a sub-group, None for
    the world. Ranks (``root``, ``src``, ``dst``) are the group's. ``shape``: the input
    of one rank (with a leading rank axis for :data:`ROWS`). ``colors``/``keys``: a
    split's, per world rank."""

    index: int
    kind: str
    on: tuple[int, int] | None = None
    dtype: str = ""
    shape: tuple[int, ...] = ()
    op: str = ""
    root: int = 0
    algorithm: str = "auto"
    src: int = 0
    dst: int = 0
    tag: int = 0
    colors: tuple[int | None, ...] = ()
    keys: tuple[int, ...] = ()
    out: bool = False  # results into buffers passed as ``out=`` (a broadcast's: as its buffer)
    compression: str = "none"  # the codec (netcoll.compression) of a step of COMPRESSIBLE

    def describe(self, members: tuple[int, ...]) -> str:
        where = "" if self.on is None else f"on split#{self.on[0]}:{self.on[1]} (world ranks {list(members)}) "
        if self.kind == "split":
            return f"#{self.index} split colors={list(self.colors)} keys={list(self.keys)}"
        if self.kind in ("barrier", "calibrate"):
            return f"#{self.index} {where}{self.kind}" + (" algorithm=" + self.algorithm) * (self.kind == "barrier")
        text = f"#{self.index} {where}{self.kind} {self.dtype}{list(self.shape)}"
        if self.kind == "p2p":
            return f"{text} {self.src}->{self.dst} tag={self.tag}"
        text += f" op={self.op}" * (self.kind in REDUCING) + f" root={self.root}" * (self.kind in ROOTED)
        text += f" compression={self.compression}" * (self.compression != "none")
        return f"{text} algorithm={self.algorithm}" + " out=buffer" * self.out


@dataclass(frozen=True, slots=True)
class Cancel:
    """``work.cancel()`` of step ``step`` on world rank ``rank``: ``after`` < 0 right
    after issuing it, 0 after a few ``asyncio.sleep(0)``, else after that many seconds."""

    step: int
    rank: int
    after: float
    how: str = "work"  # or "task": cancel a task that awaits the Work (the task starts awaiting first)

    def describe(self) -> str:
        when = "right after issue" if self.after < 0 else "after a few yields" if self.after == 0 else None
        what = f"cancel #{self.step}" if self.how == "work" else f"cancel the task awaiting #{self.step}"
        return f"{what} on rank {self.rank} {when or f'after {self.after * 1e3:.2f} ms'}"


@dataclass(frozen=True, slots=True)
class Program:
    """What every rank runs (see the module docstring). ``every``/``lag``: the tuner's
    refinement period and lag while tuning (small: agreements land mid-program)."""

    seed: int
    ranks: int
    tuning: bool
    steps: tuple[Step, ...]
    cancel: Cancel | None
    every: int = 3
    lag: int = 1

    def members(self, step: Step) -> tuple[int, ...]:
        """The world ranks of the step's group, in group rank order."""
        if step.on is None:
            return tuple(range(self.ranks))
        split = self.steps[step.on[0]]
        return tuple(
            r for _, r in sorted((split.keys[r], r) for r in range(self.ranks) if split.colors[r] == step.on[1])
        )

    def takes_part(self, step: Step, rank: int) -> bool:
        """Whether world rank ``rank`` issues ``step``."""
        members = self.members(step)
        if rank not in members:
            return False
        return step.kind != "p2p" or members.index(rank) in (step.src, step.dst)

    def describe(self) -> str:
        head = f"program seed={self.seed} ranks={self.ranks} tuning={'on' if self.tuning else 'off'}"
        head += f" (refine every {self.every}, lag {self.lag})" * self.tuning
        lines = [f"{head}: {len(self.steps)} steps"]
        lines += [f"  {s.describe(self.members(s))}" for s in self.steps]
        if self.cancel is not None:
            lines.append(f"  {self.cancel.describe()}")
        return "\n".join(lines)


def _pick(rng: np.random.Generator, weights: dict[str, int]) -> str:
    names = list(weights)
    p = np.array([weights[n] for n in names], np.float64)
    return names[int(rng.choice(len(names), p=p / p.sum()))]


def _nbytes(rng: np.random.Generator) -> int:
    """0 bytes now and then; mostly up to 64 KiB, log-distributed; up to 1 MiB; a few MiB rarely."""
    u = rng.random()
    if u < 0.08:
        return 0
    top = 16 if u < 0.82 else 20 if u < 0.97 else 22
    return int(2 ** rng.uniform(0, top))


def _shape(rng: np.random.Generator, count: int) -> tuple[int, ...]:
    if count > 3 and rng.random() < 0.2:
        a = int(rng.integers(2, 5))
        return (a, count // a)
    return (count,)


def _step(
    rng: np.random.Generator, index: int, kind: str, on: tuple[int, int] | None, size: int, hot: int | None = None
) -> Step:
    """A random step; ``hot``: of this many bytes, algorithm ``auto`` (a burst)."""
    dtype = _pick(rng, DTYPES)
    count = (_nbytes(rng) if hot is None else hot) // np.dtype("uint16" if dtype == "bfloat16" else dtype).itemsize
    if kind in ("all_gather", "gather", *ROWS):
        count //= size
    shape = _shape(rng, count)
    if kind in ROWS:
        shape = (size, *shape)
    op = ""
    if kind in REDUCING:
        ops = [o.value for o in ReduceOp if _valid(o, dtype)]
        op = ops[int(rng.integers(len(ops)))]
    algos = ALGORITHMS.get(kind, {})
    algorithm = "auto" if not algos or hot or rng.random() < 0.5 else sorted(algos)[int(rng.integers(len(algos)))]
    root = int(rng.integers(size)) if kind in ROOTED else 0
    src, dst = (int(v) for v in rng.choice(size, 2, replace=False)) if kind == "p2p" else (0, 0)
    tag = int(rng.integers(3)) if kind == "p2p" else 0
    return Step(index, kind, on, dtype, shape, op, root, algorithm, src, dst, tag)


def _valid(op: ReduceOp, dtype: str) -> bool:
    try:
        check_op_dtype(op, "bfloat16" if dtype == "bfloat16" else np.dtype(dtype))
    except TypeError:
        return False
    return True


def generate(seed: int, ranks: int, *, tuning: bool = False, steps: int | None = None) -> Program:
    """The program of ``seed`` for a world of ``ranks`` (``steps``: its length, else 3 to 16)."""
    rng = np.random.default_rng([seed, ranks, int(tuning), 34])
    k = int(rng.integers(3, 17)) if steps is None else steps
    kinds = dict(KINDS)
    if not tuning:
        del kinds["calibrate"]
    out: list[Step] = []
    groups: list[tuple[int, int, int]] = []  # (split step, colour, size) of the sub-groups so far
    burst = _burst(rng, k) if tuning else None
    for i in range(k):
        if burst is not None and burst[0] <= i < burst[1]:
            out.append(_step(rng, i, burst[2], None, ranks, burst[3]))
            continue
        kind = _pick(rng, kinds)
        if kind == "split" and sum(s.kind == "split" for s in out) >= MAX_SPLITS:
            kind = "all_reduce"
        if kind == "split":
            colors = tuple(None if rng.random() < 0.1 else int(rng.integers(2)) for _ in range(ranks))
            keys = tuple(int(rng.integers(3)) for _ in range(ranks))
            out.append(Step(i, "split", colors=colors, keys=keys))
            groups += [(i, c, colors.count(c)) for c in sorted({c for c in colors if c is not None})]
            continue
        on, size = None, ranks
        usable = [g for g in groups if kind != "p2p" or g[2] >= 2]
        if kind != "calibrate" and usable and rng.random() < SUB_CHANCE:
            split, color, size = usable[int(rng.integers(len(usable)))]
            on = (split, color)
        out.append(_step(rng, i, kind, on, size))
    program = Program(seed, ranks, tuning, tuple(out), None, int(rng.choice([2, 3, 5])), int(rng.choice([1, 2, 4])))
    return _with_compression(seed, _with_more(seed, _with_cancel(rng, program)))


def _with_compression(seed: int, program: Program) -> Program:
    """Now and then a step compressed (a codec drawn apart, so the rest stays as it was): a
    float step of :data:`COMPRESSIBLE` (reductions: sum, avg, min, max, algorithm auto)."""
    rng = np.random.default_rng([seed, program.ranks, 36])
    steps = []
    for s in program.steps:
        pick, codec = rng.random() < COMPRESS_CHANCE, CODECS[int(rng.integers(len(CODECS)))]
        fits = s.kind in COMPRESSIBLE and s.dtype in ("float16", "bfloat16", "float32", "float64")
        if pick and fits and (s.kind not in REDUCING or s.op in ("sum", "avg", "min", "max")):
            s = dataclasses.replace(s, compression=codec, algorithm="auto" if s.kind in REDUCING else s.algorithm)
        steps.append(s)
    return dataclasses.replace(program, steps=tuple(steps))


def _with_more(seed: int, program: Program) -> Program:
    """Now and then a step with ``out=`` buffers, and a cancel through the awaiting task
    (drawn apart, so what the earlier draws made stays as it was)."""
    rng = np.random.default_rng([seed, program.ranks, 35])
    picks = rng.random(len(program.steps)) < OUT_CHANCE
    steps = tuple(
        dataclasses.replace(s, out=True) if pick and s.kind in OUTS else s
        for s, pick in zip(program.steps, picks, strict=True)
    )
    cancel = program.cancel
    if cancel is not None and rng.random() < TASK_CANCEL_CHANCE:
        cancel = dataclasses.replace(cancel, how="task")
    return dataclasses.replace(program, steps=steps, cancel=cancel)


def _burst(rng: np.random.Generator, k: int) -> tuple[int, int, str, int] | None:
    """Now and then (with tuning), a run of one collective of one size from 64 KiB, ``auto``,
    as a training loop calls it: ``(first step, end, kind, bytes)``. From the 4th call of a
    size band, its algorithms go on trial (agreements of their measured times mid-program)."""
    if k < BURST[0] or rng.random() >= 0.5:
        return None
    length = int(rng.integers(BURST[0], min(k, BURST[1]) + 1))
    first = int(rng.integers(k - length + 1))
    kind = ("all_reduce", "all_reduce", "all_gather", "reduce_scatter", "all_to_all")[int(rng.integers(5))]
    return first, first + length, kind, int(2 ** rng.uniform(16, 20))


def _with_cancel(rng: np.random.Generator, program: Program) -> Program:
    can = [s for s in program.steps if s.kind not in ("split", "calibrate")]
    if not can or rng.random() >= CANCEL_CHANCE:
        return program
    step = can[int(rng.integers(len(can)))]
    members = [r for r in program.members(step) if program.takes_part(step, r)]
    rank = members[int(rng.integers(len(members)))]
    u = rng.random()
    after = -1.0 if u < 0.35 else 0.0 if u < 0.6 else float(rng.uniform(0, 3e-3))
    return dataclasses.replace(program, cancel=Cancel(step.index, rank, after))


@dataclass(frozen=True, slots=True)
class Action:
    """One rank's next move: ``issue`` or ``await`` step ``step`` (``gather``: await the
    steps ``together`` at once, each in a task of its own), first yielding ``yields``
    times to the loop and sleeping ``sleep`` seconds."""

    verb: str
    step: int
    yields: int = 0
    sleep: float = 0.0
    together: tuple[int, ...] = ()

    def describe(self) -> str:
        wait = f" after {self.yields} yields" * bool(self.yields)
        wait += f" after {self.sleep * 1e3:.2f} ms" * bool(self.sleep)
        what = " ".join(f"#{i}" for i in self.together) if self.together else f"#{self.step}"
        return f"{self.verb} {what}{wait}"


def schedule(program: Program, rank: int) -> list[Action]:
    """World rank ``rank``'s actions for ``program`` (steps it has no part in included:
    the runner skips them). Per rank and seed, always the same."""
    rng = np.random.default_rng([program.seed, program.ranks, rank, 77])
    mode = rng.random()  # < 0.5: issue all, then await in a random order; else interleaved
    out: list[Action] = []
    pending: list[int] = []
    for step in program.steps:
        out.append(Action("issue", step.index, *_delay(rng)))
        pending.append(step.index)
        while pending and mode >= 0.5 and rng.random() < 0.45:
            out.append(Action("await", pending.pop(int(rng.integers(len(pending)))), *_delay(rng)))
    for i in rng.permutation(len(pending)):
        out.append(Action("await", pending[int(i)], *_delay(rng)))
    return _gathered(np.random.default_rng([program.seed, program.ranks, rank, 78]), out)


def _gathered(rng: np.random.Generator, actions: list[Action]) -> list[Action]:
    """Now and then, runs of 2 to 4 awaits in a row made one ``gather``."""
    if rng.random() >= GATHER_CHANCE:
        return actions
    out: list[Action] = []
    for a in actions:
        last = out[-1] if out else None
        if a.verb == "await" and last is not None and last.verb in ("await", "gather") and rng.random() < 0.6:
            together = last.together or (last.step,)
            if len(together) < 4:
                out[-1] = dataclasses.replace(last, verb="gather", together=(*together, a.step))
                continue
        out.append(a)
    return out


def _delay(rng: np.random.Generator) -> tuple[int, float]:
    u = rng.random()
    if u < 0.5:
        return 0, 0.0
    if u < 0.8:
        return int(rng.integers(1, 6)), 0.0
    return 0, float(math.floor(rng.uniform(0, 2e-3) * 1e6) / 1e6)


__all__ = ["KINDS", "Action", "Cancel", "Program", "Step", "generate", "schedule"]
