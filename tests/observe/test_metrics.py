"""``/metrics`` with prometheus_client: a running coordinator and rank are
scraped after a job and parsed with prometheus_client's own parser; without
the library the endpoint answers 503 and says why."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from netcoll import observe, resultpool  # noqa: E402
from netcoll.cli.health import http_get  # noqa: E402
from netcoll.links import shm  # noqa: E402
from netcoll.service import metrics  # noqa: E402
from netcoll.service.http import HttpServer  # noqa: E402
from tests.support.services import service  # noqa: E402

pytestmark = pytest.mark.tcp


async def scrape(server: HttpServer) -> dict[str, Any]:
    # the whole exposition (netcoll health's http_get keeps only a health answer's first 64 KiB)
    status, text = await asyncio.to_thread(fetch, f"{server.url}/metrics")
    assert status == 200, text
    return {f.name: f for f in text_string_to_metric_families(text)}


def fetch(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5.0) as resp:
        return int(resp.status), resp.read().decode()


def value(family: Any, suffix: str = "", **labels: str) -> float:
    for s in family.samples:
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {family.name}{suffix} {labels} in {family.samples}")


def total(family: Any, suffix: str = "", **labels: str) -> float:
    return sum(
        float(s.value)
        for s in family.samples
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def test_scrape_a_coordinator_and_a_rank_after_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resultpool.RESULTS, "min_bytes", 1 << 16)  # the job's 1 MiB results are pooled
    # this test's collectives only (the records are the process's; other tests of this worker add theirs)
    monkeypatch.setattr(observe, "DURATIONS", observe.Durations())
    monkeypatch.setattr(observe, "OUTCOMES", {})
    async with service(2) as (cluster, client):
        coord_http = HttpServer(
            ready=lambda: (True, "ok"), metrics=metrics.coordinator_metrics(cluster.coord, cluster.svc)
        )
        rank_http = HttpServer(ready=lambda: (True, "ok"), metrics=metrics.rank_metrics(cluster.daemons[0]))
        await coord_http.start("127.0.0.1", 0)
        await rank_http.start("127.0.0.1", 0)
        try:
            rec = await client.run("all_reduce", size=1 << 20, iters=3, timeout=60)
            assert rec["state"] == "succeeded", rec
            coord = await scrape(coord_http)
            assert value(coord["netcoll_members"]) == 2
            assert value(coord["netcoll_epoch"]) >= 1
            assert value(coord["netcoll_jobs"], "_total", state="succeeded") == 1
            assert coord["netcoll_jobs"].type == "counter"
            assert "process_cpu_seconds" in coord and "process_resident_memory_bytes" in coord

            rank = await scrape(rank_http)
            hist = rank["netcoll_collective_duration_seconds"]
            assert hist.type == "histogram"
            # the records are the process's (the in-process daemons share them): sums over algorithms
            count = total(hist, "_count", op="all_reduce")
            assert count >= 2 * 3  # two daemons, three iterations each at least
            assert total(hist, "_bucket", op="all_reduce", le="+Inf") == count
            assert all(s.labels.get("algorithm") for s in hist.samples if s.labels.get("op") == "all_reduce")
            assert value(rank["netcoll_collectives"], "_total", op="all_reduce", outcome="ok") == count
            me = cluster.daemons[0].rank
            assert me in (0, 1)
            peer = str(1 - me)  # its one peer
            assert value(rank["netcoll_peer_sent_bytes"], "_total", peer=peer) >= 3 * (1 << 20) // 2
            assert value(rank["netcoll_peer_received_bytes"], "_total", peer=peer) >= 3 * (1 << 20) // 2
            kind = "shm" if shm.possible() else "tcp"  # the daemons share this host
            assert value(rank["netcoll_peer_link_info"], peer=peer, kind=kind) == 1
            if kind == "shm":  # (0 here: this test's loop is asyncio's, which does not poll lanes)
                assert value(rank["netcoll_peer_lane_frames"], "_total", peer=peer, direction="sent") >= 0
                # (0: an all_reduce does not lend its sends)
                for direction in ("sent", "received", "held"):
                    assert value(rank["netcoll_peer_direct_messages"], "_total", peer=peer, direction=direction) == 0
            assert value(rank["netcoll_peer_send_backlog_bytes"], peer=peer) >= 0
            assert value(rank["netcoll_rank_jobs"], "_total", result="ok") == 1
            pool = resultpool.RESULTS.stats()
            assert pool["made"] >= 1
            assert value(rank["netcoll_result_pool_free_bytes"]) == pool["held_bytes"]
            assert value(rank["netcoll_result_pool_lent"]) == pool["lent"]
            assert value(rank["netcoll_result_pool_blocks"], "_total", source="reused") == pool["reused"]
            assert value(rank["netcoll_result_pool_blocks"], "_total", source="new") == pool["made"]
            assert not any(name.endswith("gbps") for name in (*coord, *rank))  # base units only
        finally:
            await coord_http.close()
            await rank_http.close()


async def test_without_prometheus_client_metrics_is_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "available", lambda: False)
    server = HttpServer(ready=lambda: (True, "ok"), metrics=metrics._renderer())
    await server.start("127.0.0.1", 0)
    try:
        status, text = await asyncio.to_thread(http_get, f"{server.url}/metrics", 5.0)
        assert status == 503 and "pip install 'netcoll[metrics]'" in text
        status, _ = await asyncio.to_thread(http_get, f"{server.url}/livez", 5.0)
        assert status == 200
    finally:
        await server.close()
