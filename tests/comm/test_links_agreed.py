"""``connect()`` agrees on every rank's link kinds and hosts before it returns,
over real loopback links: every rank, and every group made from its transport
later (a split, a group built on the transport as torch's sub-groups are),
knows the same medium and ranks per core, and ``auto`` chooses by them
(reduce: the tree over sockets, the ring over shared memory from 4 MiB; small
all_reduce: the tree on a crowded host)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

import numpy as np
import pytest

from netcoll.comm import Communicator
from netcoll.selection import table
from tests.support import connected_world

pytestmark = pytest.mark.tcp

N = 3


@contextlib.asynccontextmanager
async def group(monkeypatch: pytest.MonkeyPatch, transport: str) -> AsyncIterator[list[Communicator]]:
    monkeypatch.setenv("NETCOLL_TRANSPORT", transport)
    async with connected_world(N) as comms:
        yield comms


@pytest.mark.parametrize(("transport", "medium", "algorithm"), [("tcp", "socket", "tree"), ("shm", "shm", "ring")])
async def test_connect_agrees_on_links_and_auto_chooses_by_them(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, transport: str, medium: str, algorithm: str
) -> None:
    with caplog.at_level(logging.INFO, logger="netcoll.comm"):
        async with group(monkeypatch, transport) as comms:
            assert [c.medium for c in comms] == [medium] * N
            assert all(c._engine.seq == 0 for c in comms)  # the agreement is numbered apart
            again = [c.agree_links() for c in comms]  # agreed once: done at once, the same answer
            assert all(w.done() and w.result() == medium for w in again)
            x = np.ones(table.REDUCE_RING_MIN_BYTES // 4, np.float32)
            res = await asyncio.gather(*(c.reduce(x, root=1) for c in comms))
            assert np.all(res[1] == N)
            assert {c.model_stats["choices"]["reduce"]["algorithm"] for c in comms} == {algorithm}
            assert {c.model_stats["links"] for c in comms} == {medium}
            cores = len(os.sched_getaffinity(0))  # one host: every rank counts
            assert {c.model_stats["ranks_per_core"] for c in comms} == {N / cores}
            assert {c.model_stats["hosts"] for c in comms} == {1}  # one host: the table chooses

            subs = await asyncio.gather(*(c.split(0 if c.rank else None) for c in comms))
            assert subs[0] is None and [s.medium for s in subs[1:]] == [medium, medium]
            built = [Communicator(c.transport, group="built", members=(0, 2)) for c in comms[::2]]
            assert [b.medium for b in built] == [medium, medium]
            with pytest.raises(ValueError, match="a sub-group knows its links from the world group"):
                built[0].agree_links()
            await asyncio.gather(*(s.close() for s in [*subs[1:], *built] if s is not None))
    said = [r.getMessage() for r in caplog.records if "auto's table chooses for them" in r.getMessage()]
    per_core = f"{N / len(os.sched_getaffinity(0)):.3g} ranks per core"
    assert len(said) == N and all(f"links {medium}, {per_core}, 1 host;" in m for m in said)


async def test_a_transport_without_agreement_keeps_the_link_blind_table(monkeypatch: pytest.MonkeyPatch) -> None:
    async with group(monkeypatch, "tcp") as comms:
        for c in comms:
            c.transport.layout = None
        fresh = [Communicator(c.transport, group="fresh") for c in comms]
        assert [f.medium for f in fresh] == [None] * N
        x = np.ones(table.REDUCE_RING_MIN_BYTES // 4, np.float32)
        await asyncio.gather(*(f.reduce(x, root=0) for f in fresh))
        assert {f.model_stats["choices"]["reduce"]["algorithm"] for f in fresh} == {"ring"}
        await asyncio.gather(*(f.close() for f in fresh))


async def test_a_crowded_host_runs_small_all_reduce_as_the_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    async with group(monkeypatch, "tcp") as comms:
        x = np.ones(4, np.float32)
        await asyncio.gather(*(c.all_reduce(x) for c in comms))
        assert {c.model_stats["choices"]["all_reduce"]["algorithm"] for c in comms} == {"doubling"}
        monkeypatch.setattr(table, "CROWDED_RANKS_PER_CORE", comms[0].model_stats["ranks_per_core"])
        res = await asyncio.gather(*(c.all_reduce(x) for c in comms))
        assert all(np.all(r == N) for r in res)
        assert {c.model_stats["choices"]["all_reduce"]["algorithm"] for c in comms} == {"tree"}


@pytest.mark.parametrize(("setting", "calibrated"), [("", True), ("0", False), ("1", True)])
async def test_a_group_over_several_hosts_has_the_model_choose_by_default(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, setting: str, calibrated: bool
) -> None:
    """The table's thresholds were measured on one host: a group whose ranks are on several
    (each rank here reports a host key of its own) calibrates the cost model when it forms
    unless NETCOLL_COST_MODEL=0, and says who chooses."""
    from netcoll.selection import media

    real = media.host_fields
    keys = iter(range(1, 100))

    def own_host() -> np.ndarray:
        fields = real()
        fields[1] = float(next(keys))  # the key's low half: a different host per rank
        return fields

    monkeypatch.setattr(media, "host_fields", own_host)
    monkeypatch.setenv("NETCOLL_COST_MODEL", setting)
    with caplog.at_level(logging.INFO, logger="netcoll.comm"):
        async with group(monkeypatch, "tcp") as comms:
            assert {c.model_stats["hosts"] for c in comms} == {N}
            assert all((c.model_stats["model"] is not None) == calibrated for c in comms)
            x = np.ones(1024, np.float32)
            assert all(np.all(r == N) for r in await asyncio.gather(*(c.all_reduce(x) for c in comms)))
    said = [r.getMessage() for r in caplog.records if f"{N} hosts;" in r.getMessage()]
    chooser = "the cost model chooses for them" if calibrated else "auto's table chooses for them"
    assert len(said) == N and all(chooser in m for m in said)


async def test_one_host_keeps_the_table_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NETCOLL_COST_MODEL", raising=False)
    async with group(monkeypatch, "tcp") as comms:
        assert {c.model_stats["hosts"] for c in comms} == {1}
        assert all(c.model_stats["model"] is None for c in comms)
