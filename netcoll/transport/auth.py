"""Token authentication for every netcoll listener (pure functions, no I/O).

Server speaks first with a random nonce; the client proves knowledge of the
shared token with an HMAC over both nonces; the server proves it back over
the nonces in the other order, so neither side can be impersonated by
replaying the other's proof. With no token configured on either side no
proof is sent; a side that *has* a token refuses a peer that does not prove
it (no silent downgrade).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Final

from ..errors import AuthenticationError

NONCE_BYTES: Final = 16
_CONTEXT: Final = b"netcoll-v1"


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def proof(token: str, label: str, first: bytes, second: bytes) -> bytes:
    """HMAC-SHA256(token, "netcoll-v1|" label "|" first second)."""
    msg = _CONTEXT + b"|" + label.encode() + b"|" + first + second
    return hmac.new(token.encode(), msg, hashlib.sha256).digest()


def check(token: str | None, label: str, first: bytes, second: bytes, got: object, who: str) -> None:
    """Verify a proof received from ``who``; raise AuthenticationError when it is wrong."""
    if token is None:
        return
    if not isinstance(got, bytes):
        raise AuthenticationError(
            f"{who} sent no authentication proof, but a token is configured here "
            "(set the same NETCOLL_TOKEN / token= on every process)"
        )
    if not hmac.compare_digest(got, proof(token, label, first, second)):
        raise AuthenticationError(f"{who} failed authentication: wrong token")
