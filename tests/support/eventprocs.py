"""Worker processes that print one JSON event a line (the elastic and partial process
tests): start one with the repository importable, read its events as they come, wait until
every process printed one of some events."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from tests.support.worlds import REPO


class Proc:
    """One worker process and the JSON events it printed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def first(self, *events: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e["event"] in events), None)

    def go(self) -> None:
        """Write ``go`` to its stdin (a worker started with ``stdin=True`` waits for it)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")


async def start(worker: str, *args: str, stdin: bool = False) -> Proc:
    """``python3 worker args...`` with this repository first on PYTHONPATH."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        worker,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin else None,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    return Proc(proc)


async def until(procs: list[Proc], *events: str) -> list[dict[str, Any]]:
    """Wait until every process printed one of ``events`` (a process that exits first fails the test)."""
    while True:
        found = [p.first(*events) for p in procs]
        if all(found):
            return [e for e in found if e is not None]
        for p, f in zip(procs, found, strict=True):
            assert p.proc.returncode is None or f, (events, p.proc.returncode, p.events)
        await asyncio.sleep(0.05)
