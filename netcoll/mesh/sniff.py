"""Which protocol a server answered in, from the first bytes it sent: so that a client
that reached the wrong port says what it met ("an HTTP port", "a TLS port") at once,
instead of "bad magic b'HTTP'" or a timeout.

netcoll's RPC protocol is server-first (CHALLENGE), and an HTTP or TLS server waits for
the client; so a netcoll client that hears nothing for :data:`PROBE_AFTER` seconds sends
one PING frame (:data:`PROBE`, which a netcoll server ignores before the HELLO) that an
HTTP server answers at once (a malformed request: ``400``) and a TLS server refuses at
once (not a TLS record). ``docs/protocol.md`` §5.

Standard library only: ``netcoll health`` imports it.
"""

from __future__ import annotations

from typing import Final

#: seconds of silence after the connect before a netcoll client probes (a netcoll server
#: sends its CHALLENGE at once, unless its handshake slots are all taken)
PROBE_AFTER: Final = 0.25
#: the probe's PING header: its CR LF CR LF ends an HTTP server's request head
PROBE: Final = {"probe": "\r\n\r\n"}

HTTP: Final = "HTTP"
TLS: Final = "TLS"
NETCOLL: Final = "netcoll"
TLS_SETTINGS: Final = "--tls-cert/--tls-key/--tls-ca, or NETCOLL_TLS_CERT/KEY/CA"


def protocol_of(first: bytes) -> str | None:
    """:data:`HTTP`, :data:`TLS` (a handshake or alert record), :data:`NETCOLL` (a frame's
    magic), or None, for the first bytes a server sent."""
    if first.startswith(b"HTTP/"):
        return HTTP
    if len(first) >= 2 and first[0] in (0x15, 0x16) and first[1] == 0x03:
        return TLS
    if first.startswith(b"NCOL"):
        return NETCOLL
    return None


def rpc_met(where: str, first: bytes) -> str | None:
    """What a netcoll client at ``where`` met, said for the user (None: not a protocol we know)."""
    kind = protocol_of(first)
    if kind == HTTP:
        return (
            f"{where} answered in HTTP: it is an HTTP port (netcoll's /livez /readyz /metrics?), not a netcoll "
            "RPC port (a coordinator's RPC port is usually its HTTP port - 1: 29400 for 29401)"
        )
    if kind == TLS:
        return f"{where} answered in TLS: the server requires TLS, and this client has no TLS settings ({TLS_SETTINGS})"
    return None


def http_met(where: str, first: bytes, tls: bool) -> str | None:
    """What an HTTP client (``netcoll health``; ``tls``: over TLS) at ``where`` met instead
    of HTTP, said for the user (None: not a protocol we know)."""
    kind = protocol_of(first)
    if kind == NETCOLL:
        return (
            f"{where} answered in netcoll's RPC protocol, not HTTP: it is an RPC port (a coordinator's HTTP "
            "port is usually its RPC port + 1: 29401 for 29400)"
        )
    if kind == TLS and not tls:
        return f"{where} answered in TLS: the server requires TLS; pass the TLS files ({TLS_SETTINGS})"
    return None


__all__ = ["HTTP", "NETCOLL", "PROBE", "PROBE_AFTER", "TLS", "http_met", "protocol_of", "rpc_met"]
