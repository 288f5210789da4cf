"""Issuing netcoll collectives from torch's threads onto the netcoll loop
thread, and torch ``Work`` objects backed by netcoll's.

torch calls a process group's methods from its own threads (the training
loop, autograd's), expects a ``Work`` back at once, and its ``Work.wait()``
blocks. :func:`issue` runs the netcoll call on the communicator's event loop
(where it is *issued*: its place in the group's sequence is fixed there, in
the order torch made the calls), waits only for that, and returns a torch
``Work`` over a ``torch.futures.Future`` that the netcoll ``Work``'s
completion fulfils, after ``finish`` has copied the result into the tensors
torch passed. Argument errors raise in the caller, as Gloo's do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..comm import Communicator
from ..operation import Work

__all__ = ["Issuer", "NetcollWork", "completed"]

_running_loop = asyncio._get_running_loop  # the running loop or None (no raise), as in netcoll.operation.work


class NetcollWork(dist.Work):
    """torch's ``Work`` for a netcoll collective: over a ``torch.futures.Future``
    that the netcoll ``Work`` fulfils. ``wait()`` raises the collective's error
    (torch's own future-wrapping Work does not), ``wait(timeout)`` raises
    ``TimeoutError`` when it passes first (the collective goes on)."""

    def __init__(self, fut: torch.futures.Future[Any]) -> None:
        super().__init__()
        self._fut = fut
        # for torch's C++ side (DDP's reducer): a future whose error is an error there too.
        # ``set_exception`` from Python completes a future *with the exception as its value*,
        # unwrapped only by Python's wait(); the reducer would read it as its tensors (and
        # crash). A ``then`` whose callback raises is an errored future in C++ as well.
        self._cpp_fut: torch.futures.Future[Any] = fut.then(_unwrap)
        self._ended = threading.Event()
        fut.add_done_callback(lambda _: self._ended.set())

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        seconds = timeout.total_seconds()
        if seconds > 0 and not self._ended.wait(seconds):
            raise TimeoutError(f"the netcoll collective did not end within {seconds:g}s")
        self._fut.wait()  # raises the collective's error
        return True

    def get_future(self) -> torch.futures.Future[Any]:
        return self._cpp_fut

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        return self._fut.done() and self.exception() is None

    def exception(self) -> BaseException | None:
        if not self._fut.done():
            return None
        try:
            self._fut.wait()
        except Exception as exc:  # noqa: BLE001 - the collective's error, returned as asked
            return exc
        return None

    def result(self) -> Any:
        return self._fut.wait()

    def synchronize(self) -> None:
        self.wait()


def _unwrap(fut: torch.futures.Future[Any]) -> Any:
    """The value of a finished future, or its error raised (see NetcollWork)."""
    return fut.wait()


class Issuer:
    """A communicator and the loop (in another thread) it runs on."""

    def __init__(self, comm: Communicator, loop: asyncio.AbstractEventLoop) -> None:
        self.comm = comm
        self.loop = loop
        self._queued = 0  # issues handed to the loop and not yet run there
        self._lock = threading.Lock()

    def __call__(
        self, start: Callable[[Communicator], Work], finish: Callable[[Any], Any], *, wait: bool = True
    ) -> NetcollWork:
        """Issue ``start(comm)`` on the loop; a torch Work whose future gets
        ``finish(result)`` (or the netcoll error) when the collective ends. ``wait``:
        return once the collective is issued, its argument errors raised here; else at
        once (the issue queued on the loop behind this thread's earlier ones, so in call
        order), every error the future's: what a DDP comm hook wants, whose caller is
        autograd's thread, with the backward pass to go on with. On the loop's own thread
        (a torch future's callback issuing the next collective) the issue runs at once,
        unless issues from other threads are still queued: then it queues behind them
        (issues keep the order of the calls on every rank) and its errors are the future's."""
        fut: torch.futures.Future[Any] = torch.futures.Future()
        issued: concurrent.futures.Future[None] = concurrent.futures.Future()
        result = NetcollWork(fut)

        def on_loop(queued: bool = False) -> None:
            if queued:
                with self._lock:
                    self._queued -= 1
            try:
                work = start(self.comm)
            except BaseException as exc:  # noqa: BLE001 - a bad argument: raised in the caller (or the future's)
                if wait:
                    issued.set_exception(exc)
                else:
                    fut.set_exception(exc)
                return
            issued.set_result(None)
            work.add_done_callback(lambda w: _complete(w, finish, fut))

        if _running_loop() is self.loop:  # e.g. a torch future's callback that issues the next collective
            with self._lock:
                behind = self._queued > 0
                if behind:
                    self._queued += 1
            if not behind:
                on_loop()
            else:  # after the issues already queued (blocking here would wait on this very thread)
                wait = False
                self.loop.call_soon(on_loop, True)
        else:
            with self._lock:
                self._queued += 1
            try:
                self.loop.call_soon_threadsafe(on_loop, True)
            except RuntimeError:  # the loop has closed
                with self._lock:
                    self._queued -= 1
                raise RuntimeError(f"the netcoll process group {self.comm.group!r} is shut down") from None
        if wait:
            issued.result()
        return result


def _complete(work: Work, finish: Callable[[Any], Any], fut: torch.futures.Future[Any]) -> None:
    """On the loop thread: the result into torch's tensors, then the future."""
    try:
        if work.cancelled():
            raise RuntimeError(f"netcoll {work.name} #{work.seq} was cancelled")
        value = finish(work.result())
    except Exception as exc:  # noqa: BLE001 - every failure goes to the torch future, typed
        fut.set_exception(exc)
        return
    fut.set_result(value)


def completed(value: Any) -> NetcollWork:
    """A torch Work that is already done with ``value`` (nothing to communicate)."""
    fut: torch.futures.Future[Any] = torch.futures.Future()
    fut.set_result(value)
    return NetcollWork(fut)
