"""Every RPC gets an answer: a reply that cannot be framed (over the header
limit) comes back as a typed error, never as silence that leaves the caller
waiting forever (`netcoll status` hung this way once job records grew)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from netcoll.errors import NetcollError
from netcoll.rpc import RpcClient, RpcServer

TOKEN = "rpc-replies-s3cret"


async def _huge(session: object, params: dict[str, Any], payload: memoryview) -> Any:
    return {"rows": ["x" * 1000] * int(params["n"])}  # ~n KB of msgpack header


async def test_an_answer_over_the_header_limit_is_an_error_not_a_hang() -> None:
    server = RpcServer({"huge": _huge}, token=TOKEN)
    await server.start("127.0.0.1", 0)
    try:
        rpc = await RpcClient.connect(f"127.0.0.1:{server.address[1]}", token=TOKEN)
        try:
            assert len((await rpc.call("huge", {"n": 4}))["rows"]) == 4  # small answers still go
            with pytest.raises(NetcollError, match="header"):
                async with asyncio.timeout(10):  # the bug: no answer at all
                    await rpc.call("huge", {"n": 100})  # 100 KB: over the 64 KiB header limit
            assert len((await rpc.call("huge", {"n": 2}))["rows"]) == 2  # the session goes on
        finally:
            await rpc.close()
    finally:
        await server.close()
