"""The coordinator logs each job's steps (issue 38, item 5): one INFO line when it
is submitted, when it starts and when it ends, which as JSON carries the job's
id, op, size, ranks, state, duration and error as fields. Loopback only."""

from __future__ import annotations

import json
import logging

import pytest

from netcoll.logs import ContextFilter, JsonFormatter, TextFormatter
from tests.support.services import service

pytestmark = pytest.mark.tcp


def _json(record: logging.LogRecord) -> dict[str, object]:
    ContextFilter("coordinator").filter(record)
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc: dict[str, object] = json.loads(line)
    return doc


async def test_submitted_started_and_ended_one_line_each(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="netcoll.jobs"):
        async with service(2) as (_, client):
            ok = await client.run("all_reduce", size=4096, iters=2)
            failed = await client.run("broadcast", size=1024, world_size=3, deadline=0.2)
            queued = await client.submit("barrier", world_size=5)
            await client.cancel(queued)
            await client.wait(queued, 10)
    records = [r for r in caplog.records if r.name == "netcoll.jobs"]
    assert all(r.levelno == logging.INFO for r in records)
    lines = [_json(r) for r in records]
    by_job = {j: [d for d in lines if d["job"] == j] for j in (ok["id"], failed["id"], queued)}

    submitted, started, ended = by_job[ok["id"]]
    assert [d["event"] for d in (submitted, started, ended)] == ["job_submitted", "job_started", "job_ended"]
    for doc in (submitted, started, ended):
        assert doc["op"] == "all_reduce" and doc["size"] == 4096 and doc["dtype"] == "float32"
        assert doc["level"] == "INFO" and doc["logger"] == "netcoll.jobs" and doc["who"] == "coordinator"
    assert submitted["world_size"] is None and submitted["queued"] == 1
    assert started["world_size"] == 2 and started["epoch"] == ok["epoch"] and len(started["ranks"]) == 2
    assert ended["state"] == "succeeded" and ended["error"] is None and ended["world_size"] == 2
    assert isinstance(ended["duration_s"], float) and ended["time_s"] == ok["time_s"]
    assert f"job {ok['id']} succeeded after" in str(ended["msg"])

    submitted, ended = by_job[failed["id"]]  # never started: it waited for a third rank
    assert ended["event"] == "job_ended" and ended["state"] == "failed" and "waited 0.2s" in str(ended["error"])
    assert "(never started)" in str(ended["msg"]) and str(ended["error"]) in str(ended["msg"])

    submitted, ended = by_job[queued]
    assert (submitted["op"], submitted["world_size"], submitted["size"]) == ("barrier", 5, None)
    assert ended["state"] == "cancelled" and ended["error"] == "cancelled before it started"


def test_text_lines_carry_the_message_only() -> None:
    record = logging.LogRecord("netcoll.jobs", logging.INFO, __file__, 1, "job %d submitted", (7,), None)
    record.netcoll_data = {"event": "job_submitted", "job": 7, "msg": "not this"}
    ContextFilter("coordinator").filter(record)
    assert TextFormatter().format(record).endswith("[coordinator] netcoll.jobs: job 7 submitted")
    doc = json.loads(JsonFormatter().format(record))
    assert doc["msg"] == "job 7 submitted" and doc["job"] == 7  # data never overrides a line's own fields
