"""One benchmark rank as its own OS process (started by :mod:`netcoll.bench.local`).

    python -m netcoll.bench.worker --address HOST:PORT --world-size N --rank R --config JSON

Joins the group at the coordinator, runs :func:`netcoll.bench.sweep.run_sweep`
and writes JSON lines on stdout: ``{"event": "hello", ...}`` once, then on
rank 0 ``start`` / ``row`` events as the sweep goes, and finally
``{"event": "done"}`` (or ``{"event": "error", ...}`` with exit code 1).

The worker exits as soon as its standard input reaches end-of-file, so it never
outlives the runner that started it (even one killed with SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
import traceback
from typing import Any


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _die_with_parent() -> None:
    """Exit when stdin closes: the runner went away, however it went."""

    def watch() -> None:
        try:
            while os.read(0, 65536):  # the raw fd: no buffered-reader lock held at shutdown
                pass
        except OSError:
            pass
        os._exit(70)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


async def _main(ns: argparse.Namespace) -> int:
    import netcoll

    from .common import SweepConfig
    from .sweep import peak_rss_bytes, run_sweep

    cfg = SweepConfig.from_json(json.loads(ns.config))
    try:
        async with netcoll.connect(
            ns.address,
            world_size=ns.world_size,
            rank=ns.rank,
            group=ns.group,
            local_host=ns.local_host,
            timeout=ns.connect_timeout,
            segment_bytes=cfg.segment_bytes,
        ) as comm:
            _emit(
                {
                    "event": "hello",
                    "rank": comm.rank,
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "loop": _loop_name(asyncio.get_running_loop()),
                    "rss_bytes": peak_rss_bytes(),
                }
            )
            await run_sweep(comm, cfg, on_event=_emit)
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which names the rank
        _emit(
            {
                "event": "error",
                "rank": ns.rank,
                "error": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc()[-4000:],
            }
        )
        return 1
    _emit({"event": "done", "rank": ns.rank})
    return 0


def _loop_name(loop: asyncio.AbstractEventLoop) -> str:
    from ..loop import SpinSelector

    if isinstance(getattr(loop, "_selector", None), SpinSelector):
        return "spin"
    return type(loop).__module__.split(".")[0]


def new_event_loop(name: str) -> asyncio.AbstractEventLoop:
    """The rank's event loop: ``spin`` (default, also ``auto``), ``asyncio`` or ``uvloop``."""
    from ..loop import new_event_loop as make

    try:
        return make(name)
    except ValueError as exc:
        raise SystemExit(f"--loop {name}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m netcoll.bench.worker", description=__doc__.split("\n")[0]
    )
    p.add_argument("--address", required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--group", default="bench")
    p.add_argument("--local-host", default="127.0.0.1")
    p.add_argument("--connect-timeout", type=float, default=60.0)
    p.add_argument("--loop", default="auto", choices=("auto", "spin", "asyncio", "uvloop"))
    p.add_argument("--config", required=True, help="SweepConfig as JSON")
    p.add_argument("--no-parent-watch", action="store_true", help="keep running when stdin closes")
    ns = p.parse_args(argv)
    if not ns.no_parent_watch:
        _die_with_parent()
    with asyncio.Runner(loop_factory=lambda: new_event_loop(ns.loop)) as runner:
        return runner.run(_main(ns))


if __name__ == "__main__":
    sys.exit(main())
