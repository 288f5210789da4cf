"""Shared-memory link tests run on two event loops: asyncio's own (small
frames go over the socket: nothing polls the lanes) and netcoll's spinning
loop (small frames go through the lanes, :mod:`netcoll.links.lane`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from netcoll.loop import new_event_loop

BOTH_LOOPS = ("test_shm_links.py", "test_shm_kill.py", "test_shm_lane.py", "test_shm_direct.py")


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    if item.path.name in BOTH_LOOPS:
        return {"asyncio": asyncio.new_event_loop, "spin": lambda: new_event_loop("spin")}
    return {"asyncio": asyncio.new_event_loop}
