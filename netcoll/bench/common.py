"""What every benchmark runner agrees on, with no networking: size parsing, the
sweep configuration, per-collective buffer geometry and the nccl-tests bus
bandwidth factors.

``bench/compare.py`` runs its Gloo and MPI peers through the same functions,
so all implementations are measured on identical sizes and reported with
identical formulas.

nccl-tests conventions followed here (``src/common.cu``, ``doc/PERFORMANCE.md``):

* A requested size ``S`` bytes gives ``count = S // itemsize`` elements. For the
  collectives with one block per rank (all_gather, gather, reduce_scatter,
  all_to_all, scatter) each block has ``count // P`` elements, so the reported
  size is ``P * block`` elements (it can round down, even to 0), and the
  ``count`` column shows the per-rank block count (nccl-tests' ``paramcount``).
* ``size`` is the larger of the send and receive buffer: the output of
  all_gather / gather, the input of reduce_scatter / scatter, the whole
  per-rank buffer of all_to_all.
* ``algbw = size / time`` and ``busbw = algbw * factor`` with the factors in
  :data:`BUSBW_FACTOR`; GB/s means 1e9 bytes per second.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any, Final

import numpy as np

from ..ops import BFLOAT16, check_dtype, check_op_dtype, parse_op

#: ``--op all`` runs these, in this order (nccl-tests binaries' usual order).
OPS: Final = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
              "scatter")
REDUCING: Final = frozenset({"all_reduce", "reduce", "reduce_scatter"})
ROOTED: Final = frozenset({"broadcast", "reduce", "gather", "scatter"})
#: Collectives whose buffer is one block per rank (count column = block count).
BLOCKED: Final = frozenset({"all_gather", "gather", "reduce_scatter", "all_to_all", "scatter"})


def _ring(n: int) -> float:
    return (n - 1) / n


#: busbw = algbw * factor(P), from nccl-tests' ``doc/PERFORMANCE.md`` (gather and
#: scatter as in nccl-tests' gather/scatter tests: (P-1)/P).
BUSBW_FACTOR: Final[dict[str, Callable[[int], float]]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": _ring,
    "reduce_scatter": _ring,
    "all_to_all": _ring,
    "gather": _ring,
    "scatter": _ring,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}

#: nccl-tests' type names for the table's ``type`` column; others print numpy's name.
NCCL_TYPE_NAMES: Final[dict[str, str]] = {
    "float32": "float", "float64": "double", "float16": "half", "bfloat16": "bfloat16",
    "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
    "uint64": "uint64",
}
#: ``--dtype`` also accepts nccl-tests' names (``-d float``, ``-d half``, ...).
DTYPE_ALIASES: Final[dict[str, str]] = {
    "float": "float32", "double": "float64", "half": "float16", "bf16": "bfloat16", "int": "int32",
    "uint": "uint32", "char": "int8",
}

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """Bytes from ``4``, ``4K``, ``4KiB``, ``4KB``, ``64M``, ``64MiB``, ``1G`` ...

    As in nccl-tests, the suffixes are binary (``K`` = 1024), with or without
    ``iB``/``B``. Raises ``ValueError`` with the accepted forms.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be >= 0, got {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m or (m.group(3) and m.group(3).lower() == "i"):
        raise ValueError(f"not a size: {text!r} (use bytes with an optional K/M/G suffix: 4, 4K, 4KiB, 64M, "
                         "64MiB, 1G; suffixes are powers of 1024)")
    if m.group(3).lower() == "ib" and not m.group(2):
        raise ValueError(f"not a size: {text!r} ('iB' needs a K/M/G prefix)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def format_size(n: int) -> str:
    """``4 B``, ``64 KiB``, ``16 MiB`` (exact binary units when they divide, else bytes)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def sweep_sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """``minbytes, minbytes*factor, ...`` up to ``maxbytes`` (nccl-tests ``-b -e -f``)."""
    if minbytes < 0 or maxbytes < minbytes:
        raise ValueError(f"need 0 <= minbytes <= maxbytes, got -b {minbytes} -e {maxbytes}")
    if factor < 2:
        raise ValueError(f"step factor -f must be >= 2, got {factor}")
    sizes, s = [], minbytes
    while s <= maxbytes:
        sizes.append(s)
        if s == 0:
            s = 1
            continue
        s *= factor
    return sizes


def parse_ops(text: str | list[str]) -> list[str]:
    """``all``, one name, or a comma-separated list (``all_reduce,broadcast``)."""
    given = [text] if isinstance(text, str) else list(text)
    items = [t for item in given for t in str(item).replace(" ", "").split(",") if t]
    out: list[str] = []
    for item in items:
        name = item.strip().lower().replace("-", "_")
        if name == "all":
            out.extend(o for o in OPS if o not in out)
        elif name in OPS:
            if name not in out:
                out.append(name)
        else:
            raise ValueError(f"unknown collective {item!r}; choose from {', '.join(OPS)} or all")
    if not out:
        raise ValueError("no collective given")
    return out


def parse_dtype(text: str) -> np.dtype:
    name = DTYPE_ALIASES.get(str(text).strip().lower(), str(text).strip().lower())
    if name == "bfloat16":
        return BFLOAT16
    try:
        return check_dtype(name)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def type_name(dt: np.dtype) -> str:
    return NCCL_TYPE_NAMES.get(str(dt), str(dt))


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Buffers of one collective at one requested size on ``world_size`` ranks."""

    op: str
    world_size: int
    dtype: np.dtype
    count: int  #: the ``count`` column: total elements, or the per-rank block for BLOCKED ops
    size: int  #: the ``size`` column in bytes (what algbw divides)

    @property
    def block(self) -> int:
        return self.count

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape each rank passes in (the root's, for scatter)."""
        if self.op in ("reduce_scatter", "all_to_all", "scatter"):
            return (self.world_size, self.count)
        return (self.count,)

    @property
    def busbw_factor(self) -> float:
        return BUSBW_FACTOR[self.op](self.world_size)


def geometry(op: str, requested: int, dtype: Any, world_size: int) -> Geometry:
    dt = np.dtype(dtype)
    count = requested // dt.itemsize
    if op in BLOCKED:
        block = count // world_size
        return Geometry(op, world_size, dt, block, block * world_size * dt.itemsize)
    return Geometry(op, world_size, dt, count, count * dt.itemsize)


def bandwidth(size: int, seconds: float, factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s)."""
    if seconds <= 0:
        return 0.0, 0.0
    alg = size / seconds / 1e9
    return alg, alg * factor


@dataclasses.dataclass
class SweepConfig:
    """One sweep, as every rank runs it (travels to worker processes as JSON)."""

    ops: list[str] | str = dataclasses.field(default_factory=lambda: ["all_reduce"])
    minbytes: int = 4
    maxbytes: int = 64 << 20
    stepfactor: int = 4
    iters: int = 20
    warmup: int = 5
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    check: bool = True
    algorithm: str = "auto"
    segment_bytes: int | None = None
    timeout: float | None = None

    def validate(self) -> SweepConfig:
        self.ops = parse_ops(self.ops)
        sweep_sizes(self.minbytes, self.maxbytes, self.stepfactor)
        if self.iters < 1:
            raise ValueError(f"-n/--iters must be >= 1, got {self.iters}")
        if self.warmup < 0:
            raise ValueError(f"-w/--warmup_iters must be >= 0, got {self.warmup}")
        dt = parse_dtype(self.dtype)
        self.dtype = str(dt)
        self.redop = parse_op(self.redop).value
        if any(op in REDUCING for op in self.ops):
            try:
                check_op_dtype(self.redop, dt)
            except TypeError as exc:
                raise ValueError(str(exc)) from None
        if self.root < 0:
            raise ValueError(f"-r/--root must be >= 0, got {self.root}")
        if self.algorithm != "auto":
            from ..algorithms import ALGORITHMS

            known = sorted({a for op in self.ops for a in ALGORITHMS[op]})
            if self.algorithm not in known:
                raise ValueError(f"--algorithm {self.algorithm!r} is not an algorithm of "
                                 f"{', '.join(self.ops)}; choose auto or one of {', '.join(known)}")
        if self.segment_bytes is not None and self.segment_bytes < 1:
            raise ValueError(f"--segment-bytes must be >= 1, got {self.segment_bytes}")
        return self

    @property
    def np_dtype(self) -> np.dtype:
        return parse_dtype(self.dtype)

    def algorithm_for(self, op: str) -> str:
        """``algorithm``, or ``auto`` for a collective that has no algorithm of that name
        (so ``--op all --algorithm ring`` forces the ring where there is one)."""
        from ..algorithms import ALGORITHMS

        return self.algorithm if self.algorithm in ALGORITHMS[op] else "auto"

    def sizes(self) -> list[int]:
        return sweep_sizes(self.minbytes, self.maxbytes, self.stepfactor)

    def steps(self) -> Iterator[tuple[str, int]]:
        for op in self.ops:
            for size in self.sizes():
                yield op, size

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepConfig:
        return cls(**data).validate()


def make_row(g: Geometry, *, redop: str, root: int, seconds: float, median_seconds: float,
             min_seconds: float, wrong: int | None, **extra: Any) -> dict[str, Any]:
    """One result row (the JSON form; the table prints a subset)."""
    alg, bus = bandwidth(g.size, seconds, g.busbw_factor)
    return {
        "op": g.op,
        "size": g.size,
        "count": g.count,
        "type": type_name(g.dtype),
        "dtype": str(g.dtype),
        "redop": redop if g.op in REDUCING else "none",
        "root": root if g.op in ROOTED else -1,
        "time_us": seconds * 1e6,
        "algbw": alg,
        "busbw": bus,
        "wrong": wrong,
        "median_us": median_seconds * 1e6,
        "min_us": min_seconds * 1e6,
        "busbw_factor": g.busbw_factor,
        "world_size": g.world_size,
        "in_place": False,
        **extra,
    }
