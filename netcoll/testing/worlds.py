"""Explorer configurations, verdicts and replay commands, and the in-memory world.

A :class:`Config` says where a program runs: how many ranks, over which links
(``memory``: the in-process mesh, tasks in this loop; ``tcp`` or ``shm``:
one process per rank, :mod:`.processes`), on which event loop (``asyncio`` or
``netcoll``'s, :func:`netcoll.loop.run`; processes only) and with the tuning
machinery on (the cost model calibrated, refining every few calls: agreements,
deferred calls and trials mid-program) or off. :func:`judge` turns the ranks'
reports of one seed into a :class:`Verdict`, whose :meth:`~Verdict.text` gives
the seed, the command that replays it and the program.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..comm import Communicator
from ..errors import CollectiveError
from ..links.factory import DEFAULT_WINDOW
from ..mesh.inprocess import MemoryHub
from . import fixed
from .program import Program, generate
from .schedule import RankReport, Runner

LINKS = ("memory", "tcp", "shm")
LOOPS = ("asyncio", "netcoll")
COMMAND = "python3 bench/explore.py"
SCENARIOS = ("explore", *fixed.SCENARIOS)  # a seed's program, or one of issue 34's (:mod:`.fixed`)


@dataclass(frozen=True)
class Config:
    """Where programs run (see the module docstring). ``timeout``: each collective's
    deadline in seconds (a hang shows as its timeout); ``steps``: programs of this
    length (else 3 to 16 steps)."""

    ranks: int
    links: str = "memory"
    loop: str = "asyncio"
    tuning: bool = False
    steps: int | None = None
    timeout: float = 20.0
    scenario: str = "explore"
    window: int | None = None  # every link's receive window (NETCOLL_RECV_WINDOW), bytes
    segment: int | None = None  # the communicators' segment size, bytes
    env: tuple[tuple[str, str], ...] = ()  # more NETCOLL_* settings for rank processes

    def __post_init__(self) -> None:
        if self.links not in LINKS or self.loop not in LOOPS or self.ranks < 1 or self.scenario not in SCENARIOS:
            raise ValueError(
                f"bad explorer config {self}: links one of {LINKS}, loop one of {LOOPS}, ranks >= 1, "
                f"scenario one of {', '.join(SCENARIOS)}"
            )

    @property
    def name(self) -> str:
        where = self.links if self.links == "memory" else f"{self.links}/{self.loop}"
        what = "" if self.scenario == "explore" else f"{self.scenario}: "
        more = f" window {self.window}" * (self.window is not None) + f" segment {self.segment}" * bool(self.segment)
        more += "".join(f" {k}={v}" for k, v in self.env)
        return f"{what}{self.ranks} ranks {where} tuning {'on' if self.tuning else 'off'}{more}"

    def program(self, seed: int) -> Program:
        return generate(seed, self.ranks, tuning=self.tuning, steps=self.steps)

    def command(self, seeds: Sequence[int]) -> str:
        """The command line that runs ``seeds`` in one world again, as this config."""
        seed = f"--seed {seeds[0]}" if len(seeds) == 1 else f"--seeds {','.join(map(str, seeds))}"
        args = f"{seed} --ranks {self.ranks} --links {self.links} --tuning {'on' if self.tuning else 'off'}"
        if self.links != "memory":
            args += f" --loop {self.loop} --per-world {len(seeds)}"
        args += f" --steps {self.steps}" * (self.steps is not None) + f" --timeout {self.timeout:g}"
        args += f" --scenario {self.scenario}" * (self.scenario != "explore")
        args += f" --window {self.window}" * (self.window is not None)
        args += f" --segment {self.segment}" * (self.segment is not None)
        args += "".join(f" --env {k}={v}" for k, v in self.env)
        return f"{COMMAND} {args}"


@dataclass
class Verdict:
    """One seed's outcome in one config: ``failures`` empty when every rank got
    exactly what it had to. ``world``: the seeds run in the same world, in order
    (state such as the cost model's carries from one to the next)."""

    seed: int
    config: Config
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    world: tuple[int, ...] = ()
    model_ops: int = 0  # the cost model's operations the world group issued during this seed

    @property
    def ok(self) -> bool:
        return not self.failures

    def text(self) -> str:
        """The failure report: seed, replay command(s), what failed, the program."""
        lines = [f"FAILED seed {self.seed} ({self.config.name})", f"  replay: {self.config.command([self.seed])}"]
        if len(self.world) > 1:
            lines.append(f"  replay its world: {self.config.command(self.world)}")
        lines += [f"  {f}" for f in self.failures[:40]]
        if len(self.failures) > 40:
            lines.append(f"  ... and {len(self.failures) - 40} more")
        if self.config.scenario == "explore":
            lines.append(self.config.program(self.seed).describe())
        else:
            lines.append(f"scenario {self.config.scenario}, seed {self.seed} (netcoll.testing.fixed)")
        return "\n".join(lines)


def judge(seed: int, config: Config, reports: Sequence[RankReport], seconds: float = 0.0) -> Verdict:
    """The verdict on one seed from every rank's report: each rank's own failures,
    and results that must agree across ranks that do not (digests per step)."""
    failures = [f for r in reports for f in r.failures]
    steps: dict[int, dict[str, list[int]]] = {}
    for r in reports:
        for i, d in r.digests.items():
            steps.setdefault(i, {}).setdefault(d, []).append(r.rank)
    for i, by in sorted(steps.items()):
        if len(by) > 1:
            failures.append(f"#{i}: ranks got different results (ranks by result: {sorted(by.values())})")
    return Verdict(seed, config, failures, seconds, model_ops=max((r.model_ops for r in reports), default=0))


class Play(Protocol):
    """One rank's run of one seed: :meth:`run` it; ``where`` says what it does now."""

    where: str
    report: RankReport  # so far

    async def run(self) -> RankReport: ...


class _Fixed:
    def __init__(self, comm: Communicator, seed: int, scenario: str) -> None:
        self.comm, self.seed, self.scenario, self.where = comm, seed, scenario, f"running {scenario}"
        self.report = RankReport(seed, comm.rank)

    async def run(self) -> RankReport:
        self.report = await fixed.SCENARIOS[self.scenario](self.comm, self.seed)
        self.where = "done"
        return self.report


def play(comm: Communicator, seed: int, config: Config) -> Play:
    """World rank ``comm.rank``'s run of ``seed`` as ``config`` says (its program, or a fixed scenario)."""
    if config.scenario == "explore":
        return Runner(comm, config.program(seed))
    return _Fixed(comm, seed, config.scenario)


async def run_memory(seed: int, config: Config, *, limit: float | None = None) -> Verdict:
    """Run the program of ``seed`` on a fresh in-memory world of ``config.ranks``
    ranks, as tasks in this loop; the verdict. A rank still running after ``limit``
    seconds (default: twice the collective deadline, plus 10) is a hang, reported
    with where every rank was."""
    hub = MemoryHub(config.ranks, window=config.window or DEFAULT_WINDOW)
    comms = [Communicator(t, timeout=config.timeout, segment_bytes=config.segment) for t in hub.meshes]
    start = time.perf_counter()
    try:
        if config.tuning:  # what connect() does with NETCOLL_COST_MODEL=1
            with contextlib.suppress(CollectiveError):
                await asyncio.gather(*(c.calibrate() for c in comms))
        runners = [play(c, seed, config) for c in comms]
        try:
            async with asyncio.timeout(2 * config.timeout + 10 if limit is None else limit):
                reports = await asyncio.gather(*(r.run() for r in runners))
        except TimeoutError:
            where = [f"rank {r.report.rank}: {r.where}" for r in runners]
            failures = [f"HANG: no end after {limit or 2 * config.timeout + 10:g}s", *where]
            return Verdict(seed, config, [*failures, *(f for r in runners for f in r.report.failures)])
        return judge(seed, config, reports, time.perf_counter() - start)
    finally:
        for c in comms:
            await c.close()
        for t in hub.meshes:
            await t.close()


__all__ = ["COMMAND", "LINKS", "LOOPS", "SCENARIOS", "Config", "Play", "Verdict", "judge", "play", "run_memory"]
