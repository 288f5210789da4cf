"""A free port for ``netcoll run``'s MASTER_PORT (torch's store), from below the kernel's
ephemeral range."""

from __future__ import annotations

import random
import socket

FREE_PORT_FLOOR = 20000  # MASTER_PORT is picked from [FREE_PORT_FLOOR, the ephemeral range)


def free_port(host: str) -> int:
    """A port free on ``host`` now (for MASTER_PORT, as torchrun picks one), taken from
    *below* the kernel's ephemeral range: a port from inside it can be taken meanwhile by
    a client's own source port, e.g. a torch store client dialing that very port before
    its server is up (a TCP self-connect), and the store then fails with EADDRINUSE."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(64):
        port = rng.randrange(FREE_PORT_FLOOR, low) if low > FREE_PORT_FLOOR + 64 else 0
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError(f"no free port on {host} below {low} (pass --master-port)")


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
