"""The loop thread of :mod:`netcoll.sync`: an asyncio event loop in a daemon thread
holding one :func:`netcoll.connect` session open, and the hand-over of a finished
Work's outcome to the blocked calling thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .. import settings, threads
from ..comm import Communicator
from ..errors import CollectiveCancelled, CommunicatorClosed
from ..loop import new_event_loop
from ..operation import Work
from ..session import connect as _connect

T = TypeVar("T")
CLOSE_TIMEOUT = 30.0  # seconds close() waits for the loop thread to leave the group

log = logging.getLogger("netcoll.sync")


class Runner:
    """An event loop in a daemon thread, holding one :func:`netcoll.connect`
    session open until :meth:`stop`."""

    def __init__(self, loop: str | None) -> None:
        self.loop = new_event_loop(loop or settings.loop() or "asyncio")
        self.thread = threading.Thread(target=self._run, name="netcoll-sync", daemon=True)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self, **options: Any) -> Communicator:
        ready: concurrent.futures.Future[Communicator] = concurrent.futures.Future()
        self._task = self.loop.create_task(self._session(ready, options))  # the loop is not running yet
        try:
            threads.start(self.thread)  # signals stay with the main thread (Ctrl-C while connecting)
            return ready.result()
        except BaseException:
            # connecting failed, or Ctrl-C while connecting: cancel the session, end the thread
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._task.cancel)
            if self.thread.ident is not None:  # (it started)
                self.thread.join(CLOSE_TIMEOUT)
            raise

    async def _session(self, ready: concurrent.futures.Future[Communicator], options: dict[str, Any]) -> None:
        try:
            async with _connect(**options) as comm:
                ready.set_result(comm)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that connects
            if not ready.done():
                ready.set_exception(exc)
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("netcoll.sync: closing the communicator failed: %s", exc)

    def _run(self) -> None:
        assert self._task is not None
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._task)
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())  # name lookups ran there
        finally:
            self.loop.close()

    def _off_loop(self) -> None:
        if threading.current_thread() is self.thread:
            raise RuntimeError("a netcoll.sync call from the event loop's own thread would deadlock; use the async API")

    def submit(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the loop (in the order submitted)."""
        self._off_loop()
        try:
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed
            raise CommunicatorClosed("the netcoll.sync communicator is closed") from None

    def run(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float) -> T:
        """Run the coroutine ``make()`` on the loop and wait for it."""
        self._off_loop()
        coro = make()
        try:
            done = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise CommunicatorClosed("the netcoll.sync communicator is closed") from None
        return done.result(timeout)

    def stop(self, timeout: float) -> None:
        """Leave the group and end the thread (waiting up to ``timeout`` s)."""
        with contextlib.suppress(RuntimeError):  # the loop closed already
            self.loop.call_soon_threadsafe(self._stop.set)
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)
            if self.thread.is_alive():
                log.warning("netcoll.sync: the communicator did not close within %gs", timeout)


def copy_outcome(done: concurrent.futures.Future[Any], rank: int, work: Work) -> None:
    """Hand a finished Work's outcome to the blocked caller's future."""
    if work.cancelled():
        done.set_exception(
            CollectiveCancelled(f"{work.name} #{work.seq} was cancelled on rank {rank}", op=work.name, seq=work.seq)
        )
    elif (exc := work.exception()) is not None:
        done.set_exception(exc)
    else:
        done.set_result(work.result())
