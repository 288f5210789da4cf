"""An emulated one-way network delay on everything a connection receives, for
benchmarks on kernels without ``netem`` (``bench/netem.py``; docs/emulated-network.md).

``NETCOLL_EMULATE_DELAY_US=D`` (0 to 1 000 000; unset or 0: off) makes every
:class:`~netcoll.links.sockettransport.SocketTransport` of the process hold each
byte it reads for ``D`` µs before its protocol sees it: a delay line between
the socket and the framing, so every frame, control frames and handshakes
included, arrives ``D`` later than the bytes reached this host. Order is kept
(one queue per connection, released by one timer), and throughput is not
limited: pieces that follow each other on the wire follow each other ``D``
later. Set it in every rank process and each rank-to-rank message takes ``D``
longer, as over a link with that one-way delay. What it does not emulate is
TCP's own view of the delay: acknowledgements and windows see the real path, as
on a network whose windows exceed its bandwidth-delay product (25 KB at 200 µs
and 1 Gbit/s).

It costs a copy of every byte (out of the line's read buffer) and a timer per
read, so it is for measuring, never for production. Memory is bounded: a
connection holds at most :data:`HOLD_MAX` bytes, and stops reading its socket
(TCP then pushes back on the sender) until the line has released half of them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Mapping
from typing import Final, Protocol

from .. import settings
from ..loop import spin_selector

DELAY_ENV: Final = settings.registry.EMULATE_DELAY_US.name
MAX_DELAY_US: Final = settings.MAX_DELAY_US
#: bytes one read takes from the socket
READ_BYTES: Final = 1024 * 1024
#: bytes a connection may hold in its line before it stops reading its socket
HOLD_MAX: Final = 16 * 1024 * 1024
_RETRY = (BlockingIOError, InterruptedError)

_log = logging.getLogger("netcoll.transport")
_announced = False


def configured(environ: Mapping[str, str] | None = None) -> float:
    """The delay in seconds ``NETCOLL_EMULATE_DELAY_US`` asks for (0: none); a
    :class:`ConfigError` naming the variable for anything but an integer 0–1 000 000."""
    return settings.emulate_delay_us(environ) / 1e6


class Host(Protocol):
    """What the line needs of its transport."""

    def feed(self, data: memoryview) -> int: ...  # bytes the protocol took (fewer once it pauses)
    def end_of_stream(self) -> None: ...
    def fail(self, exc: BaseException) -> None: ...


class DelayLine:
    """Reads one socket and hands its bytes to the transport ``delay`` seconds later.

    The transport calls :meth:`resume` / :meth:`pause` where it would add or
    remove its reader, and :meth:`close` when it stops for good."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, host: Host, delay: float) -> None:
        self._loop, self._sock, self._fd, self._host = loop, sock, sock.fileno(), host
        self.delay = delay
        self._buf = bytearray(READ_BYTES)
        self._pending: collections.deque[tuple[float, memoryview | None]] = collections.deque()  # None: EOF
        self.held = 0  # bytes in _pending
        self._timer: asyncio.TimerHandle | None = None
        self._active = False  # the transport wants bytes (between resume and pause)
        self._watching = False  # our reader is on the socket
        self._socket_done = False  # EOF read, or closed
        selector = spin_selector(loop)
        if selector is not None:  # release on time: epoll alone would round every wait up to 1 ms
            selector.precise = True
        _announce(delay)

    # -- the transport's side -------------------------------------------------
    def resume(self) -> None:
        self._active = True
        self._watch()
        self._schedule()

    def pause(self) -> None:
        self._active = False
        self._unwatch()
        self._cancel()

    def close(self) -> None:
        self.pause()
        self._socket_done = True
        self._pending.clear()
        self.held = 0

    # -- the socket's side ----------------------------------------------------
    def _read(self) -> None:
        room = min(len(self._buf), HOLD_MAX - self.held)
        if room <= 0:  # full (a read event queued before we stopped watching): never a 0-byte read, which means EOF
            self._unwatch()
            return
        try:
            n = self._sock.recv_into(self._buf, room)
        except _RETRY:
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - a reset, or the fd closed under us
            self._host.fail(exc)
            return
        if not n:
            self._socket_done = True
            self._unwatch()
            self._push(None)
            return
        self._push(memoryview(bytes(self._buf[:n])))
        if self.held >= HOLD_MAX:
            self._unwatch()

    def _push(self, data: memoryview | None) -> None:
        self._pending.append((self._loop.time() + self.delay, data))
        self.held += 0 if data is None else len(data)
        if self._timer is None:
            self._schedule()

    # -- releasing ------------------------------------------------------------
    def _release(self) -> None:
        self._timer = None
        now = self._loop.time()
        try:
            while self._active and self._pending and self._pending[0][0] <= now:
                due, data = self._pending[0]
                if data is None:
                    self._pending.popleft()
                    self._host.end_of_stream()
                    return
                took = self._host.feed(data)
                self.held -= took
                if took < len(data):  # the protocol paused reading part-way
                    self._pending[0] = (due, data[took:])
                    break
                self._pending.popleft()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - as a protocol error in a read: the connection fails
            self._host.fail(exc)
            return
        if self.held <= HOLD_MAX // 2:
            self._watch()
        self._schedule()

    def _schedule(self) -> None:
        if self._active and self._pending and self._timer is None:
            self._timer = self._loop.call_at(self._pending[0][0], self._release)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _watch(self) -> None:
        if self._active and not self._watching and not self._socket_done and self.held < HOLD_MAX:
            self._loop.add_reader(self._fd, self._read)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self._loop.remove_reader(self._fd)


def _announce(delay: float) -> None:
    global _announced
    if not _announced:
        _announced = True
        _log.warning(
            "emulating a one-way delay of %.0f µs on every connection of this process (%s): for benchmarks only",
            delay * 1e6,
            DELAY_ENV,
        )


def line_for(loop: asyncio.AbstractEventLoop, sock: socket.socket, host: Host) -> DelayLine | None:
    """A delay line for a new transport when one is configured, else None."""
    seconds = configured()
    return DelayLine(loop, sock, host, seconds) if seconds > 0 else None
