"""A connected loopback TCP pair, for tests and benchmarks of links and transports."""

from __future__ import annotations

import asyncio
import socket

__all__ = ["loopback_pair"]


async def loopback_pair(*, nodelay: bool = True) -> tuple[socket.socket, socket.socket]:
    """``(client, server)``: two connected, non-blocking sockets on 127.0.0.1 (an
    ephemeral port), with ``TCP_NODELAY`` as netcoll's links set it unless ``nodelay`` is
    False. The caller closes both."""
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        client = socket.socket()
        client.setblocking(False)
        await loop.sock_connect(client, listener.getsockname())
        server, _ = await loop.sock_accept(listener)
    for sock in (client, server):
        sock.setblocking(False)
        if nodelay:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, server
