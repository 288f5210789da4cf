"""Shared fixtures: ``make_group`` runs a test over the in-memory transport and
over real loopback TCP links (ids ``memory`` and ``tcp``; a test may ask for
shared-memory links too, id ``shm``: ``tests.support.ALL_LINKS``). Helpers: tests/support/."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support import TRANSPORTS, Group, MakeGroup, memory_group, tcp_group


@pytest.fixture(params=TRANSPORTS)
async def make_group(request: pytest.FixtureRequest) -> AsyncIterator[MakeGroup]:
    """``await make_group(n)``: a :class:`~tests.support.Group` of ``n`` ranks over the
    in-memory transport or over loopback TCP (the test runs once with each,
    ids ``memory`` and ``tcp``); every group made is closed after the test.
    ``killable=True`` for a group whose ranks the test kills."""
    groups: list[Group] = []

    async def make(size: int, *, killable: bool = False) -> Group:
        if request.param == "memory":
            group = memory_group(size)
        else:
            group = await tcp_group(size, killable=killable, links=request.param)
        groups.append(group)
        return group

    yield make
    for group in reversed(groups):
        await group.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _netcoll_logger_left_as_found() -> Iterator[None]:
    """A test (or the code it runs in-process: a CLI's main) must leave the ``netcoll`` logger
    as it found it: a level or ``propagate`` left behind silences later tests' ``caplog``
    on the same xdist worker, and the failure shows far from its cause."""
    logger = logging.getLogger("netcoll")
    before = (logger.level, logger.propagate, list(logger.handlers))
    yield
    after = (logger.level, logger.propagate, list(logger.handlers))
    assert after == before, f"the netcoll logger was left changed: {before} -> {after}"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move everything collection loaded (torch, matplotlib, every test module: millions of
    objects) out of the cyclic garbage collector's sight: a full collection then walks only
    what the tests make. Tests that collect garbage to see what leaked (`gc.collect()`)
    took 130 ms each in a whole-suite run instead of 30 ms, and every automatic
    collection paid the same."""
    gc.collect()
    gc.freeze()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the README's test command): two pytest-xdist workers per core this
    process may run on, at most 16. A quarter of the suite's time is spent waiting (for rank
    processes to start, heartbeats, timeouts the tests provoke), during which a second
    worker on the core runs other tests; on a 2-core machine that took the suite from
    336 s to 318 s while other jobs loaded it (more when the cores are otherwise idle).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still overrides (pytest-xdist's own setting)."""
    if raw := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(raw)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(2 * cores, 16)
