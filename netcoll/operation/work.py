"""``netcoll.Work``: the public handle of an issued operation."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any

from .state import Operation

if TYPE_CHECKING:  # PEP 696 defaults (typing.TypeVar has them from 3.13): a bare ``Work`` is ``Work[Any]``
    from typing_extensions import TypeVar

    T = TypeVar("T", default=Any)
else:
    from typing import TypeVar

    T = TypeVar("T")

_future_init = asyncio.Future.__init__
_running_loop = asyncio._get_running_loop  # in asyncio.events.__all__: the running loop or None (no raise)


class Work(asyncio.Future[T]):
    """An issued operation (``netcoll.Work``): its place in the group's
    sequence was fixed when the collective was called. Generic in its
    result: ``comm.all_reduce(x)`` is a ``Work[np.ndarray]``, ``barrier()`` a
    ``Work[None]`` (``Work[np.ndarray]`` also works at run time: it is
    ``asyncio.Future``'s subscription, with nothing added to the class).

    Await it (``y = await comm.all_reduce(x)``), or keep it and await it
    later, in any order with other Works. ``done()``, ``result()``,
    ``exception()``, ``add_done_callback(fn)`` are those of an asyncio
    future. :meth:`cancel` (also what cancelling a task that awaits the Work
    does) aborts the collective on every rank of the group: the others fail
    with :class:`~netcoll.errors.CollectiveCancelled` naming this rank, the
    communicator stays usable and the next collective is correct.
    :meth:`wait` blocks a thread other than the event loop's, and
    :meth:`cancel` may be called from any thread.

    Attributes:
        name: the collective (``"all_reduce"``...).
        seq: its sequence number in its group (``None`` when it needed no
            communication, e.g. on a group of one).
    """

    __slots__ = ("name", "seq", "op", "_drive", "_driver", "_cancelling", "_agreed")

    def __init__(self, name: str, seq: int | None, *, loop: asyncio.AbstractEventLoop) -> None:
        _future_init(self, loop=loop)  # (not super(): this is on every collective's path)
        self.name = name
        self.seq = seq
        self.op: Operation | None = None
        #: the operation's driver coroutine function, until a task claims it
        self._drive: Callable[[], Coroutine[Any, Any, None]] | None = None
        #: the task running the operation (the first awaiting task, or one of its own)
        self._driver: asyncio.Task[Any] | None = None
        #: cancel() interrupted the driver (undone on it: the Work was cancelled, not the task)
        self._cancelling = False
        #: a partial all_reduce's agreement (anything with ``.contributors``); None for the rest
        self._agreed: Any = None

    @property
    def contributors(self) -> tuple[int, ...] | None:
        """The ranks whose contributions a partial ``all_reduce`` (``partial=True``)
        reduced, sorted: the same on every rank that got the result, and set before
        the result is. ``None`` for every other operation (every rank contributed to
        it), and for a partial one that has not ended or failed."""
        agreed = self._agreed
        return None if agreed is None else agreed.contributors

    def __repr__(self) -> str:
        state = (
            "pending"
            if not self.done()
            else "cancelled"
            if self.cancelled()
            else ("failed" if self.exception() is not None else "done")
        )
        return f"<Work {self.name} #{self.seq} {state}>"

    def __await__(self) -> Generator[Any, None, T]:
        drive = self._drive
        if drive is None or self.done():
            return (yield from super().__await__())
        self._drive = None  # run it in this task: no task of its own, no extra wake-ups
        yield from drive().__await__()
        return self.result()

    @classmethod
    def completed(cls, name: str, value: T) -> Work[T]:
        """A Work that needed no communication, done with ``value``."""
        work: Work[T] = cls(name, None, loop=asyncio.get_running_loop())
        work.set_result(value)
        return work

    def cancel(self, msg: Any | None = None) -> bool:
        """Cancel the operation here and abort it on every other rank. From a
        thread other than the event loop's, the cancel is handed to the loop
        (True means it was requested: the Work may end before it applies)."""
        if self.done():
            return False
        loop = self.get_loop()
        if _running_loop() is not loop:
            try:
                loop.call_soon_threadsafe(self.cancel, msg)
            except RuntimeError:  # the loop is closed: nothing runs the Work any more
                return False
            return True
        driver = self._driver
        if driver is not None and self.op is not None and not driver.done():
            self._cancelling = True
            driver.cancel(msg)  # interrupts the running body; it aborts on the peers
            return True
        return super().cancel(msg)  # not started: it aborts on the peers when it starts

    def wait(self, timeout: float | None = None) -> T:
        """Block this thread until the operation ends; return its result or
        raise its error (``TimeoutError`` if ``timeout`` seconds pass first:
        the operation goes on). Not from the event loop's own thread: there,
        ``await`` the Work."""
        loop = self.get_loop()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("Work.wait() would block the event loop that runs it; use `await work`")
        if not self.done():
            ended = threading.Event()
            loop.call_soon_threadsafe(self.add_done_callback, lambda _: ended.set())
            if not ended.wait(timeout):
                raise TimeoutError(f"{self.name} #{self.seq} did not end within {timeout:g}s")
        return self.result()
