"""bench/ddp.py at a CI size: it trains on both backends and prints its table
(the figures themselves are measured by hand: docs/torch.md)."""

from __future__ import annotations

import re

import pytest

from tests.support import REPO

from .launch import run

pytestmark = pytest.mark.tcp


@pytest.mark.timeout(400)
def test_ddp_bench_prints_the_table() -> None:
    argv = ["--width", "64", "--steps", "4", "--warmup", "1", "--rounds", "2", "--batch", "4"]
    done = run(2, str(REPO / "bench" / "ddp.py"), *argv)
    assert done.returncode == 0, done.output[-5000:]
    out = done.output
    assert "2 ranks, batch 4 per rank" in out and "2 round(s) x 4 steps" in out, out[-3000:]
    for backend in ("netcoll", "gloo", "no communication"):
        assert re.search(rf"\[rank 0\] {backend} +\d+\.\d +\d+\.\d +\d+\.\d +6\n", out), (backend, out[-3000:])
    assert re.search(r"netcoll / gloo median step time: \d+\.\d\d", out)
    assert "bit-identical on every rank: netcoll True, gloo True; max |netcoll - gloo| = " in out


def test_the_spread_stays_within_the_samples() -> None:
    from bench import ddp  # (imports torch: here, not at collection)

    ts = [0.001, 0.010, 0.010, 0.010, 0.010, 0.010]  # one fast step among six
    median, p10, p90 = ddp.spread(ts)
    assert min(ts) <= p10 <= median <= p90 <= max(ts)
    assert ddp.spread([0.5]) == (0.5, 0.5, 0.5)


def test_every_backend_gets_the_same_ddp_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import ddp

    made: list[tuple[object, dict[str, object]]] = []
    monkeypatch.setattr(ddp, "DistributedDataParallel", lambda model, **kw: made.append((model, kw)))
    for group in (None, "a gloo group"):
        ddp.ddp_over(group)("model")
    assert made == [("model", {"process_group": g, **ddp.DDP_OPTIONS}) for g in (None, "a gloo group")]
    assert ddp.DDP_OPTIONS == {"gradient_as_bucket_view": True, "bucket_cap_mb": 1}
