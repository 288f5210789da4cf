"""The cost model over real loopback TCP: ``netcoll.connect`` calibrates, every
rank holds the same parameters, ``auto`` chooses with them, and each
operation's DEBUG line names the choice with its predicted time."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from netcoll.selection import cost as cm
from tests.support import connected_world

pytestmark = pytest.mark.tcp


async def test_connect_calibrates_and_auto_uses_the_model(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETCOLL_COST_MODEL", "1")  # on one host: opt-in (by default between hosts)
    n = 3
    async with connected_world(n) as comms:
        models = [c.model_stats["model"] for c in comms]
        assert models[0] is not None and models[0] == models[1] == models[2]
        x = np.arange(1 << 15, dtype=np.float32)
        with caplog.at_level(logging.DEBUG, logger="netcoll.engine"):
            res = await asyncio.gather(*(c.all_reduce(x) for c in comms))
        assert all(np.array_equal(r, n * x) for r in res)
        rows = [c.model_stats["choices"]["all_reduce"] for c in comms]
        assert len({(r["algorithm"], r["segment_bytes"], r["predicted_s"]) for r in rows}) == 1
        assert rows[0]["predicted_s"] > 0 and rows[0]["measured_s"] > 0
    lines = [
        r.getMessage() for r in caplog.records if "all_reduce #" in r.getMessage() and " done in " in r.getMessage()
    ]
    assert lines and all(f"({rows[0]['algorithm']}, segment_bytes=" in m and "predicted" in m for m in lines)


async def test_with_the_model_a_broadcast_is_sized_and_learns_what_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the model a broadcast's ``auto`` is ``sized`` (the root chooses by the model);
    non-roots passing None get the array; and once the call has run every rank knows its
    size and the root's shape, so each keeps a sample of what ran (the same on every rank),
    and the stats name that shape, with the root's prediction."""
    monkeypatch.setenv("NETCOLL_COST_MODEL", "1")
    n = 4
    async with connected_world(n) as comms:
        for size in (10, 1 << 20):
            before = [len(c._engine.tuner.samples) for c in comms]
            x = np.arange(size, dtype=np.float32)
            got = await asyncio.gather(*(c.broadcast(x if c.rank == 1 else None, root=1) for c in comms))
            assert all(np.array_equal(g, x) for g in got)
            rows = [c.model_stats["choices"]["broadcast"] for c in comms]
            shapes = {r["algorithm"] for r in rows}
            assert len(shapes) == 1 and shapes <= {"tree", "ring"}
            assert rows[1]["predicted_s"] > 0 and rows[0]["predicted_s"] is None  # only the root predicts
            for c, b in zip(comms, before, strict=True):
                samples = c._engine.tuner.samples
                assert len(samples) == b + 1
                name, algo, terms, _ = samples[-1]
                assert (name, algo) == ("broadcast", rows[0]["algorithm"])
                assert terms == cm.terms("broadcast", algo, x.nbytes, n, c.segment_bytes)
