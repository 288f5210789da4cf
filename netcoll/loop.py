"""Event loops for netcoll processes.

Collectives are chains of short waits: a rank sends, then waits a few tens of
microseconds for its peer's reply. Sleeping in ``epoll_wait`` for each of those
costs a sleep and a wake-up per message, and on a machine with fewer cores than
ranks the woken process may then wait for a core. :class:`SpinSelector` first
polls for a short while, yielding the CPU between polls (``sched_yield``, so a
peer sharing the core gets to run and produce the message), and only then
sleeps. Measured on 2 cores with 4 rank processes (2026-11, CHANGELOG.md 0.1.0): 4-byte
all_reduce 613 -> 315 µs, 64 KiB 2x faster, 16 MiB unchanged or better. An
idle process spins at most ``spin`` seconds per wake-up. While an operation
moves large messages over sockets it does not spin at all
(:meth:`SpinSelector.hold`): those waits are the kernel's copies, and polling
only takes CPU from the ranks doing them.

uvloop is available as an option (``NETCOLL_LOOP=uvloop``) but is not the
default: on this workload its large writes measured ~40 % slower.

    netcoll.loop.run(main())     # like asyncio.run, with the spinning selector
"""

from __future__ import annotations

import asyncio
import os
import selectors
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from . import settings

T = TypeVar("T")
DEFAULT_SPIN = 300e-6  # seconds of polling before sleeping (measured: 100 µs-1 ms all help; 300 µs best)
#: with :attr:`SpinSelector.precise`, a timer due within this is waited for by spinning, not
#: in epoll (which rounds up to whole milliseconds), so it fires to the microsecond
TIMER_SPIN = 1e-3
MAX_SPIN_US = settings.MAX_SPIN_US  # NETCOLL_SPIN_US above this is refused (a typo: 0.1 s per wake-up)
LOOPS = ("spin", "asyncio", "uvloop")

if TYPE_CHECKING:
    _Base = selectors.DefaultSelector
else:  # epoll where there is one (DefaultSelector may be another kind), else the platform's best
    _Base = getattr(selectors, "EpollSelector", selectors.DefaultSelector)


class Poller(Protocol):
    """Something a :class:`SpinSelector` checks besides its file descriptors
    (a shared-memory lane, :mod:`netcoll.links.lane`)."""

    def poll(self) -> bool:
        """Handle whatever arrived (scheduling callbacks); whether anything did. Never raises."""

    def sleep(self) -> None:
        """The loop is about to block: from now on, wake it through a file
        descriptor (with a memory fence after saying so: a poll follows)."""

    def wake(self) -> None:
        """The loop is awake again."""


class SpinSelector(_Base):
    """A selector that polls (yielding the CPU) for ``spin`` seconds before blocking.

    It also runs its pollers (:meth:`add_poller`) on every call, and before
    it blocks tells them it sleeps and polls them once more (see
    :mod:`netcoll.links.lane` for why that order)."""

    def __init__(self, spin: float | None = None) -> None:
        super().__init__()
        self.spin = spin_seconds() if spin is None else spin
        self._pollers: tuple[Poller, ...] = ()
        self.holds = 0  # :meth:`hold` calls not yet released: no spinning while any
        #: timers to the microsecond (the delay line of :mod:`netcoll.links.delayline` asks):
        #: a wait of at most :data:`TIMER_SPIN` is spun through, a longer one slept in whole
        #: milliseconds rounded down and its rest spun. Off, an idle loop spins at most ``spin``
        #: per wake-up, as measured best for collectives, and sleeps what is left in epoll.
        self.precise = False

    def hold(self) -> None:
        """Do not spin (sleep in ``epoll`` at once) until :meth:`release`: a collective is
        moving large messages over sockets. Its waits are long, and a rank that polls
        meanwhile takes CPU that the ranks doing the kernel's copies need, when ranks
        outnumber cores (docs/performance.md, "No spinning in large socket transfers")."""
        self.holds += 1

    def release(self) -> None:
        """The end of a :meth:`hold`."""
        self.holds -= 1

    def add_poller(self, poller: Poller) -> None:
        self._pollers += (poller,)

    def remove_poller(self, poller: Poller) -> None:
        self._pollers = tuple(p for p in self._pollers if p is not poller)

    def _poll(self) -> bool:
        got = False
        for p in self._pollers:
            got = p.poll() or got
        return got

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self._pollers and self._poll():
            timeout = 0
        if timeout is None or timeout > 0:
            ready = super().select(0)
            if ready or self.spin <= 0 or self.holds:
                return ready or self._block(timeout)
            start = time.monotonic()
            spin = min(self.spin, timeout or self.spin)
            if self.precise and timeout is not None and timeout <= TIMER_SPIN:
                spin = timeout
            end = start + spin
            while time.monotonic() < end:
                os.sched_yield()
                if self._pollers and self._poll():
                    return super().select(0)
                ready = super().select(0)
                if ready:
                    return ready
            if timeout is None:
                return self._block(None)
            left = timeout - (time.monotonic() - start)  # what is left of the wait, not all of it again
            if self.precise:  # whole milliseconds, rounded down: the loop comes back and spins the rest
                left = int(left * 1000) / 1000
            return self._block(left) if left > 0 else []
        return super().select(timeout)

    def _block(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        pollers = self._pollers
        if not pollers:
            return super().select(timeout)
        for p in pollers:
            p.sleep()
        try:
            if self._poll():
                return super().select(0)
            return super().select(timeout)
        finally:
            for p in pollers:
                p.wake()


def spin_seconds() -> float:
    """How long a :class:`SpinSelector` polls before it sleeps: ``$NETCOLL_SPIN_US``
    microseconds (0 to never spin), else :data:`DEFAULT_SPIN`. ValueError for a value
    that is not a whole number from 0 to :data:`MAX_SPIN_US`."""
    us = settings.spin_us()
    return DEFAULT_SPIN if us is None else us * 1e-6


def spin_selector(loop: asyncio.AbstractEventLoop) -> SpinSelector | None:
    """``loop``'s selector if it is a :class:`SpinSelector` (a loop made here,
    or any selector loop given one), else None."""
    selector = getattr(loop, "_selector", None)  # asyncio's selector loops keep it there
    return selector if isinstance(selector, SpinSelector) else None


def loop_kind(kind: str | None = None) -> str:
    """``kind``, else ``$NETCOLL_LOOP``, else ``"spin"``; ValueError if unknown."""
    choice = (kind or settings.loop() or "spin").strip().lower()
    if choice == "auto":
        choice = "spin"
    if choice not in LOOPS:
        raise ValueError(f"unknown event loop {choice!r}; choose one of {', '.join(LOOPS)}")
    return choice


def new_event_loop(kind: str | None = None) -> asyncio.AbstractEventLoop:
    """A new event loop of ``kind`` (see :func:`loop_kind`)."""
    choice = loop_kind(kind)
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:
            raise ValueError(
                "the uvloop event loop was asked for but uvloop is not installed (pip install 'netcoll[uvloop]')"
            ) from None
        return uvloop.new_event_loop()
    if choice == "spin" and hasattr(os, "sched_yield"):
        return asyncio.SelectorEventLoop(SpinSelector())
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T], kind: str | None = None) -> T:
    """Run ``coro`` to completion on a new loop of ``kind``, like ``asyncio.run``."""
    with asyncio.Runner(loop_factory=lambda: new_event_loop(kind)) as runner:
        return runner.run(coro)


__all__ = [
    "Poller",
    "SpinSelector",
    "spin_selector",
    "spin_seconds",
    "new_event_loop",
    "run",
    "loop_kind",
    "DEFAULT_SPIN",
    "MAX_SPIN_US",
]
