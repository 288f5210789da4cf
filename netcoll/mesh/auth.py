"""Token authentication for every netcoll listener (pure functions, no network I/O).

Server speaks first with a random nonce; the client proves knowledge of a
token with an HMAC over both nonces; the server proves it back over the nonces
in the other order, so neither side can be impersonated by replaying the
other's proof. With no token configured on either side no proof is sent; a
side that *has* a token refuses a peer that does not prove it (no silent
downgrade).

Two credentials, two roles (``docs/protocol.md`` §5.1):

- the **member** token (``NETCOLL_TOKEN``): rank daemons and embedded ranks; the
  operator's credential, it may do everything;
- the **client** token (``NETCOLL_CLIENT_TOKEN``): job submitters; a session
  proven with it is a ``client`` session and can never act as a member.

The role is bound into the proof: a client proof is an HMAC over a label that
names the role (``hello/client``), so a proof made for one role never checks
out as the other, even if the two tokens were equal.

Either token may also come from a file (``NETCOLL_TOKEN_FILE``,
``NETCOLL_CLIENT_TOKEN_FILE``): :func:`token_from_env`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Mapping
from typing import Final

from .. import settings
from ..errors import AuthenticationError, InsecureListenerError

NONCE_BYTES: Final = 16
_CONTEXT: Final = b"netcoll-v1"

#: the credential roles a session can hold
MEMBER: Final = "member"
CLIENT: Final = "client"
ROLES: Final = (MEMBER, CLIENT)

MEMBER_TOKEN_ENV: Final = settings.registry.TOKEN.name
CLIENT_TOKEN_ENV: Final = settings.registry.CLIENT_TOKEN.name
FILE_SUFFIX: Final = "_FILE"
MAX_TOKEN_FILE_BYTES: Final = 4096

_MEMBER_HINT: Final = "members (rank daemons, netcoll.connect) need the member token NETCOLL_TOKEN"


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def _label(label: str, credential: str) -> str:
    """Member proofs keep the v1 labels (``hello``/``welcome``); a client proof's
    label names its role (``hello/client``)."""
    return label if credential == MEMBER else f"{label}/{credential}"


def proof(token: str, label: str, first: bytes, second: bytes, credential: str = MEMBER) -> bytes:
    """HMAC-SHA256(token, "netcoll-v1|" label ["/" role] "|" first second)."""
    msg = _CONTEXT + b"|" + _label(label, credential).encode() + b"|" + first + second
    return hmac.new(token.encode(), msg, hashlib.sha256).digest()


def _matches(token: str | None, got: bytes, label: str, first: bytes, second: bytes, credential: str) -> bool:
    return token is not None and hmac.compare_digest(got, proof(token, label, first, second, credential))


def check(
    token: str | None, label: str, first: bytes, second: bytes, got: object, who: str, credential: str = MEMBER
) -> None:
    """Verify a proof received from ``who``; raise AuthenticationError when it is wrong."""
    if token is None:
        return
    if not isinstance(got, bytes):
        raise AuthenticationError(
            f"{who} sent no authentication proof, but a token is configured here "
            "(set the same NETCOLL_TOKEN / token= on every process)"
        )
    if not _matches(token, got, label, first, second, credential):
        raise AuthenticationError(f"{who} failed authentication: wrong token")


def verify_hello(
    member_token: str | None,
    client_token: str | None,
    first: bytes,
    second: bytes,
    got: object,
    claimed: object,
    who: str,
    listener: str = "listener",
) -> tuple[str, str | None]:
    """Check a HELLO's proof; return ``(role, key)``: the role the session holds
    (:data:`MEMBER` or :data:`CLIENT`) and the token to prove the WELCOME with
    (None when this side has no token: then everyone is a member, as before).

    ``claimed`` is the HELLO's ``cred`` field (absent: member). A client proof is
    only ever accepted as a client; a member claim proven with the client token
    is refused with a message saying so."""
    if member_token is None and client_token is None:
        return MEMBER, None
    credential = MEMBER if claimed is None else claimed
    if credential not in ROLES:
        raise AuthenticationError(f"{who} claimed an unknown credential {str(credential)[:40]!r}")
    if not isinstance(got, bytes):
        raise AuthenticationError(
            f"{who} sent no authentication proof, but a token is configured here "
            "(set the same NETCOLL_TOKEN / token= on every process)"
        )
    if credential == MEMBER:
        if _matches(member_token, got, "hello", first, second, MEMBER):
            return MEMBER, member_token
        if _matches(client_token, got, "hello", first, second, MEMBER):
            raise AuthenticationError(
                f"{who} proved the client token (NETCOLL_CLIENT_TOKEN) but asked to act as a member: {_MEMBER_HINT}"
            )
        raise AuthenticationError(f"{who} failed authentication: wrong token (for a member: NETCOLL_TOKEN)")
    if client_token is None:  # e.g. peer links between ranks: members only
        raise AuthenticationError(
            f"{who} offered a client credential, but this {listener} accepts members only "
            f"(no client token is configured here; {_MEMBER_HINT})"
        )
    # a client credential: the client token, or the member token (the operator's, which may do everything)
    for key in (client_token, member_token):
        if _matches(key, got, "hello", first, second, CLIENT):
            return CLIENT, key
    raise AuthenticationError(f"{who} failed authentication: wrong token (for a client: NETCOLL_CLIENT_TOKEN)")


def read_token(value: str | None, path: str | None, name: str) -> str | None:
    """The token ``value`` if set, else the contents of the file ``path`` (surrounding
    whitespace removed), else None. ``ValueError`` naming ``name`` when the file
    cannot be read or holds no token."""
    if value is not None and value.strip():
        return value
    if path is None or not path.strip():
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{name}{FILE_SUFFIX}={path!r}: cannot read the token file: {exc.strerror or exc}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ValueError(f"{name}{FILE_SUFFIX}={path!r}: a token file holds at most {MAX_TOKEN_FILE_BYTES} bytes")
    try:
        text = data.decode().strip()
    except UnicodeDecodeError:
        raise ValueError(f"{name}{FILE_SUFFIX}={path!r}: the token file is not UTF-8 text") from None
    if not text:
        raise ValueError(f"{name}{FILE_SUFFIX}={path!r}: the token file is empty")
    return text


def token_from_env(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``$name``, else the contents of the file ``$name_FILE``, else None."""
    value, path = settings.token_texts(name, environ)
    return read_token(value, path, name)


#: names that mean this machine without resolving them (and any ``*.localhost``, RFC 6761)
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ``::1``, IPv4-mapped loopback (``::ffff:127.0.0.1``) and the
    ``localhost`` names. Other names are not resolved: they count as reachable from outside.
    The one rule for "secure by default" (this module) and for the coordinator's check of
    advertised addresses (``rendezvous/groups.py``)."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        addr = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def require_credentials(what: str, host: str, *, token: str | None, tls: object, insecure: bool) -> None:
    """Secure by default: refuse (:class:`InsecureListenerError`) to listen on a
    non-loopback ``host`` with neither a token nor TLS, unless ``insecure``.
    Mutual TLS counts as credentials (only holders of a certificate of the CA
    get in); roles (member / client) still need tokens."""
    if token or tls is not None or insecure or is_loopback(host):
        return
    raise InsecureListenerError(
        f"refusing to listen for {what} on {host} without credentials: pass token= (NETCOLL_TOKEN) or "
        "tls= (NETCOLL_TLS_CERT/KEY/CA), listen on 127.0.0.1, or pass insecure=True to let anyone "
        "who can reach the port in"
    )
