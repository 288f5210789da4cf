"""Shared fixtures: ``make_group`` runs a test over the in-memory transport and
over real loopback TCP links (ids ``memory`` and ``tcp``; a test may ask for
shared-memory links too, id ``shm``: ``tests.support.ALL_LINKS``). Helpers: tests/support/."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator

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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move everything collection loaded (torch, matplotlib, every test module: millions of
    objects) out of the cyclic garbage collector's sight: a full collection then walks only
    what the tests make. Tests that collect garbage to see what leaked (`gc.collect()`)
    took 130 ms each in a whole-suite run instead of 30 ms, and every automatic
    collection paid the same."""
    gc.collect()
    gc.freeze()
