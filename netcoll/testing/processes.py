"""Explorer worlds of rank processes: one OS process per rank, each joined with
:func:`netcoll.connect` at an in-process :class:`netcoll.Coordinator` from its own
loopback address (127.0.0.2, .3, ...: standing in for hosts), over TCP
(``NETCOLL_TRANSPORT=tcp``) or shared memory (the default on one host), on the
default asyncio loop or on netcoll's (:func:`netcoll.loop.run`), with the cost
model on (``NETCOLL_COST_MODEL=1``: the group calibrates when it forms) or off.

:func:`run_world` runs several seeds one after the other in one world (the
ranks go on to the next seed as soon as they are done with one, so seeds overlap
too) and returns a verdict per seed. Each rank process is this module:

    python -m netcoll.testing.processes ADDRESS INDEX CONFIG_JSON SEEDS

which prints one JSON line when linked (``{"rank", "links"}``), one per seed
(``{"report": ...}``) and ``{"error": ...}`` if something escaped; it stops
after the first seed that failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import loop as loops
from ..rendezvous import Coordinator
from ..session import connect
from .schedule import RankReport
from .worlds import Config, Verdict, judge, play

STDERR_TAIL = 2000  # characters of a failing rank's stderr quoted in its verdict


@dataclass
class World:
    """What one world of processes did: a verdict per seed that ran (in order; the
    seeds after a failing one do not run), each rank's link kinds, its wall time."""

    config: Config
    seeds: tuple[int, ...]
    verdicts: list[Verdict] = field(default_factory=list)
    links: dict[int, list[str]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return len(self.verdicts) == len(self.seeds) and all(v.ok for v in self.verdicts)


def environment(config: Config) -> dict[str, str]:
    """The rank processes' environment for ``config`` (links, cost model, loop)."""
    env = dict(os.environ)
    env.pop("NETCOLL_TRANSPORT", None)
    if config.links == "tcp":
        env["NETCOLL_TRANSPORT"] = "tcp"
    env["NETCOLL_COST_MODEL"] = "1" if config.tuning else "0"
    env["NETCOLL_LOOP"] = "spin" if config.loop == "netcoll" else "asyncio"
    env.pop("NETCOLL_RECV_WINDOW", None)
    if config.window is not None:
        env["NETCOLL_RECV_WINDOW"] = str(config.window)
    env.update(config.env)
    return env


class _Rank:
    """One rank process seen from the parent: its JSON lines and its stderr's tail."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self.stderr = ""

    async def read(self, failed: asyncio.Event) -> None:
        assert self.proc.stdout is not None and self.proc.stderr is not None

        async def err() -> None:
            assert self.proc.stderr is not None
            async for raw in self.proc.stderr:
                self.stderr = (self.stderr + raw.decode(errors="replace"))[-4 * STDERR_TAIL :]

        errors = asyncio.ensure_future(err())
        async for raw in self.proc.stdout:
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                self.lines.append(line)
                if "error" in line or line.get("report", {}).get("failures"):
                    failed.set()
        await errors
        await self.proc.wait()
        if self.proc.returncode:
            failed.set()

    def reports(self) -> dict[int, RankReport]:
        return {r.seed: r for r in (RankReport.of(line["report"]) for line in self.lines if "report" in line)}

    def error(self) -> str | None:
        return next((line["error"] for line in self.lines if "error" in line), None)


async def run_world(config: Config, seeds: Sequence[int], *, limit: float | None = None) -> World:
    """Run ``seeds`` in one world of ``config.ranks`` processes (see the module docstring).
    Once a rank fails, the others get a collective deadline (plus 10 s) to end; after
    ``limit`` seconds in all (default: generous per seed) the world is a hang."""
    world = World(config, tuple(seeds))
    limit = limit or 60 + len(seeds) * (config.timeout + 30)
    start = time.perf_counter()
    failed = asyncio.Event()
    async with Coordinator() as coord:
        ranks = [
            _Rank(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    __name__,
                    coord.address,
                    str(i),
                    json.dumps(dataclasses.asdict(config)),
                    ",".join(map(str, seeds)),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env=environment(config),
                )
            )
            for i in range(config.ranks)
        ]
        reading = asyncio.gather(*(r.read(failed) for r in ranks))
        hang = await _wait(reading, failed, limit, config.timeout + 10)
        for r in ranks:
            if r.proc.returncode is None:
                r.proc.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reading, 10)
    world.seconds = time.perf_counter() - start
    world.links = {line["rank"]: line["links"] for r in ranks for line in r.lines if "links" in line}
    world.verdicts = _verdicts(config, world.seeds, ranks, hang, limit)
    return world


async def _wait(reading: asyncio.Future[Any], failed: asyncio.Event, limit: float, grace: float) -> bool:
    """Until every rank ended, or ``grace`` after one failed, or ``limit``; whether that was a hang."""
    deadline = time.monotonic() + limit
    failing = asyncio.ensure_future(failed.wait())
    try:
        done, _ = await asyncio.wait({reading, failing}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        if reading in done:
            return False
        if failing in done:
            await asyncio.wait({reading}, timeout=min(grace, max(0.0, deadline - time.monotonic())))
            return False
        return True
    finally:
        failing.cancel()


def _verdicts(config: Config, seeds: Sequence[int], ranks: list[_Rank], hang: bool, limit: float) -> list[Verdict]:
    out, by_rank = [], [r.reports() for r in ranks]
    for n, seed in enumerate(seeds):
        got = [reports[seed] for reports in by_rank if seed in reports]
        if len(got) == len(ranks):
            seconds = max(r.seconds for r in got)
            out.append(judge(seed, config, got, seconds))
            out[-1].world = tuple(seeds[: n + 1])
            if out[-1].ok:
                continue
            break
        failures = [f for r in got for f in r.failures]
        if hang:
            failures.insert(0, f"HANG: the world did not end within {limit:g}s")
        for i, r in enumerate(ranks):
            if seed not in by_rank[i]:
                said = r.error() or f"exit status {r.proc.returncode}"
                failures.append(f"process {i}: no report for this seed ({said}); its stderr ends:")
                failures += [f"    {line}" for line in r.stderr[-STDERR_TAIL:].splitlines()]
        out.append(Verdict(seed, config, failures, world=tuple(seeds[: n + 1])))
        break
    return out


# -- the rank process -------------------------------------------------------------------


def _emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


async def _rank(address: str, index: int, config: Config, seeds: list[int]) -> int:
    try:
        async with connect(
            address,
            world_size=config.ranks,
            local_host=f"127.0.0.{index + 2}",
            timeout=60,
            collective_timeout=config.timeout,
            segment_bytes=config.segment,
        ) as comm:
            _emit({"rank": comm.rank, "links": sorted({s["kind"] for s in comm.link_stats().values()})})
            for seed in seeds:
                report = await play(comm, seed, config).run()
                _emit({"report": report.as_dict()})
                if report.failures:
                    return 1
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the seed with it
        _emit({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


def main(argv: list[str]) -> int:
    """The rank process (see the module docstring)."""
    address, index, raw, seeds = argv
    fields = json.loads(raw)
    config = Config(**{**fields, "env": tuple(tuple(kv) for kv in fields["env"])})
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s [{index}] %(name)s %(levelname)s %(message)s")
    kind = "spin" if config.loop == "netcoll" else "asyncio"
    return loops.run(_rank(address, int(index), config, [int(s) for s in seeds.split(",") if s]), kind)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["World", "environment", "main", "run_world"]
