"""Job timelines: a job submitted with tracing comes back as a Chrome trace
merged from every rank (send, receive, reduce and operation spans) that
loads with json.load and has the fields Perfetto needs; an untraced job
records nothing."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from netcoll import observe
from netcoll.cli import main
from netcoll.cli.submit import _write_trace
from netcoll.service.timeline import Traces
from tests.support.services import service

pytestmark = pytest.mark.tcp


def check_perfetto(doc: dict[str, Any], ranks: int) -> list[dict[str, Any]]:
    """The complete events, after checking every event has what the format requires."""
    events = doc["traceEvents"]
    for e in events:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["name"], str) and e["ts"] >= 0 and e["dur"] >= 0
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(ranks)}
    return [e for e in events if e["ph"] == "X"]


async def test_a_traced_job_has_spans_from_every_rank(tmp_path: Path) -> None:
    async with service(3) as (_cluster, client):
        rec = await client.run("all_reduce", size=1 << 16, iters=2, trace=True, timeout=60)
        assert rec["state"] == "succeeded", rec
        path = tmp_path / "job.json"
        _write_trace(str(path), rec["trace"])  # what `netcoll submit --trace FILE` writes
        with path.open() as f:
            doc = json.load(f)
        spans = check_perfetto(doc, 3)
        for rank in range(3):
            mine = {e["name"] for e in spans if e["pid"] == rank}
            assert {"send", "recv", "all_reduce #0", "all_reduce #1"} <= mine, (rank, mine)
        assert any(e["name"] == "reduce" for e in spans)  # (a rank folded in by doubling only sends and receives)
        lanes = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
        assert {"send to rank 0", "recv from rank 0", "reduce", "operations"} <= lanes
        assert set(doc["otherData"]["clock_error_us"]) == {"0", "1", "2"}
        assert doc["otherData"]["dropped_spans"] == {"0": 0, "1": 0, "2": 0}

        plain = await client.run("all_reduce", size=64, timeout=60)  # not traced: nothing kept
        with pytest.raises(KeyError, match="no trace of job"):
            await client.trace(plain["id"])


async def test_netcoll_submit_trace_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    path = tmp_path / "job.json"
    try:
        async with service(2) as (cluster, _client):
            argv = [
                "submit",
                "broadcast",
                "--size",
                "4KiB",
                "--coordinator",
                cluster.coord.address,
                "--trace",
                str(path),
            ]
            assert await asyncio.to_thread(main, argv) == 0
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
    assert f"trace: {path} (" in capsys.readouterr().err
    with path.open() as f:
        check_perfetto(json.load(f), 2)


async def test_the_span_limit_drops_and_says_so() -> None:
    rec = observe.Recorder(limit=2)
    for i in range(5):
        rec.add("send", "send to rank 1", float(i), float(i) + 0.5)
    assert len(rec.spans) == 2 and rec.dropped == 3
    assert observe.TRACE.get() is None  # nothing records outside a traced job
    await asyncio.sleep(0)


def test_malformed_spans_are_skipped_and_old_traces_forgotten() -> None:
    import msgpack

    traces = Traces(keep=2)
    rows = [["send", "t", 1.0, 2.0, {}], ["x", 5, 1.0, 2.0, {}], ["y", "t", 3.0, 1.0, {}], "junk"]
    for job in (1, 2, 3):
        traces.add(job, 0, {"clock_error_s": 0.0, "dropped": 0}, msgpack.packb(rows))
    assert traces.chrome(1) is None  # only the last two are kept
    doc = traces.chrome(3)
    assert doc is not None and [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"] == ["send"]
    with pytest.raises(TypeError):
        traces.add(4, 0, {"clock_error_s": -1, "dropped": 0}, b"")
