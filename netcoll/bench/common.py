"""What every benchmark runner agrees on, with no networking: the sweep
configuration and per-collective buffer geometry. Sizes parse with
:func:`netcoll.sizes.parse_size`; collectives, their buffer layout and their
nccl-tests bus-bandwidth factors come from the registry
(:mod:`netcoll.collectives`).

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
* ``algbw = size / time`` and ``busbw = algbw * factor`` with the registry's
  factors (:meth:`netcoll.collectives.Collective.busbw_factor`); GB/s means 1e9
  bytes per second.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Final

import numpy as np

from .. import collectives
from ..collectives import Collective
from ..compression import compressible, parse_compression
from ..ops import BFLOAT16, check_dtype, check_op_dtype, parse_op

#: ``--op all`` runs these, in this order: the registry's collectives that move data.
OPS: Final = collectives.WITH_DATA

#: nccl-tests' type names for the table's ``type`` column; others print numpy's name.
NCCL_TYPE_NAMES: Final[dict[str, str]] = {
    "float32": "float",
    "float64": "double",
    "float16": "half",
    "bfloat16": "bfloat16",
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
}
#: ``--dtype`` also accepts nccl-tests' names (``-d float``, ``-d half``, ...).
DTYPE_ALIASES: Final[dict[str, str]] = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "bf16": "bfloat16",
    "int": "int32",
    "uint": "uint32",
    "char": "int8",
}


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
    count: int  #: the ``count`` column: total elements, or the per-rank block for blocked collectives
    size: int  #: the ``size`` column in bytes (what algbw divides)

    @property
    def collective(self) -> Collective:
        return collectives.get(self.op)

    @property
    def block(self) -> int:
        return self.count

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape each rank passes in (the root's, for scatter)."""
        return self.collective.input_shape(self.world_size, self.count)

    @property
    def output_shape(self) -> tuple[int, ...]:
        """Shape of each receiving rank's result."""
        return self.collective.output_shape(self.world_size, self.count)

    @property
    def busbw_factor(self) -> float:
        return self.collective.busbw_factor(self.world_size)


def geometry(op: str, requested: int, dtype: Any, world_size: int) -> Geometry:
    """The buffers of ``op`` for a requested size of ``requested`` bytes (nccl-tests' rules)."""
    coll, dt = collectives.get(op), np.dtype(dtype)
    count = requested // dt.itemsize
    block = count // world_size if coll.blocked else count
    return Geometry(op, world_size, dt, block, coll.nbytes(world_size, block, dt.itemsize))


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
    #: the codec of the collectives that take one (netcoll.compression), on float dtypes
    compression: str = "none"
    segment_bytes: int | None = None
    timeout: float | None = None
    #: algorithms (``auto`` included) to alternate in one group, each size in turn: a block
    #: of ``iters`` calls of each, ``rounds`` times, the order reversed every other round
    #: (:func:`netcoll.bench.sweep.run_sweep`); empty: ``algorithm`` alone
    alternate: list[str] = dataclasses.field(default_factory=list)
    rounds: int = 1

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
        if any(collectives.get(op).takes_op for op in self.ops):
            try:
                check_op_dtype(self.redop, dt)
            except TypeError as exc:
                raise ValueError(str(exc)) from None
        if self.root < 0:
            raise ValueError(f"-r/--root must be >= 0, got {self.root}")
        if self.algorithm != "auto":
            known = sorted({a for op in self.ops for a in collectives.get(op).algorithms} - {"auto"})
            if self.algorithm not in known:
                raise ValueError(
                    f"--algorithm {self.algorithm!r} is not an algorithm of "
                    f"{', '.join(self.ops)}; choose auto or one of {', '.join(known)}"
                )
        self.compression = parse_compression(self.compression, "--compression")
        if self.compression != "none" and self.algorithm != "auto":
            raise ValueError(f"--compression {self.compression} runs with --algorithm auto")
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        names = {a for op in self.ops for a in collectives.get(op).algorithms}
        unknown = [a for a in self.alternate if a not in names]
        if unknown:
            bad = ", ".join(map(repr, unknown))
            raise ValueError(f"cannot alternate {bad}: choose from {', '.join(sorted(names))}")
        if self.segment_bytes is not None and self.segment_bytes < 1:
            raise ValueError(f"--segment-bytes must be >= 1, got {self.segment_bytes}")
        return self

    @property
    def np_dtype(self) -> np.dtype:
        return parse_dtype(self.dtype)

    def compression_for(self, op: str) -> str:
        """``compression`` where it runs: a collective that takes it, a float dtype, a
        reduction it takes (sum, avg, min, max); else ``"none"``."""
        coll = collectives.get(op)
        if not coll.takes_compression or not compressible(self.np_dtype):
            return "none"
        if coll.takes_op and self.redop not in ("sum", "avg", "min", "max"):
            return "none"
        return self.compression

    def algorithm_for(self, op: str) -> str:
        """``algorithm``, or ``auto`` for a collective that has no algorithm of that name
        (so ``--op all --algorithm ring`` forces the ring where there is one)."""
        return self.algorithm if self.algorithm in collectives.get(op).algorithms else "auto"

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


def make_row(
    g: Geometry,
    *,
    redop: str,
    root: int,
    seconds: float,
    median_seconds: float,
    min_seconds: float,
    wrong: int | None,
    **extra: Any,
) -> dict[str, Any]:
    """One result row (the JSON form; the table prints a subset)."""
    coll = g.collective
    alg, bus = coll.bandwidth(g.size, seconds, g.world_size)
    return {
        "op": g.op,
        "size": g.size,
        "count": g.count,
        "type": type_name(g.dtype),
        "dtype": str(g.dtype),
        "redop": redop if coll.takes_op else "none",
        "root": root if coll.takes_root else -1,
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
