"""Collective jobs: the pydantic model a client submits, the states a job
moves through, and the deterministic data a rank generates for (and checks
after) a benchmark job. No networking here.

States: ``queued -> running -> succeeded | failed | cancelled`` (a queued job
may also go straight to ``cancelled`` or ``failed``). A job always ends in
one of the last three, with a result or a reason.
"""

from __future__ import annotations

import enum
import re
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..ops import BFLOAT16, ReduceOp, check_dtype, check_op_dtype, finalize, parse_op, reduce_into

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "reduce_scatter",
               "all_to_all", "barrier")
BUFFER_OPS = ("put", "get", "delete")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
#: busbw = algbw x factor(n), as nccl-tests defines it
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n, "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "barrier": lambda n: 0.0,
}
MAX_JOB_BYTES = 1 << 34  # 16 GiB per rank


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """``4KiB``, ``64MiB``, ``1G``, ``512`` -> bytes (K/M/G/T are binary, 1024-based)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must be >= 0, got {text}")
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"cannot parse size {text!r} (use e.g. 4096, 4KiB, 64MiB, 1G)")
    value = float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " ")
    return int(value)


class JobSpec(BaseModel):
    """What to run. ``data="generated"`` makes each rank build deterministic
    input and verify the result (benchmarks); ``"inline"`` uses arrays sent
    with the job; ``"buffer"`` uses the named tensor ``input`` kept on the ranks."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "reduce_scatter",
                "all_to_all", "barrier", "put", "get", "delete"]
    dtype: str = "float32"
    size: int | None = Field(default=None, ge=0, description="bytes per rank (generated data)")
    shape: list[int] | None = None
    reduce_op: str = "sum"
    root: int = Field(default=0, ge=0)
    algorithm: str = "auto"
    iters: int = Field(default=1, ge=1, le=100_000)
    warmup: int = Field(default=0, ge=0, le=10_000)
    world_size: int | None = Field(default=None, ge=1, description="wait for this many ranks")
    deadline: float = Field(default=300.0, gt=0, le=7 * 86400)
    data: Literal["generated", "inline", "buffer"] = "generated"
    input: str | None = None
    output: str | None = None
    return_result: bool = True

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        dt = np.dtype(v) if v != "bfloat16" else check_dtype(_bf16())
        check_dtype(dt)
        return v

    @field_validator("reduce_op")
    @classmethod
    def _rop(cls, v: str) -> str:
        return parse_op(v).value

    @field_validator("size", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return None if v is None else parse_size(v)

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(d < 0 for d in v):
            raise ValueError(f"shape dimensions must be >= 0, got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.op in REDUCING:
            check_op_dtype(ReduceOp(self.reduce_op), self.np_dtype)
        if self.data == "generated" and self.op not in BUFFER_OPS and self.op != "barrier":
            if self.size is None and self.shape is None:
                self.size = 1 << 20
            if self.size is not None and self.size % self.np_dtype.itemsize:
                raise ValueError(f"size {self.size} is not a whole number of {self.dtype} elements "
                                 f"({self.np_dtype.itemsize} bytes each)")
            if self.nbytes > MAX_JOB_BYTES:
                raise ValueError(f"job of {self.nbytes} bytes per rank exceeds the limit of {MAX_JOB_BYTES}")
        if self.data == "buffer" and not self.input:
            raise ValueError("data='buffer' needs input=<name of a buffer put on the ranks>")
        if self.op in BUFFER_OPS and not (self.input or self.output):
            raise ValueError(f"{self.op} needs the buffer name (input= or output=)")
        return self

    @property
    def np_dtype(self) -> np.dtype:
        return check_dtype(_bf16() if self.dtype == "bfloat16" else np.dtype(self.dtype))

    @property
    def count(self) -> int:
        """Elements per rank for generated data."""
        if self.shape is not None:
            return int(np.prod(self.shape, dtype=np.int64))
        return (self.size or 0) // self.np_dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.count * self.np_dtype.itemsize


def _bf16() -> np.dtype:
    return BFLOAT16


# -- generated data ----------------------------------------------------------------
def _pattern(count: int, salt: int, dtype: np.dtype) -> np.ndarray:
    """Small integers (exact in every dtype, bool included)."""
    base = (np.arange(count, dtype=np.int64) + salt) % 7 + 1
    if dtype.kind == "b":
        return (base % 2).astype(dtype)
    if dtype.kind in "fV":  # float16/32/64 and bfloat16: via float32, exact for small integers
        return base.astype(np.float32).astype(dtype)
    return base.astype(dtype)


def generate_input(spec: JobSpec, rank: int, world: int) -> np.ndarray | None:
    """This rank's input for a generated-data job (None where the rank sends nothing)."""
    dt, n = spec.np_dtype, spec.count
    if spec.op in ("scatter",) and rank != spec.root:
        return None
    if spec.op in ("broadcast",) and rank != spec.root:
        return None
    if spec.op in ("scatter", "reduce_scatter", "all_to_all"):
        per = max(n // world, 0)
        return np.stack([_pattern(per, rank * world + j, dt) for j in range(world)]) if world else None
    return _pattern(n, rank, dt)


def expected_output(spec: JobSpec, rank: int, world: int) -> np.ndarray | None:
    """What ``rank`` must hold after the job (None where it gets nothing)."""
    dt, n, op = spec.np_dtype, spec.count, spec.op
    rop = ReduceOp(spec.reduce_op)
    if op == "broadcast":
        return _pattern(n, spec.root, dt)
    if op in ("all_gather", "gather"):
        if op == "gather" and rank != spec.root:
            return None
        return np.stack([_pattern(n, r, dt) for r in range(world)])
    if op == "scatter":
        return _pattern(max(n // world, 0), spec.root * world + rank, dt)
    if op == "all_to_all":
        per = max(n // world, 0)
        return np.stack([_pattern(per, j * world + rank, dt) for j in range(world)])
    if op in ("all_reduce", "reduce"):
        if op == "reduce" and rank != spec.root:
            return None
        parts = (lambda r: _pattern(n, r, dt))
    elif op == "reduce_scatter":
        per = max(n // world, 0)
        parts = (lambda r: _pattern(per, r * world + rank, dt))
    else:
        return None
    acc = parts(0).copy()
    for r in range(1, world):
        reduce_into(rop, acc, parts(r))
    finalize(rop, acc, world)
    return acc


def verify(spec: JobSpec, rank: int, world: int, got: np.ndarray | None) -> tuple[bool, int]:
    """(ok, number of wrong elements) for a generated-data job's result on ``rank``."""
    want = expected_output(spec, rank, world)
    if want is None:
        return got is None, 0
    if got is None or got.shape != want.shape:
        return False, int(want.size)
    if want.dtype.kind in "fcV":
        a = got.astype(np.complex128 if want.dtype.kind == "c" else np.float64)
        b = want.astype(np.complex128 if want.dtype.kind == "c" else np.float64)
        wrong = int(np.count_nonzero(~np.isclose(a, b, rtol=1e-2, atol=1e-2)))
    else:
        wrong = int(np.count_nonzero(got != want))
    return wrong == 0, wrong


def bandwidth(op: str, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one iteration of ``op`` moving ``nbytes``."""
    if seconds <= 0 or nbytes == 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * BUS_FACTOR.get(op, lambda n: 1.0)(world)
