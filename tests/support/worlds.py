"""In-memory worlds of Communicators, per-rank test data, and helpers that run
one coroutine per rank and re-raise the first failure (Gloo's spawn() pattern)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

import netcoll
from netcoll.comm import Communicator
from netcoll.mesh.inprocess import MemoryHub
from netcoll.ops import ReduceOp, check_op_dtype

#: the repository's root (tests live one folder per layer below tests/)
REPO = Path(__file__).resolve().parents[2]


def memory_world(n: int, **kw: Any) -> tuple[MemoryHub, list[Communicator]]:
    hub = MemoryHub(n)
    return hub, [Communicator(t, **kw) for t in hub.meshes]


@contextlib.asynccontextmanager
async def connected_world(n: int, *, timeout: float = 15.0) -> AsyncIterator[list[Communicator]]:
    """``n`` Communicators from ``netcoll.connect`` in this loop, by rank, at a
    Coordinator of their own, each from its own loopback address (127.0.0.2, .3, ...)."""
    async with contextlib.AsyncExitStack() as stack:
        coord = await stack.enter_async_context(netcoll.Coordinator())

        async def one(i: int) -> Communicator:
            return await stack.enter_async_context(
                netcoll.connect(coord.address, world_size=n, local_host=f"127.0.0.{2 + i}", timeout=timeout)
            )

        async with asyncio.timeout(2 * timeout):
            comms = await asyncio.gather(*(one(i) for i in range(n)))
        yield sorted(comms, key=lambda c: c.rank)


async def run_world(
    n: int, fn: Callable[[Communicator], Awaitable[Any]], *, limit: float = 60.0, **kw: Any
) -> list[Any]:
    """Run ``fn(comm)`` on every rank of a fresh in-memory world; return per-rank results."""
    _, comms = memory_world(n, **kw)
    async with asyncio.timeout(limit):
        return list(await asyncio.gather(*(fn(c) for c in comms)))


async def run_world_settled(
    n: int, fn: Callable[[Communicator], Awaitable[Any]], *, limit: float = 30.0, **kw: Any
) -> list[Any]:
    """Like run_world, but returns exceptions as results (for failure tests)."""
    _, comms = memory_world(n, **kw)
    async with asyncio.timeout(limit):
        return list(await asyncio.gather(*(fn(c) for c in comms), return_exceptions=True))


def rank_data(rank: int, shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    """Deterministic per-rank test data that stays exact under the ops tested."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed * 1000 + rank)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        return rng.integers(0, 5, size=shape).astype(dt)
    if dt.kind == "c":
        return (rng.integers(-4, 5, size=shape) + 1j * rng.integers(-4, 5, size=shape)).astype(dt)
    return rng.integers(-8, 9, size=shape).astype(np.float32).astype(dt)


def valid_ops(dtype: object) -> list[ReduceOp]:
    """The reduction ops defined for ``dtype``."""
    out = []
    for op in ReduceOp:
        try:
            check_op_dtype(op, dtype)
            out.append(op)
        except TypeError:
            pass
    return out
