"""Ranks as separate OS processes over real loopback TCP (each from its own
127.0.0.x address, standing in for hosts), joined at an in-process Coordinator."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest

import netcoll
from tests.support.worlds import REPO

pytestmark = pytest.mark.tcp
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tcp_worker.py")


async def run_ranks(
    n: int,
    scenario: str,
    *,
    limit: float = 120.0,
    token: str | None = None,
    coord_token: str | None = None,
    release_last: bool = False,
) -> list[dict[str, Any]]:
    """Run ``n`` worker processes of ``scenario``; their JSON results in start order.

    ``release_last``: the workers' stdin stays open, and once all but one have
    exited the last one gets a line on it (the "timeout" scenario's late rank
    waits for that instead of sleeping for a guessed time)."""
    # the worker imports netcoll: this checkout's, installed or not
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if token:
        env["NETCOLL_TEST_TOKEN"] = token
    stdin = asyncio.subprocess.PIPE if release_last else asyncio.subprocess.DEVNULL
    async with netcoll.Coordinator(token=coord_token) as coord:
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                WORKER,
                coord.address,
                str(n),
                scenario,
                str(i),
                stdin=stdin,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            for i in range(n)
        ]
        talks = [asyncio.ensure_future(p.communicate()) for p in procs]
        try:
            async with asyncio.timeout(limit):
                if release_last:
                    pending = set(talks)
                    while len(pending) > 1:
                        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for p in procs:
                        if p.returncode is None and p.stdin is not None:
                            p.stdin.write(b"go\n")
                            p.stdin.close()
                outs = await asyncio.gather(*talks)
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    await p.wait()
            for talk in talks:
                talk.cancel()
            await asyncio.gather(*talks, return_exceptions=True)
    results = []
    for p, (out, err) in zip(procs, outs, strict=True):
        lines = out.decode().strip().splitlines()
        results.append(
            {"returncode": p.returncode, "stderr": err.decode()[-3000:], **(json.loads(lines[-1]) if lines else {})}
        )
    return results


@pytest.mark.parametrize("n", [2, 3, 4])
async def test_grid_over_processes(n: int) -> None:
    res = await run_ranks(n, "grid")
    for r in res:
        assert r["returncode"] == 0 and r.get("ok"), r
    assert sorted(r["rank"] for r in res) == list(range(n))


@pytest.mark.parametrize("n", [3, 4])
async def test_weighted_all_reduce_over_processes(n: int) -> None:
    """Each rank process's calibration is told the same per-rank rates (rank 2 4x slower):
    they agree on them, auto runs the weighted all_reduce, every rank ends with the same bits."""
    res = await run_ranks(n, "weighted")
    for r in res:
        assert r["returncode"] == 0 and r.get("ok"), r
    assert {tuple(r["rates"]) for r in res} == {(1e9, 1e9, 0.25e9, 1e9, 1e9)[:n]}
    assert {r["algorithm"] for r in res} == {"weighted"}
    assert len({r["bits"] for r in res}) == 1


async def test_token_protected_world() -> None:
    res = await run_ranks(2, "grid", token="s3cret", coord_token="s3cret")
    assert all(r.get("ok") for r in res), res


async def test_wrong_token_is_refused() -> None:
    res = await run_ranks(2, "grid", token="wrong", coord_token="s3cret", limit=60)
    for r in res:
        assert r.get("ok") is False and r["error"] == "AuthenticationError", r


async def test_killed_rank_fails_every_other_rank_fast() -> None:
    # The collectives' deadline is an hour (tcp_worker.py), the whole run may take 60 s: a survivor
    # that waited for its deadline instead of learning of the lost rank would fail this test.
    res = await run_ranks(4, "die", limit=60)
    survivors = [r for r in res if r["returncode"] == 0]
    assert len(survivors) == 3 and any(r["returncode"] == 3 for r in res), res
    for r in survivors:
        assert r.get("ok") is False, r
        assert r["error"] in ("PeerLost", "CollectiveAborted"), r
        assert "rank 3" in r["message"], r


async def test_timeout_names_the_missing_rank() -> None:
    res = await run_ranks(3, "timeout", limit=60, release_last=True)
    failed = [r for r in res if r.get("ok") is False]
    assert len(failed) == 2, res
    assert [r.get("rank") for r in res if r.get("ok")] == [2], res  # the late rank, released after the others
    for r in failed:
        assert r["error"] in ("CollectiveTimeout", "CollectiveAborted"), r
        assert "2" in str(r["ranks"]) or "rank 2" in r["message"], r
    assert any(r["error"] == "CollectiveTimeout" and r["ranks"] == [2] for r in failed), failed


async def test_mismatch_is_reported_on_every_rank() -> None:
    res = await run_ranks(3, "mismatch", limit=60)
    for r in res:
        assert r.get("ok") is False and r["error"] == "MismatchError", r
        assert "float64[10]" in r["message"] and "float64[11]" in r["message"], r
