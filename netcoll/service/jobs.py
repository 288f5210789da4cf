"""Collective jobs: the pydantic model a client submits, the states a job
moves through, and the deterministic data a rank generates for (and checks
after) a generated-data job. No networking here.

What each collective takes, its bus-bandwidth factor and its test data come
from the registry (:mod:`netcoll.collectives`); sizes parse with
:func:`netcoll.sizes.parse_size`, as everywhere else.

States: ``queued -> running -> succeeded | failed | cancelled`` (a queued job
may also go straight to ``cancelled`` or ``failed``). A job always ends in
one of the last three, with a result or a reason.
"""

from __future__ import annotations

import enum
from typing import Any, Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .. import choices, collectives
from ..collectives import Collective
from ..compression import check_codec, parse_compression
from ..limits import DEFAULT as LIMITS
from ..limits import exceeded
from ..ops import BFLOAT16, ReduceOp, check_dtype, check_op_dtype
from ..sizes import format_size, parse_size
from ..testdata import TestData

__all__ = [
    "BUFFER_OPS",
    "COLLECTIVES",
    "MAX_JOB_BYTES",
    "JobSpec",
    "JobState",
    "generate_input",
    "parse_size",
    "verify",
]

#: Every collective a job can run (the registry's names).
COLLECTIVES: Final = collectives.NAMES
#: Jobs that manage named tensors kept on the ranks, not collectives.
BUFFER_OPS: Final = ("put", "get", "delete")
MAX_JOB_BYTES: Final = 1 << 34  # 16 GiB per rank: the default of max_job_bytes (netcoll.limits)


#: where a job limit must be raised: every process checks the job against its own
_EVERY_PROCESS: Final = " where you submit, on the coordinator and on the rank daemons"


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class JobSpec(BaseModel):
    """What to run. ``data="generated"`` makes each rank build deterministic
    input and verify the result (benchmarks); ``"inline"`` uses arrays sent
    with the job; ``"buffer"`` uses the named tensor ``input`` kept on the ranks."""

    model_config = ConfigDict(extra="forbid")

    op: str = Field(description="a collective of netcoll.collectives, or put / get / delete")
    dtype: str = "float32"
    size: int | None = Field(default=None, ge=0, description="bytes per rank (generated data)")
    shape: list[int] | None = None
    reduce_op: str = "sum"
    root: int = Field(default=0, ge=0)
    algorithm: str = "auto"
    #: the codec (netcoll.compression) of all_reduce, reduce, reduce_scatter, all_gather and
    #: broadcast: "none", "fp16", "bf16", "int8"; None: the rank daemons' NETCOLL_COMPRESSION
    compression: str | None = None
    iters: int = Field(default=1, ge=1, le=100_000)
    warmup: int = Field(default=0, ge=0, le=10_000)
    world_size: int | None = Field(default=None, ge=1, description="wait for this many ranks")
    #: seconds, from when the scheduler first considers the job; the coordinator refuses one
    #: above its ``max_deadline_s`` limit (netcoll.limits, default 1 day)
    deadline: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    data: Literal["generated", "inline", "buffer"] = "generated"
    input: str | None = None
    output: str | None = None
    return_result: bool = True
    #: record a timeline (send/receive/reduce spans on every rank): Client.trace(id)
    trace: bool = False

    @field_validator("op")
    @classmethod
    def _op(cls, v: str) -> str:
        if v not in COLLECTIVES and v not in BUFFER_OPS:
            names = (*COLLECTIVES, *BUFFER_OPS)
            raise ValueError(f"unknown op {v!r}; {choices.did_you_mean(v, names)}choose from {', '.join(names)}")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        return choices.check_dtype_name(v)

    @field_validator("reduce_op")
    @classmethod
    def _rop(cls, v: str) -> str:
        return choices.check_reduce_op(v)

    @field_validator("compression")
    @classmethod
    def _compression(cls, v: str | None) -> str | None:
        return None if v is None else parse_compression(v)

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
        coll = self.collective
        if coll is not None:
            self._check_collective(coll)
        if self.data == "generated" and coll is not None and coll.has_data:
            self._check_generated()
        if self.data == "buffer" and not self.input:
            raise ValueError("data='buffer' needs input=<name of a buffer put on the ranks>")
        if self.op in BUFFER_OPS and not (self.input or self.output):
            raise ValueError(f"{self.op} needs the buffer name (input= or output=)")
        return self

    def _check_collective(self, coll: Collective) -> None:
        """The reduction suits the dtype; the algorithm is one of the collective's; the
        root is one of ``world_size`` ranks (:mod:`netcoll.choices`)."""
        if coll.takes_op:
            check_op_dtype(ReduceOp(self.reduce_op), self.np_dtype)
        choices.check_algorithm(coll, self.algorithm)
        choices.check_root(coll, self.root, self.world_size)
        if self.compression not in (None, "none"):
            self._check_compression(coll, self.compression)

    def _check_compression(self, coll: Collective, codec: str) -> None:
        """What a compressed call refuses, refused at submission (netcoll.calls.compressed)."""
        if not coll.takes_compression:
            raise ValueError(f"{coll.name} takes no compression (compression={codec!r})")
        check_codec(codec, self.np_dtype, coll.name)
        if coll.takes_op and self.reduce_op not in ("sum", "avg", "min", "max"):
            raise ValueError(f"reduce_op={self.reduce_op!r} cannot be compressed (sum, avg, min, max)")
        if coll.takes_op and self.algorithm != "auto":
            raise ValueError(f"compression={codec!r} runs {coll.name}'s one compressed plan: algorithm must be 'auto'")

    def _check_generated(self) -> None:
        """A default size, whole elements, and the per-rank limit."""
        if self.size is None and self.shape is None:
            self.size = 1 << 20
        if self.size is not None and self.size % self.np_dtype.itemsize:
            raise ValueError(
                f"size {self.size} is not a whole number of {self.dtype} elements ({self.np_dtype.itemsize} bytes each)"
            )
        if self.nbytes > LIMITS.max_job_bytes:  # each process's own (submitter, coordinator, daemons)
            what = f"a job of {format_size(self.nbytes)} per rank"
            raise ValueError(exceeded(what, "max_job_bytes", LIMITS.max_job_bytes, _EVERY_PROCESS))

    @property
    def collective(self) -> Collective | None:
        """The registry entry of ``op`` (None for put / get / delete)."""
        return collectives.REGISTRY.get(self.op)

    @property
    def np_dtype(self) -> np.dtype:
        return check_dtype(BFLOAT16 if self.dtype == "bfloat16" else np.dtype(self.dtype))

    @property
    def count(self) -> int:
        """Elements per rank for generated data."""
        if self.shape is not None:
            return int(np.prod(self.shape, dtype=np.int64))
        return (self.size or 0) // self.np_dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.count * self.np_dtype.itemsize


# -- generated data (the registry's generator and verifier) -----------------------------------------
def _data(spec: JobSpec, world: int) -> TestData:
    return TestData(spec.reduce_op, spec.np_dtype, world)


def generate_input(spec: JobSpec, rank: int, world: int) -> np.ndarray | None:
    """This rank's input for a generated-data job (None where the rank sends nothing)."""
    coll = spec.collective
    if coll is None:  # put of generated data: this rank's pattern
        return _data(spec, world).array((spec.count,), rank)
    return coll.make_input(_data(spec, world), coll.block_of(spec.count, world), rank, spec.root)


def verify(spec: JobSpec, rank: int, world: int, got: Any) -> tuple[bool, int]:
    """(ok, number of wrong elements) for a generated-data job's result on ``rank``."""
    coll = spec.collective
    if coll is None:
        return True, 0
    block = coll.block_of(spec.count, world)
    wrong = coll.count_wrong(_data(spec, world), block, rank, spec.root, got, spec.compression)
    return wrong == 0, wrong
