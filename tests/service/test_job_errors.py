"""A stuck job says why, once: its ranks' waits are merged into one wait chain (a cycle
named a deadlock), other errors are said once with the ranks that had them. The merge
with injected reports; a real hang of a job on in-process daemons for each path."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from netcoll.comm import Communicator
from netcoll.service import runner
from netcoll.service.failures import job_error
from netcoll.service.jobs import JobSpec
from netcoll.waits import Wait
from tests.support.services import service

NEVER = "never delivered: not called yet, stuck, or too slow"


def _timed_out(rank: int, *waits: Wait) -> dict[str, Any]:
    return {"rank": rank, "ok": False, "error": f"... on rank {rank}", "error_type": "CollectiveTimeout",
            "waits": [w.row() for w in waits]}  # fmt: skip


def test_every_ranks_wait_merges_into_one_deadlock() -> None:
    ring = {r: Wait(r, "all_reduce #4", ((r - 1) % 4,), 290.0, 299.0) for r in range(4)}
    failures = {r: _timed_out(r, ring[r], ring[(r - 1) % 4]) for r in range(4)}
    assert job_error(failures, 300) == [
        "job deadline (300s) passed: deadlock: rank 0 in all_reduce #4 waits for rank 3, "
        "rank 3 in all_reduce #4 waits for rank 2, rank 2 in all_reduce #4 waits for rank 1, "
        "rank 1 in all_reduce #4 waits for rank 0"
    ]


def test_a_ranks_own_word_about_itself_wins_and_others_fill_in() -> None:
    failures = {
        0: _timed_out(0, Wait(0, "all_reduce #1", (2,)), Wait(1, "all_reduce #1", (3,))),  # a stale account of 1
        1: _timed_out(1, Wait(1, "all_reduce #1", (0,))),
        2: {"rank": 2, "error": "job deadline passed while making its input", "error_type": "CollectiveTimeout"},
    }  # fmt: skip
    assert job_error(failures, 30) == [
        f"job deadline (30s) passed: rank 0 in all_reduce #1 waits for rank 2; "
        f"rank 1 in all_reduce #1 waits for rank 0; rank 2 {NEVER}",
        "rank 2: job deadline passed while making its input",
    ]


def test_other_errors_are_said_once_with_their_ranks() -> None:
    same = {"ok": False, "error": "job deadline passed while linking to its peers", "error_type": "CollectiveTimeout"}
    failures = {r: dict(same, rank=r) for r in range(4)}
    assert job_error(failures, 300) == ["ranks 0, 1, 2, 3: job deadline passed while linking to its peers"]
    echoes = {r: {"error": f"aborted by rank 0 ({r})", "error_type": "CollectiveAborted"} for r in (1, 2, 3)}
    assert job_error({0: {"error": "mismatch", "error_type": "MismatchError"}, **echoes}, 300) == ["rank 0: mismatch"]
    assert job_error(echoes, 300) == ["rank 1: aborted by rank 0 (1)", "rank 2: aborted by rank 0 (2)"]


@pytest.mark.tcp
async def test_a_job_whose_ranks_receive_from_each_other_fails_naming_the_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every daemon's "collective" is a recv from the next rank: a cycle. The job fails at
    its deadline with the deadlock, once (not one 'job deadline passed' per rank)."""

    async def recv_from_next(comm: Communicator, spec: JobSpec, x: Any, out: Any = None, timeout: Any = None) -> Any:
        return await comm.recv((comm.rank + 1) % comm.world_size, timeout=timeout)

    monkeypatch.setattr(runner, "call", recv_from_next)
    async with service(3) as (_, client):
        rec = await client.run("all_reduce", size=64, deadline=3.0, timeout=60)
    assert rec["state"] == "failed", rec
    assert rec["error"] == (
        "job deadline (3s) passed: deadlock: rank 0 in recv #0 waits for rank 1, "
        "rank 1 in recv #0 waits for rank 2, rank 2 in recv #0 waits for rank 0"
    ), rec["error"]


@pytest.mark.tcp
async def test_a_job_with_a_rank_that_never_calls_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 2 never reaches the collective (its input takes longer than the deadline): the
    others' waits lead to it, and its own report says where it was."""
    made = runner.call

    async def late_on_rank_2(comm: Communicator, spec: JobSpec, x: Any, out: Any = None, timeout: Any = None) -> Any:
        if comm.rank == 2:
            await asyncio.sleep(3600)
        return await made(comm, JobSpec(op="all_reduce", size=64, algorithm="ring"), x, out, timeout)

    monkeypatch.setattr(runner, "call", late_on_rank_2)
    async with service(3) as (_, client):
        rec = await client.run("all_reduce", size=64, deadline=3.0, timeout=60)
    assert rec["state"] == "failed", rec
    chain, _, rest = rec["error"].partition("; rank 2: ")
    assert chain == (
        "job deadline (3s) passed: rank 0 in all_reduce #0 waits for rank 2; "
        f"rank 1 in all_reduce #0 waits for rank 0; rank 2 {NEVER}"
    ), rec["error"]
    assert rest == "job deadline passed while running all_reduce", rec["error"]
