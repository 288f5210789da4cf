"""Issue 34's "done when", over real processes: one process per rank, each joined with
``netcoll.connect`` at an in-process Coordinator from its own 127.0.0.x address, over
TCP and over shared memory, on the default asyncio loop and on netcoll's loop.

* Issue 34's two programs (:mod:`netcoll.testing.fixed`), in one world per case: two
  all_reduces in flight awaited in reverse on rank 0 (seeds 0-3: algorithm auto, ring,
  tree, doubling), and rounds of 4 mixed collectives awaited in a random order per rank.
* A fixed set of the schedule explorer's seeds (:mod:`netcoll.testing.explore`), with
  the tuning machinery on (calibrated when the group forms, refining every few calls)
  and off, several seeds per world.

A failure prints the seed and the command that replays it (``bench/explore.py``, which
also runs long explorations: docs in its header).
"""

from __future__ import annotations

import pytest

from netcoll.testing.processes import run_world
from netcoll.testing.worlds import Config

pytestmark = pytest.mark.tcp

LINKS_LOOPS = [(links, loop) for links in ("tcp", "shm") for loop in ("asyncio", "netcoll")]
RANKS = [3, 4, pytest.param(8, marks=pytest.mark.slow)]


async def _passes(config: Config, seeds: range) -> None:
    world = await run_world(config, seeds)
    failed = [v.text() for v in world.verdicts if not v.ok]
    assert not failed, "\n\n".join(failed)
    assert world.ok, f"only {len(world.verdicts)} of {len(seeds)} seeds ran"
    assert world.links == {r: [config.links] for r in range(config.ranks)}  # the links asked for, everywhere
    if config.scenario == "explore":
        assert (sum(v.model_ops for v in world.verdicts) > 0) == config.tuning


@pytest.mark.parametrize(("links", "loop"), LINKS_LOOPS)
@pytest.mark.parametrize("ranks", RANKS)
async def test_issue_34_programs(ranks: int, links: str, loop: str) -> None:
    """Per seed: 30 iterations of two all_reduces in flight, awaited in reverse on rank 0
    (seeds 0-3: algorithm auto, ring, tree, doubling), then 6 rounds of 4 mixed
    collectives awaited in a random order per rank."""
    await _passes(Config(ranks, links, loop, scenario="issue34"), range(4))


#: (ranks, links, loop, tuning): each world runs the same 12 seeds
EXPLORED = [
    (3, "tcp", "asyncio", False),
    (3, "shm", "netcoll", True),
    (4, "shm", "asyncio", False),
    (4, "tcp", "netcoll", True),
    pytest.param(8, "tcp", "asyncio", True, marks=pytest.mark.slow),
    pytest.param(8, "shm", "netcoll", False, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("ranks", "links", "loop", "tuning"), EXPLORED)
async def test_explorer_seeds_over_processes(ranks: int, links: str, loop: str, tuning: bool) -> None:
    await _passes(Config(ranks, links, loop, tuning), range(12))
