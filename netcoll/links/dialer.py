"""Dialing: a connected :class:`~.sockettransport.SocketTransport` to ``host:port``
(the accepting side is :class:`~.listener.Listener`)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from .sockettransport import SocketTransport


async def connect(
    host: str,
    port: int,
    protocol_factory: Callable[[], asyncio.BufferedProtocol],
    *,
    local_host: str | None = None,
    reading: bool = True,
) -> tuple[SocketTransport, asyncio.BufferedProtocol]:
    """Connect to ``host:port`` (every address it resolves to, in turn) and
    return the transport and its protocol (not reading yet unless ``reading``:
    TLS reads nothing before its handshake)."""
    loop = asyncio.get_running_loop()
    infos = _numeric(host, port) or await loop.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    if not infos:
        raise OSError(f"cannot resolve {host!r}")
    last: OSError | None = None
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            if local_host:
                sock.bind((local_host, 0))
            await loop.sock_connect(sock, addr)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        protocol = protocol_factory()
        return SocketTransport(loop, sock, protocol, reading=reading), protocol
    assert last is not None
    raise last


def _numeric(host: str, port: int) -> list[tuple[Any, ...]]:
    """``getaddrinfo``'s answer for a numeric IP, without asking a resolver thread."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))]
    return []


__all__ = ["connect"]
