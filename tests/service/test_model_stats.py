"""A job's record shows the cost model's choice on every rank: the agreed
parameters, the algorithm and segment size ``auto`` chose, and the predicted
and measured seconds."""

from __future__ import annotations

import pytest

from tests.support.services import service

pytestmark = pytest.mark.tcp


async def test_job_record_shows_the_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_COST_MODEL", "1")  # opt-in (off by default)
    async with service(3, coordinator={}) as (_, client):
        rec = await client.run("all_reduce", size="256KiB", iters=3, warmup=1)
        assert rec["state"] == "succeeded", rec
        model = rec["model"]
        assert sorted(model) == ["0", "1", "2"]
        params = {str(m["model"]) for m in model.values()}
        assert len(params) == 1 and model["0"]["model"]["beta"] > 0  # agreed at calibration
        rows = [m["choices"]["all_reduce"] for m in model.values()]
        assert len({(r["algorithm"], r["segment_bytes"], r["predicted_s"]) for r in rows}) == 1
        assert all(r["measured_s"] > 0 and r["calls"] >= 3 for r in rows)
