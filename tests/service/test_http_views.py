"""The coordinator's read-only JSON views on its HTTP port (issue 38, item 5):
``/jobs`` (running, queued and recent jobs) and ``/status`` (what ``netcoll
status`` shows), bounded in size, under the same rules as ``/metrics`` (no
token; mutual TLS when the process has TLS). Loopback only."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import netcoll
from netcoll.mesh.certs import TlsConfig
from netcoll.service import JobService
from netcoll.service.http import HttpServer
from netcoll.service.jobs import JobSpec, JobState
from netcoll.service.records import Job
from netcoll.service.views import MAX_BODY, MAX_JOBS, MAX_TEXT, coordinator_views, render
from tests.support.services import service

pytestmark = pytest.mark.tcp
REPO = Path(__file__).resolve().parents[2]


async def _request(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


async def _json(port: int, path: str) -> Any:
    status, headers, body = await _request(port, path)
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    return json.loads(body)


async def test_jobs_and_status_show_the_queue_the_history_and_the_members() -> None:
    async with service(2) as (cluster, client):
        ok = await client.run("all_reduce", size=4096)
        assert ok["state"] == "succeeded"
        failed = await client.run("broadcast", size=1024, world_size=3, deadline=0.2)  # never gets 3 ranks
        assert failed["state"] == "failed"
        waiting = await client.submit("all_gather", size=2048, world_size=3)  # stays queued
        http = HttpServer(ready=lambda: (True, "ok"), metrics=lambda: "", views=coordinator_views(cluster.svc))
        _, port = await http.start("127.0.0.1", 0)
        try:
            async with asyncio.timeout(10):
                while (await client.job(waiting))["waiting"] is None:
                    await asyncio.sleep(0.02)
            jobs = await _json(port, "/jobs")
            status = await _json(port, "/status")
            head = await _request(port, "/jobs", "HEAD")
            post = await _request(port, "/status", "POST")
            index = await _request(port, "/")
        finally:
            await http.close()
            await client.cancel(waiting)
    assert jobs["submitted"] == 3 and jobs["running"] is None
    assert jobs["finished"] == {"succeeded": 1, "failed": 1}
    [queued] = jobs["queued"]
    assert queued["id"] == waiting and queued["state"] == "queued" and queued["size"] == 2048
    assert queued["world_size"] == 3 and "waiting for 1 more rank" in queued["waiting"]
    assert queued["started_at"] is None and queued["queued_s"] >= 0
    new, old = jobs["recent"]  # newest first
    assert (new["id"], new["state"], new["op"]) == (failed["id"], "failed", "broadcast")
    assert "waited 0.2s" in new["error"] and new["ran_s"] is None
    assert (old["id"], old["state"], old["size"], old["dtype"]) == (ok["id"], "succeeded", 4096, "float32")
    assert old["world_size"] == 2 and [r["rank"] for r in old["ranks"]] == [0, 1]
    assert all(r["address"].startswith("127.0.0.") for r in old["ranks"])
    assert old["submitted_at"] <= old["started_at"] <= old["finished_at"] and old["ran_s"] >= 0
    assert old["time_s"] > 0 and old["verified"] is True and old["error"] is None

    assert status["epoch"] >= 1 and status["queued"] == 1 and status["current_job"] is None
    assert [m["rank"] for m in status["members"]] == [0, 1]
    for member in status["members"]:
        assert {"address", "epoch", "state", "current_job"} <= set(member)
    assert status["board"] == [] and status["board_text"] == [] and isinstance(status["groups"], list)
    assert [j["id"] for j in status["jobs"]] == [ok["id"], failed["id"], waiting]  # as `netcoll status --json`

    assert head[0] == 200 and head[2] == b"" and int(head[1]["content-length"]) > 0
    assert post[0] == 405
    assert index[0] == 200 and b"/jobs" in index[2] and b"/status" in index[2]


async def test_a_rank_daemons_port_has_no_views() -> None:
    http = HttpServer(ready=lambda: (True, "ok"), metrics=lambda: "")
    _, port = await http.start("127.0.0.1", 0)
    try:
        status, _, body = await _request(port, "/jobs")
    finally:
        await http.close()
    assert status == 404 and body.endswith(b"(try /livez, /readyz, /metrics)\n")


async def test_the_views_are_bounded() -> None:
    svc = JobService(netcoll.Coordinator("127.0.0.1", 0))
    for i in range(1, 3 * MAX_JOBS):  # many finished jobs, each with an overlong error
        job = Job(i, JobSpec(op="all_reduce", size=64), None)
        job.finish(JobState.FAILED, f"job {i}: " + "x" * 100_000)
        svc.jobs[i] = job
    for i in range(3 * MAX_JOBS, 5 * MAX_JOBS):
        svc.jobs[i] = svc.pending[i] = Job(i, JobSpec(op="barrier"), None)
    body = render(coordinator_views(svc)["/jobs"]())
    doc = json.loads(body)
    assert len(body) <= MAX_BODY
    assert len(doc["recent"]) == MAX_JOBS and doc["recent"][0]["id"] == 3 * MAX_JOBS - 1
    assert len(doc["recent"][0]["error"]) <= MAX_TEXT + 3
    assert len(doc["queued"]) == MAX_JOBS and doc["queued_omitted"] == MAX_JOBS
    huge = {"rows": [{"why": "y" * 10_000, "ranks": list(range(5000))} for _ in range(2000)]}
    body = render(huge)
    assert len(body) <= MAX_BODY
    shrunk = json.loads(body)
    assert shrunk["rows_omitted"] > 0 and shrunk["rows"][0]["ranks_omitted"] > 0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsConfig]:
    pytest.importorskip("cryptography")
    from tests.support.tlsca import issue, make_ca

    tmp = tmp_path_factory.mktemp("pki")
    ca = make_ca(tmp, "ca")
    return {"server": TlsConfig(**issue(ca, tmp, "server")), "client": TlsConfig(**issue(ca, tmp, "client"))}


async def test_over_tls_the_views_need_a_client_certificate(pki: dict[str, TlsConfig]) -> None:
    from netcoll.cli.common import CliError
    from netcoll.cli.health import http_get

    http = HttpServer(ready=lambda: (True, ""), metrics=lambda: "", tls=pki["server"], views={"/status": dict})
    _, port = await http.start("127.0.0.1", 0)
    try:
        status, body = await asyncio.to_thread(http_get, f"https://127.0.0.1:{port}/status", 5.0, pki["client"])
        assert (status, json.loads(body)) == (200, {})
        with pytest.raises(CliError):  # no client certificate: refused, as for /metrics
            await asyncio.to_thread(http_get, f"https://127.0.0.1:{port}/status", 5.0)
    finally:
        await http.close()


def test_a_coordinator_process_serves_them(tmp_path: Path) -> None:
    """``netcoll coordinator`` wires the views to its HTTP port."""
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "netcoll", "coordinator", "--port", "0", "--http-port", "0", "--ready-file", str(ready)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        port = int(json.loads(ready.read_text())["http"].rsplit(":", 1)[1])
        jobs = asyncio.run(_json(port, "/jobs"))
        status = asyncio.run(_json(port, "/status"))
    finally:
        proc.terminate()
        proc.wait(10)
    assert jobs == {"submitted": 0, "finished": {}, "running": None, "queued": [], "queued_omitted": 0, "recent": []}
    assert status["members"] == [] and status["board"] == [] and status["queued"] == 0
