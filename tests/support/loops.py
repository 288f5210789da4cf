"""An event loop in a thread of its own, for liveness tests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop in a thread of its own: the "user's process" of a member or daemon,
    whose loop a test can block."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    async def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return await asyncio.wait_for(asyncio.wrap_future(fut), timeout)

    def block(self, seconds: float) -> None:
        """Block this loop (like a long synchronous training step) without waiting for it."""
        self.loop.call_soon_threadsafe(time.sleep, seconds)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
