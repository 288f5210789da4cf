"""The handshake that opens every netcoll connection (``docs/protocol.md`` §5):
the server's CHALLENGE, the client's HELLO, the server's WELCOME, with token
proofs both ways (:mod:`.auth`).

:func:`client_handshake` answers a server's CHALLENGE; :func:`server_handshake`
challenges a new client and checks its HELLO. Both run over a
:class:`~netcoll.links.connection.FramedProtocol`, which accepts only small
header-only frames until the WELCOME; a client that a user points at an address
may probe a silent server to name what it met (:mod:`.sniff`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from ..errors import AuthenticationError, NetcollError, ProtocolError
from ..links.connection import HANDSHAKE_TIMEOUT, FramedProtocol, is_tls
from ..wire import Frame, Kind
from . import auth, sniff

log = logging.getLogger("netcoll.transport")

MAX_PROBES = 2  # PING frames a server skips before the HELLO (a client's probe: .sniff)


async def _challenge(proto: FramedProtocol, probe: bool = False) -> Frame:
    """The server's first frame, which must be its CHALLENGE. ``probe``: after
    :data:`~.sniff.PROBE_AFTER` seconds of silence send the probe PING, which an HTTP or
    TLS server answers (or refuses) at once, so a wrong port is named at once."""
    where = f"server {proto.peername[0]}:{proto.peername[1]}"
    try:
        challenge = await _first_frame(proto, probe)
    except ProtocolError as exc:
        met = sniff.rpc_met(where, proto.refused)
        raise ProtocolError(met or str(exc)) from None
    except ConnectionResetError as exc:
        hint = (
            "it refused the TLS session: is this process's certificate signed by the CA the server trusts? "
            if is_tls(proto)
            else f"does it require TLS ({sniff.TLS_SETTINGS})? "
        )
        raise ConnectionResetError(f"{where} closed the connection before the handshake ({hint}see its log)") from exc
    if challenge.kind != Kind.CHALLENGE:
        raise ProtocolError(f"expected CHALLENGE from the server, got {challenge.kind.name}")
    return challenge


async def _first_frame(proto: FramedProtocol, probe: bool) -> Frame:
    if not probe:
        return await proto.next_frame()
    first = asyncio.ensure_future(proto.next_frame())
    try:
        done, _ = await asyncio.wait({first}, timeout=sniff.PROBE_AFTER)
        if not done and proto.lost is None:
            proto.write(Kind.PING, dict(sniff.PROBE))  # a netcoll server ignores it before the HELLO
        return await first
    finally:
        first.cancel()


async def client_handshake(
    proto: FramedProtocol,
    *,
    token: str | None,
    role: str,
    hello: dict[str, Any] | None = None,
    timeout: float = HANDSHAKE_TIMEOUT,
    credential: str = auth.MEMBER,
    probe: bool = False,
) -> dict[str, Any]:
    """Answer the server's CHALLENGE; return the WELCOME header (raises on refusal).
    ``credential`` is the role ``token`` stands for (a client token: ``auth.CLIENT``).
    ``probe``: find out soon what a silent server speaks (:func:`_challenge`): for clients
    a user points at an address (RPC), not for peer links (their addresses are the
    coordinator's)."""
    challenge: Frame | None = None
    try:
        async with asyncio.timeout(timeout):
            challenge = await _challenge(proto, probe)
            mine = auth.new_nonce()
            header = dict(hello or {}, role=role, nonce=mine)
            if token is not None:
                header["proof"] = auth.proof(token, "hello", challenge.header["nonce"], mine, credential)
                if credential != auth.MEMBER:
                    header["cred"] = credential
            await proto.send(Kind.HELLO, header)
            welcome = await proto.next_frame()
    except TimeoutError:
        if challenge is None and not is_tls(proto):  # a TLS listener waits for a ClientHello
            raise TimeoutError(
                f"server {proto.peername[0]}:{proto.peername[1]} sent no CHALLENGE within {timeout:g}s "
                "(does it require TLS: NETCOLL_TLS_CERT/KEY/CA?)"
            ) from None
        raise
    assert challenge is not None
    if welcome.kind != Kind.WELCOME:
        raise ProtocolError(f"expected WELCOME from the server, got {welcome.kind.name}")
    auth.check(
        token,
        "welcome",
        mine,
        challenge.header["nonce"],
        welcome.header.get("proof"),
        f"server {proto.peername[0]}:{proto.peername[1]}",
        credential,
    )
    return welcome.header


async def server_handshake(
    proto: FramedProtocol,
    *,
    token: str | None,
    role: str,
    accept: Callable[[dict[str, Any]], Any] | None = None,
    timeout: float = HANDSHAKE_TIMEOUT,
    client_token: str | None = None,
) -> dict[str, Any]:
    """Challenge a new client, check its HELLO (``accept`` may raise to refuse it
    or return extra WELCOME fields), and return the HELLO header. On failure the
    client gets an ERROR frame with the reason and the connection is closed.

    On a connection accepted by a :class:`Server`, the handshake ends by the
    server's deadline (``handshake_timeout_s`` from the connect) if sooner, the
    source's handshake slot is given back as soon as the proof checks out, and a
    failure before that is logged (rate-limited per source) and answered only
    after ``auth_fail_delay_s``.

    ``token`` is the member token; with ``client_token`` too, a HELLO proven with
    the client token is accepted as role ``client`` (``proto.credential`` says which;
    without either token every peer is a member)."""
    mine = auth.new_nonce()
    gate = proto.gate
    if gate is not None:
        timeout = min(timeout, gate.time_left(proto))
    hello: Frame | None = None
    authenticated = False
    try:
        has_auth = token is not None or client_token is not None
        await proto.send(Kind.CHALLENGE, {"nonce": mine, "role": role, "auth": has_auth})
        async with asyncio.timeout(timeout):
            hello = await proto.next_frame()
            for _ in range(MAX_PROBES):  # a client's probe (.sniff): ignored
                if hello.kind != Kind.PING:
                    break
                hello = await proto.next_frame()
        if hello.kind != Kind.HELLO:
            raise ProtocolError(f"expected HELLO, got {hello.kind.name}")
        who = f"client {proto.peername[0]}:{proto.peername[1]}"
        theirs, got, claimed = hello.header["nonce"], hello.header.get("proof"), hello.header.get("cred")
        credential, key = auth.verify_hello(token, client_token, mine, theirs, got, claimed, who, role)
        proto.credential = credential
        authenticated = True
        if gate is not None:
            gate.authenticated(proto)
        extra = accept(hello.header) if accept else None
        if inspect.isawaitable(extra):
            extra = await extra
        extra = extra or {}
        proto.decoder.limits, proto.decoder.unlock = proto.limits, None  # authenticated: full frames now
        welcome = dict(extra)
        if key is not None:
            welcome["proof"] = auth.proof(key, "welcome", hello.header["nonce"], mine, credential)
        await proto.send(Kind.WELCOME, welcome)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("accepted a %s handshake from %s:%s as %s", role, *proto.peername[:2], credential)
        return hello.header
    except TimeoutError:
        if gate is not None and not authenticated:
            gate.failed(proto, "handshake timed out", None)
        proto.fail(ProtocolError("handshake timed out"), tell_peer=True)
        raise ProtocolError(f"handshake with {proto.peername} timed out") from None
    except (ProtocolError, AuthenticationError, NetcollError, ValueError) as exc:
        if gate is not None and not authenticated:
            gate.failed(proto, str(exc), None if hello is None else hello.header)
            await gate.penalty(proto)
        proto.fail(exc, tell_peer=True)
        raise
