"""Structured logs: JSON lines carry the context (rank, epoch, job, op, seq)
of the job or collective they were logged in; text lines keep UTC times;
``--log-format`` / ``NETCOLL_LOG_FORMAT`` on every command."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
from collections.abc import Iterator

import numpy as np
import pytest

from netcoll import logs
from netcoll.cli import main
from tests.support import memory_group
from tests.support.services import service


@contextlib.contextmanager
def captured(fmt: str, level: int = logging.DEBUG) -> Iterator[io.StringIO]:
    """Root-logger lines in ``fmt`` while the block runs."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(logs.ContextFilter("test"))
    handler.setFormatter(logs.JsonFormatter() if fmt == "json" else logs.TextFormatter())
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


def json_lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


async def test_json_lines_carry_the_collective_context() -> None:
    group = memory_group(2)
    try:
        comms = group.communicators()
        with captured("json") as out:
            await asyncio.gather(*(c.all_reduce(np.ones(4, np.float32)) for c in comms))
        lines = json_lines(out)
        done = [d for d in lines if d["logger"] == "netcoll.engine" and "done in" in str(d["msg"])]
        assert {d["rank"] for d in done} == {0, 1}
        assert all(d["op"] == "all_reduce" and d["seq"] == 0 and d["level"] == "DEBUG" for d in done)
        for d in lines:
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", str(d["ts"]))
    finally:
        await group.close()


async def test_a_slow_operation_is_a_warning_naming_whom_it_waits_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_SLOW_OP_S", "0.05")
    group = memory_group(2)
    try:
        comms = group.communicators()
        with captured("json", logging.INFO) as out:
            first = comms[0].all_reduce(np.ones(4, np.float32))
            async with asyncio.timeout(20):  # rank 1 calls only once rank 0 has warned
                while "still running" not in out.getvalue():
                    await asyncio.sleep(0.01)
            await asyncio.gather(first, comms[1].all_reduce(np.ones(4, np.float32)))
        slow = [d for d in json_lines(out) if "still running" in str(d["msg"])]
        assert slow and slow[0]["level"] == "WARNING" and "waiting for rank 1" in str(slow[0]["msg"])
        assert slow[0]["op"] == "all_reduce" and slow[0]["seq"] == 0 and slow[0]["rank"] == 0
    finally:
        await group.close()


@pytest.mark.tcp
async def test_json_lines_carry_the_job_context() -> None:
    async with service(2) as (_cluster, client):
        with captured("json", logging.INFO) as out:
            rec = await client.run("all_reduce", size=64, timeout=60)
        assert rec["state"] == "succeeded"
        starts = [d for d in json_lines(out) if str(d["msg"]).startswith(f"job {rec['id']}: all_reduce starts")]
        assert sorted(d["rank"] for d in starts) == [0, 1]
        assert all(d["job"] == rec["id"] and isinstance(d["epoch"], int) for d in starts)
        assert all("op" not in d for d in starts)  # outside any collective: no op/seq


def test_json_escapes_untrusted_text_and_carries_exceptions() -> None:
    with captured("json") as out:
        log = logging.getLogger("netcoll.test")
        log.warning('evil "\x1b[31m\nline')
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    first, second = out.getvalue().splitlines()  # one object a line: the newline stayed escaped
    assert json.loads(first)["msg"] == 'evil "\x1b[31m\nline' and "\x1b" not in first
    assert "ValueError: boom" in json.loads(second)["exc"]


def test_text_lines_are_utc_with_context() -> None:
    with captured("text") as out, logs.bind(rank=3, job=9):
        logging.getLogger("netcoll.test").warning("hello")
    line = out.getvalue().strip()
    assert re.match(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING \[test\] netcoll.test: hello \(rank=3 job=9\)$", line
    )


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
    logs._handler = None


@pytest.mark.usefixtures("restore_logging")
def test_log_format_option_and_variable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NETCOLL_LOG_FORMAT", "xml")
    assert main(["status", "--coordinator", "127.0.0.1:1"]) == 2
    assert "log format must be one of text, json" in capsys.readouterr().err
    assert main(["status", "--log-format", "xml"]) == 2
    monkeypatch.setenv("NETCOLL_LOG_FORMAT", "text")
    assert main(["status", "--log-format", "json", "--coordinator", "127.0.0.1:1", "--connect-timeout", "1"]) == 1
    import os

    assert os.environ["NETCOLL_LOG_FORMAT"] == "json"  # passed on to the processes a command starts
    assert isinstance(logs._handler, logging.StreamHandler)
    assert isinstance(logs._handler.formatter, logs.JsonFormatter)
