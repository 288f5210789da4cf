"""The schedule explorer: does "keep several operations in flight and await them
in any order" hold, for any program, schedule, world size, link kind and loop?

Each seed is a random program every rank runs alike (:mod:`.program`): up to sixteen
operations issued in one order — every collective, send/receive pairs,
sub-groups from ``split``, mixed dtypes, reduction ops, sizes from 0 bytes to a
few MiB, algorithm ``auto`` or a fixed one, now and then a cancel — awaited in a
per-rank random order with random delays (:mod:`.schedule`), every result
checked against numpy (:mod:`.reference`). A failure (a wrong value, an
unexpected error, a hang) prints its seed, the command that replays it and the
program. The same seed gives the same program and the same per-rank schedule
every time; what the event loop and the links do in between is the schedule
being explored.

    python3 bench/explore.py --ranks 3,4,8 --links tcp,shm --loop asyncio,netcoll --seeds 0:500
    python3 -m netcoll.testing.explore --seed 17 --ranks 4 --links memory --tuning on

In code: :func:`run_memory` (one seed, an in-memory world in this loop),
:func:`explore` (seeds in one config, memory or processes: :mod:`.processes`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .. import loop as loops
from ..sizes import size_arg
from .processes import run_world
from .worlds import LINKS, LOOPS, SCENARIOS, Config, Verdict, run_memory

PER_WORLD = 10  # seeds run one after the other in one world of processes


@dataclass
class Tally:
    """One config's run: how many seeds passed, the failures, the wall time."""

    config: Config
    passed: int = 0
    failed: list[Verdict] = field(default_factory=list)
    seconds: float = 0.0
    model_ops: int = 0  # the cost model's operations issued in the world groups (tuning on)

    def line(self) -> str:
        rate = (self.passed + len(self.failed)) / self.seconds if self.seconds else 0.0
        bad = f", FAILED {len(self.failed)} (seeds {', '.join(str(v.seed) for v in self.failed)})" * bool(self.failed)
        model = f", {self.model_ops} model operations" * bool(self.model_ops)
        return f"{self.config.name}: {self.passed} seeds passed{bad} in {self.seconds:.1f}s ({rate:.1f} seeds/s{model})"


async def explore(
    config: Config,
    seeds: Sequence[int],
    *,
    per_world: int = PER_WORLD,
    stop: bool = False,
    report: Callable[[Verdict], None] | None = None,
) -> Tally:
    """Run ``seeds`` as ``config`` says; every verdict goes to ``report`` as it comes.
    Processes: ``per_world`` seeds per world; after a failing seed, the rest of its
    world's seeds run in a new world. ``stop``: return at the first failure."""
    tally, start = Tally(config), time.perf_counter()
    todo = list(seeds)
    while todo:
        if config.links == "memory":
            verdicts = [await run_memory(todo[0], config)]
        else:
            verdicts = (await run_world(config, todo[:per_world])).verdicts
            if not verdicts:  # (a world always judges its first seed; defensive)
                verdicts = [Verdict(todo[0], config, ["the world ran no seed"])]
        for v in verdicts:
            tally.model_ops += v.model_ops
            if report is not None:
                report(v)
            if v.ok:
                tally.passed += 1
            else:
                tally.failed.append(v)
        todo = todo[len(verdicts) :]
        if stop and tally.failed:
            break
    tally.seconds = time.perf_counter() - start
    return tally


def parse_seeds(text: str) -> list[int]:
    """``"0:500"``, ``"3,17,40"`` or both (``"0:10,99"``)."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if ":" in part:
            a, b = part.split(":", 1)
            out += range(int(a), int(b))
        else:
            out.append(int(part))
    return out


def _names(text: str, choices: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in choices]
    if bad or not names:
        raise SystemExit(f"--{what}: choose from {', '.join(choices)} (comma-separated), got {text!r}")
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="explore", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", default="3", help="world sizes, comma-separated (default 3)")
    p.add_argument("--links", default="memory", help=f"{', '.join(LINKS)}; comma-separated (default memory)")
    p.add_argument("--loop", default="asyncio", help=f"{', '.join(LOOPS)}; comma-separated (default asyncio)")
    p.add_argument("--tuning", default="off", help="on, off or on,off: the cost model and its agreements")
    p.add_argument("--seeds", default="0:100", help="seeds: 0:500, or 3,17,40 (default 0:100)")
    p.add_argument("--seed", type=int, help="one seed (replaces --seeds)")
    p.add_argument("--steps", type=int, help="operations per program (default: 3 to 16 by seed)")
    p.add_argument("--timeout", type=float, default=20.0, help="each collective's deadline, s (default 20)")
    p.add_argument("--per-world", type=int, default=PER_WORLD, help="seeds per world of processes (default 10)")
    p.add_argument("--scenario", default="explore", choices=SCENARIOS, help="a seed's program, or issue 34's")
    p.add_argument("--window", type=size_arg, help="every link's receive window (e.g. 64K; default 64 MiB)")
    p.add_argument("--segment", type=size_arg, help="the communicators' segment size (e.g. 16K; default 4 MiB)")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for rank processes (repeatable)")
    p.add_argument("--stop", action="store_true", help="stop at the first failure")
    p.add_argument("--show", action="store_true", help="print each seed's program before running it")
    p.add_argument("--json", help="write the summary and every failure here")
    p.add_argument("-v", "--verbose", action="store_true", help="netcoll's warnings too")
    return p


def configs(args: argparse.Namespace) -> list[Config]:
    """Every combination the arguments name (a memory world runs once per loop named)."""
    ranks = [int(r) for r in args.ranks.split(",") if r.strip()]
    tunings = [t == "on" for t in _names(args.tuning, ("on", "off"), "tuning")]
    combos = itertools.product(ranks, _names(args.links, LINKS, "links"), _names(args.loop, LOOPS, "loop"), tunings)
    env = tuple((k, v) for k, _, v in (kv.partition("=") for kv in args.env))
    more = {"scenario": args.scenario, "window": args.window, "segment": args.segment, "env": env}
    return [Config(r, links, loop, tuning, args.steps, args.timeout, **more) for r, links, loop, tuning in combos]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); exit status 1 if any seed failed.
    Without ``-v`` netcoll logs only errors meanwhile (the logger is put back after)."""
    args = parser().parse_args(argv)
    logger = logging.getLogger("netcoll")
    level = logger.level
    if not args.verbose:
        logger.setLevel(logging.ERROR)
    try:
        return _main(args)
    finally:
        logger.setLevel(level)


def _main(args: argparse.Namespace) -> int:
    seeds = [args.seed] if args.seed is not None else parse_seeds(args.seeds)
    tallies: list[Tally] = []

    def report(v: Verdict) -> None:
        if not v.ok:
            print(v.text(), flush=True)

    for config in configs(args):
        if args.show:
            for seed in seeds:
                print(config.program(seed).describe() if config.scenario == "explore" else config.command([seed]))
        kind = "spin" if config.links == "memory" and config.loop == "netcoll" else "asyncio"
        tally = loops.run(explore(config, seeds, per_world=args.per_world, stop=args.stop, report=report), kind)
        tallies.append(tally)
        print(tally.line(), flush=True)
        if args.stop and tally.failed:
            break
    print("summary:\n" + "\n".join(f"  {t.line()}" for t in tallies))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([_summary(t) for t in tallies], f, indent=1)
    return 1 if any(t.failed for t in tallies) else 0


def _summary(t: Tally) -> dict[str, object]:
    return {
        "config": t.config.name,
        "passed": t.passed,
        "failed": [{"seed": v.seed, "replay": t.config.command([v.seed]), "text": v.text()} for v in t.failed],
        "seconds": round(t.seconds, 2),
    }


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["PER_WORLD", "Tally", "configs", "explore", "main", "parse_seeds", "run_memory"]
