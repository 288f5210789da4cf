"""Reaching a coordinator that may not be up yet: containers, pods and the processes of
``netcoll run`` start in any order, so a refused connection is tried again, with a
growing backoff, until the caller's deadline; then a :class:`~netcoll.RendezvousTimeout`
naming the address and why (never a bare ``ConnectionRefusedError`` after the first try).

Only a connection that could not be made is tried again (refused, unreachable, a name
not resolvable yet). A server that answered and refused -- a wrong token, TLS, not a
netcoll port -- is final at once.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, Final

from ..errors import RendezvousTimeout
from .client import RendezvousClient

FIRST_BACKOFF: Final = 0.05  # seconds before the second try
MAX_BACKOFF: Final = 1.0  # ... doubling up to this (each with jitter: 50-100 % of it)


def backoffs(first: float = FIRST_BACKOFF, cap: float = MAX_BACKOFF) -> Any:
    """The waits between tries: ``first``, doubling up to ``cap``, forever."""
    delay = first
    while True:
        yield delay
        delay = min(delay * 2, cap)


async def dial(address: str, *, timeout: float, **options: Any) -> RendezvousClient:
    """:meth:`RendezvousClient.connect` to ``address``, tried again while the connection is
    refused until ``timeout`` seconds have passed (each try gets what is left); ``options``
    are ``connect``'s (token, local_host, heartbeat, tls).

    Raises:
        RendezvousTimeout: no connection within ``timeout``: names the address, the tries
            and the last reason.
        AuthenticationError, ProtocolError, ConnectionResetError...: the server answered
            and refused (not tried again).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    waits = backoffs()
    tries = 0
    while True:
        tries += 1
        left = deadline - loop.time()
        try:
            return await RendezvousClient.connect(address, timeout=max(left, 0.05), **options)
        except ConnectionRefusedError as exc:  # RpcClient.connect: the connection could not be made
            why = str(exc).removeprefix(f"could not connect to {address}: ")
        except TimeoutError:  # no answer to the connect (a host that drops packets, not up yet)
            why = "no answer"
        pause = next(waits) * random.uniform(0.5, 1.0)
        if loop.time() + pause >= deadline:
            raise RendezvousTimeout(
                f"no coordinator at {address} within {timeout:g}s ({why}; tried {tries} time"
                f"{'s' if tries != 1 else ''}): is it running, and is the address right?"
            )
        await asyncio.sleep(pause)


__all__ = ["FIRST_BACKOFF", "MAX_BACKOFF", "backoffs", "dial"]
