"""Waiting for a state instead of sleeping for a guessed time: a test that sleeps
"long enough for the sender to get there" fails on a loaded machine where it was not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(cond: Callable[[], object], timeout: float = 10.0, every: float = 0.002) -> None:
    """Return once ``cond()`` is true (checked every ``every`` seconds); TimeoutError
    after ``timeout`` seconds (a bound for a hang, not a guess of how long it takes)."""
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(every)


__all__ = ["until"]
