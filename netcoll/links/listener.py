"""A listening socket whose accepted connections become
:class:`~netcoll.links.sockettransport.SocketTransport` s, pausing (with backoff)
instead of spinning when the process runs out of file descriptors or memory."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Callable

from . import delayline
from .sockettransport import SocketTransport

_RETRY = (BlockingIOError, InterruptedError)
#: accept() errors that mean "no resources now": pause accepting instead of retrying at once
_RESOURCE_ERRNOS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))
ACCEPT_BACKOFF = 0.1  # first pause after such an error (seconds), doubling...
ACCEPT_BACKOFF_MAX = 1.0  # ...up to this

_log = logging.getLogger("netcoll.transport")


class Listener:
    """A listening socket that wraps each accepted connection in a
    :class:`SocketTransport` with a new protocol from ``protocol_factory``.

    When ``accept`` fails for lack of resources (out of file descriptors or
    kernel memory) the listener stops watching its socket for a backoff
    (``ACCEPT_BACKOFF``, doubling up to ``ACCEPT_BACKOFF_MAX``) instead of
    spinning on the still-pending connection, and logs one warning per episode.
    """

    def __init__(self, protocol_factory: Callable[[], asyncio.BufferedProtocol], *, paused: bool = False) -> None:
        self.protocol_factory = protocol_factory
        #: accepted transports start not reading (TLS: nothing is read before start_tls)
        self.paused = paused
        self.sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._backoff = 0.0  # seconds of the current pause; 0 when accepting normally
        self._resume: asyncio.TimerHandle | None = None
        #: accept() failures for lack of resources, since start (for tests and stats)
        self.resource_errors = 0

    def start(self, host: str, port: int, backlog: int = 128) -> tuple[str, int]:
        delayline.configured()  # a bad NETCOLL_EMULATE_DELAY_US: a ConfigError here, not in an accept
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=backlog, reuse_port=False)
        sock.setblocking(False)
        self.sock, self._loop = sock, asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._accept)
        name = sock.getsockname()
        return name[0], name[1]

    def _accept(self) -> None:
        assert self.sock is not None and self._loop is not None
        for _ in range(64):
            try:
                conn, _ = self.sock.accept()
            except _RETRY:
                break
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRNOS:  # keep the listener, pause it: do not spin
                    self._pause(exc)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise
            SocketTransport(self._loop, conn, self.protocol_factory(), reading=not self.paused)
        if self._backoff:
            _log.info("listener %s accepts connections again", self._name())
            self._backoff = 0.0

    def _pause(self, exc: OSError) -> None:
        assert self.sock is not None and self._loop is not None
        self.resource_errors += 1
        if not self._backoff:
            _log.warning(
                "listener %s cannot accept connections (%s); pausing accept() with backoff up to %gs",
                self._name(),
                os.strerror(exc.errno or 0),
                ACCEPT_BACKOFF_MAX,
            )
        self._backoff = min(ACCEPT_BACKOFF_MAX, self._backoff * 2) if self._backoff else ACCEPT_BACKOFF
        self._loop.remove_reader(self.sock.fileno())
        self._resume = self._loop.call_later(self._backoff, self._unpause)

    def _unpause(self) -> None:
        self._resume = None
        if self.sock is not None and self._loop is not None:
            self._loop.add_reader(self.sock.fileno(), self._accept)

    def _name(self) -> str:
        try:
            host, port = self.sock.getsockname()[:2] if self.sock is not None else ("?", 0)
        except OSError:
            return "?"
        return f"{host}:{port}"

    def close(self) -> None:
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self.sock is not None and self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None


__all__ = ["ACCEPT_BACKOFF", "ACCEPT_BACKOFF_MAX", "Listener"]
