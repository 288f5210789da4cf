"""Member and client credentials in the handshake (docs/protocol.md §5.1): the proof
binds the role, a client proof is only ever accepted as a client, peer links take
members only, and mixing the tokens up gives errors that say so."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from netcoll.errors import AuthenticationError
from netcoll.links.connection import open_connection
from netcoll.mesh import auth
from netcoll.mesh.handshake import client_handshake
from netcoll.mesh.tcpmesh import Listener
from netcoll.rpc import RpcClient, RpcServer, Session

MEMBER, CLIENT = "member-s3cret", "client-s3cret"


# -- the proof (pure) ---------------------------------------------------------------------------
def test_the_proof_binds_the_role() -> None:
    a, b = auth.new_nonce(), auth.new_nonce()
    member = auth.proof(MEMBER, "hello", a, b)
    assert auth.proof(MEMBER, "hello", a, b, auth.MEMBER) == member  # v1 member proofs unchanged
    # the same token proves a different message as a client: a client proof never checks out as a member's
    assert auth.proof(MEMBER, "hello", a, b, auth.CLIENT) != member
    assert auth.verify_hello(MEMBER, CLIENT, a, b, member, None, "x") == (auth.MEMBER, MEMBER)
    client = auth.proof(CLIENT, "hello", a, b, auth.CLIENT)
    assert auth.verify_hello(MEMBER, CLIENT, a, b, client, auth.CLIENT, "x") == (auth.CLIENT, CLIENT)
    # a client proof relabelled as a member claim is just wrong
    with pytest.raises(AuthenticationError, match="wrong token"):
        auth.verify_hello(MEMBER, CLIENT, a, b, client, auth.MEMBER, "x")
    # the client token proving a member claim: refused, and the message says what happened
    with pytest.raises(AuthenticationError, match=r"client token .*NETCOLL_CLIENT_TOKEN.* member token NETCOLL_TOKEN"):
        auth.verify_hello(MEMBER, CLIENT, a, b, auth.proof(CLIENT, "hello", a, b), auth.MEMBER, "x")
    # the member token is the operator's: it may also act as a client
    as_client = auth.proof(MEMBER, "hello", a, b, auth.CLIENT)
    assert auth.verify_hello(MEMBER, CLIENT, a, b, as_client, auth.CLIENT, "x") == (auth.CLIENT, MEMBER)
    # a listener without a client token takes members only
    with pytest.raises(AuthenticationError, match="accepts members only"):
        auth.verify_hello(MEMBER, None, a, b, as_client, auth.CLIENT, "x", "rank")
    with pytest.raises(AuthenticationError, match="unknown credential"):
        auth.verify_hello(MEMBER, CLIENT, a, b, member, "admin", "x")
    with pytest.raises(AuthenticationError, match="no authentication proof"):
        auth.verify_hello(MEMBER, CLIENT, a, b, None, auth.CLIENT, "x")
    assert auth.verify_hello(None, None, a, b, None, auth.CLIENT, "x") == (auth.MEMBER, None)  # no auth at all


def test_tokens_from_files(tmp_path: Any) -> None:
    path = tmp_path / "member"
    path.write_text("  from-a-file\n")
    assert auth.token_from_env("NETCOLL_TOKEN", {"NETCOLL_TOKEN_FILE": str(path)}) == "from-a-file"
    # the variable itself wins over its file
    assert auth.token_from_env("NETCOLL_TOKEN", {"NETCOLL_TOKEN": "v", "NETCOLL_TOKEN_FILE": str(path)}) == "v"
    assert auth.token_from_env("NETCOLL_TOKEN", {}) is None
    with pytest.raises(ValueError, match=r"NETCOLL_TOKEN_FILE.*cannot read"):
        auth.token_from_env("NETCOLL_TOKEN", {"NETCOLL_TOKEN_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        auth.token_from_env("NETCOLL_CLIENT_TOKEN", {"NETCOLL_CLIENT_TOKEN_FILE": str(tmp_path / "empty")})


# -- over loopback TCP ----------------------------------------------------------------------------
@asynccontextmanager
async def rpc_server(**kw: Any) -> AsyncIterator[tuple[str, list[str | None]]]:
    """An RPC server whose one method answers with the caller's proven role."""
    seen: list[str | None] = []

    async def whoami(session: Session, params: dict[str, Any], payload: memoryview) -> Any:
        seen.append(session.proto.credential)
        return session.proto.credential

    server = RpcServer({"whoami": whoami}, role="coordinator", **kw)
    host, port = await server.start("127.0.0.1", 0)
    try:
        yield f"{host}:{port}", seen
    finally:
        await server.close()


async def role_of(address: str, **kw: Any) -> Any:
    client = await RpcClient.connect(address, timeout=5.0, **kw)
    try:
        return await client.call("whoami", timeout=5.0)
    finally:
        await client.close()


@pytest.mark.tcp
async def test_roles_over_tcp() -> None:
    async with rpc_server(token=MEMBER, client_token=CLIENT) as (address, _):
        assert await role_of(address, token=MEMBER) == "member"
        assert await role_of(address, token=CLIENT, credential="client") == "client"
        assert await role_of(address, token=MEMBER, credential="client") == "client"  # least trust asked for
        with pytest.raises(AuthenticationError, match=r"NETCOLL_CLIENT_TOKEN.*member token NETCOLL_TOKEN"):
            await role_of(address, token=CLIENT)  # the client token used where a member's is needed
        with pytest.raises(AuthenticationError, match="wrong token"):
            await role_of(address, token="guess", credential="client")
        with pytest.raises(AuthenticationError):
            await role_of(address)  # no token at all
    async with rpc_server(token=MEMBER) as (address, _):  # no client token configured: members only
        assert await role_of(address, token=MEMBER) == "member"
        with pytest.raises(AuthenticationError, match="accepts members only"):
            await role_of(address, token=CLIENT, credential="client")
    async with rpc_server() as (address, _):  # no tokens (loopback, tests): everyone is a member, as before
        assert await role_of(address) == "member"


@pytest.mark.tcp
async def test_peer_links_accept_members_only() -> None:
    listener = Listener(token=MEMBER)
    host, port = await listener.start("127.0.0.1", 0)
    try:
        for token in (CLIENT, MEMBER):  # not even the member token, offered as a client credential
            proto = await open_connection(host, port)
            try:
                with pytest.raises(AuthenticationError, match="members only"):
                    await client_handshake(
                        proto, token=token, role="peer", hello={"session": "s", "rank": 1}, credential="client"
                    )
            finally:
                proto.close()
            await asyncio.sleep(0)
    finally:
        await listener.close()
