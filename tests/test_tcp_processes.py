"""Ranks as separate OS processes over real loopback TCP (each from its own
127.0.0.x address, standing in for hosts), joined at an in-process Coordinator."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import pytest

import netcoll

pytestmark = pytest.mark.tcp
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tcp_worker.py")


async def run_ranks(n: int, scenario: str, *, limit: float = 120.0, token: str | None = None,
                    coord_token: str | None = None) -> list[dict]:
    env = dict(os.environ)
    if token:
        env["NETCOLL_TEST_TOKEN"] = token
    async with netcoll.Coordinator(token=coord_token) as coord:
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, WORKER, coord.address, str(n), scenario, str(i),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env) for i in range(n)]
        try:
            async with asyncio.timeout(limit):
                outs = await asyncio.gather(*(p.communicate() for p in procs))
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    await p.wait()
    results = []
    for p, (out, err) in zip(procs, outs):
        lines = out.decode().strip().splitlines()
        results.append({"returncode": p.returncode, "stderr": err.decode()[-3000:],
                        **(json.loads(lines[-1]) if lines else {})})
    return results


@pytest.mark.parametrize("n", [2, 3, 4])
async def test_grid_over_processes(n: int) -> None:
    res = await run_ranks(n, "grid")
    for r in res:
        assert r["returncode"] == 0 and r.get("ok"), r
    assert sorted(r["rank"] for r in res) == list(range(n))


async def test_token_protected_world() -> None:
    res = await run_ranks(2, "grid", token="s3cret", coord_token="s3cret")
    assert all(r.get("ok") for r in res), res


async def test_wrong_token_is_refused() -> None:
    res = await run_ranks(2, "grid", token="wrong", coord_token="s3cret", limit=60)
    for r in res:
        assert r.get("ok") is False and r["error"] == "AuthenticationError", r


async def test_killed_rank_fails_every_other_rank_fast() -> None:
    t0 = time.monotonic()
    res = await run_ranks(4, "die", limit=60)
    survivors = [r for r in res if r["returncode"] == 0]
    assert len(survivors) == 3 and any(r["returncode"] == 3 for r in res), res
    for r in survivors:
        assert r.get("ok") is False, r
        assert r["error"] in ("PeerLost", "CollectiveAborted"), r
        assert "rank 3" in r["message"], r
    assert time.monotonic() - t0 < 50  # well inside the 60 s collective deadline: nobody waited for it


async def test_timeout_names_the_missing_rank() -> None:
    res = await run_ranks(3, "timeout", limit=60)
    failed = [r for r in res if r.get("ok") is False]
    assert len(failed) == 2, res
    for r in failed:
        assert r["error"] in ("CollectiveTimeout", "CollectiveAborted"), r
        assert "2" in str(r["ranks"]) or "rank 2" in r["message"], r
    assert any(r["error"] == "CollectiveTimeout" and r["ranks"] == [2] for r in failed), failed


async def test_mismatch_is_reported_on_every_rank() -> None:
    res = await run_ranks(3, "mismatch", limit=60)
    for r in res:
        assert r.get("ok") is False and r["error"] == "MismatchError", r
        assert "float64[10]" in r["message"] and "float64[11]" in r["message"], r
