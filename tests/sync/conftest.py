"""Fixtures of the netcoll.sync tests: a coordinator on a loop thread of its own."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import netcoll
from tests.support.env import subprocess_env
from tests.support.loops import LoopThread

__all__ = ["PYTHON", "coordinator", "in_threads", "subprocess_env", "sync_threads"]


@pytest.fixture
def coordinator() -> Iterator[str]:
    """The address of an in-process coordinator (no token) on 127.0.0.1."""
    thread = LoopThread("coordinator")
    coord = netcoll.Coordinator()
    asyncio.run_coroutine_threadsafe(coord.__aenter__(), thread.loop).result(30)
    try:
        yield coord.address
    finally:
        asyncio.run_coroutine_threadsafe(coord.__aexit__(None, None, None), thread.loop).result(30)
        thread.stop()


def in_threads(n: int, fn: Callable[[int], Any], timeout: float = 60.0) -> list[Any]:
    """``fn(rank)`` for each rank on a thread of its own; results in rank order."""
    with ThreadPoolExecutor(n, thread_name_prefix="rank") as pool:
        return [f.result(timeout) for f in [pool.submit(fn, r) for r in range(n)]]


def sync_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "netcoll-sync"]


PYTHON = sys.executable
