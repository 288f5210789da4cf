"""Rank output for ``netcoll run``: each line a rank writes, prefixed with its
rank and written whole, through one writer thread (so in order, and a stalled
reader of the launcher's output never blocks the launcher's event loop)."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Executor
from typing import BinaryIO

MAX_LINE = 1 << 20  # a longer run without a newline is cut into several prefixed lines


async def pump(stream: asyncio.StreamReader, out: BinaryIO, prefix: bytes, writer: Executor) -> None:
    """Copy ``stream`` to ``out`` line by line, each line prefixed and written whole.
    Writes go through ``writer`` (one thread, so in order): a stalled reader of our
    output (``| less``) then holds up the ranks' pipes, never the event loop that
    runs the coordinator."""
    loop = asyncio.get_running_loop()
    pending = b""
    while chunk := await stream.read(65536):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        while len(pending) > MAX_LINE:
            lines.append(pending[:MAX_LINE])
            pending = pending[MAX_LINE:]
        if lines:
            await loop.run_in_executor(writer, _write, out, b"".join(prefix + line + b"\n" for line in lines))
    if pending:
        await loop.run_in_executor(writer, _write, out, prefix + pending + b"\n")


async def pump_until_shutdown(stream: asyncio.StreamReader, out: BinaryIO, prefix: bytes, writer: Executor) -> None:
    with contextlib.suppress(RuntimeError):  # the writer was shut down: the launcher is exiting
        await pump(stream, out, prefix, writer)


def _write(out: BinaryIO, data: bytes) -> None:
    try:
        out.write(data)
        out.flush()
    except (BrokenPipeError, ValueError):  # our own output is gone: keep draining the rank's pipe
        pass


__all__ = ["MAX_LINE", "pump", "pump_until_shutdown"]
