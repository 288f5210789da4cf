"""The partial all_reduce's agreement explored over seeded schedules (in-memory mesh):
random delays on every DATA frame and every proposal, a victim that dies at a random
point (before calling, after delivering to some peers only, even part of its segments,
or in the middle of the agreement: just before or just after its proposal reaches the
decider), and a late rank held by an event until the others have ended.

Whatever the schedule: every rank that returns returns the same bits and the same
contributors, the fold of the contributors' inputs in rank order; a rank that fails
fails with PartialExcluded (not a contributor) or PartialMismatch (a contributor's data
never reached it); with no late rank, every survivor is a contributor. A failure
prints its seed (replay: SEEDS = [seed])."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import numpy as np
import pytest

from netcoll.comm import Communicator
from netcoll.errors import PartialExcluded, PartialMismatch
from netcoll.mesh.channel import Decide
from netcoll.mesh.inprocess import InProcessMesh, MemoryHub
from netcoll.ops import ReduceOp, reduce_into
from netcoll.wire import Kind

SEEDS = range(80)
SEGMENT = 1024  # 1000 float32: 4 segments per peer
FRAMES = 4  # frames per peer (1000 float32 in segments of SEGMENT bytes)
#: when the victim dies: before calling; once it sent its allowance to each peer (some
#: peers get all its segments, some part, some none); just before or just after its
#: proposal reaches the decider; or never: its stalled frames stay stalled (a partition)
KILL_POINTS = ("before", "sending", "proposing", "proposed", "partition")


class Schedule:
    """One seed's choices: world size, victim and when it dies, late rank, delays."""

    def __init__(self, seed: int) -> None:
        rng = self.rng = random.Random(seed)
        self.n = rng.choice([3, 4, 5])
        self.victim = rng.choice([None, *range(self.n)])
        self.kill_at = rng.choice(KILL_POINTS)
        others = [r for r in range(self.n) if r != self.victim]
        self.late = rng.choice([None, None, *others]) if len(others) > 2 else None
        #: frames the victim gets to send to each peer before its sends stall (then it dies)
        self.allowed = {p: rng.randint(0, FRAMES) for p in range(self.n) if p != self.victim}
        partitioned = self.victim is not None and self.kill_at == "partition"
        self.window = 0.3 if self.late is not None or partitioned else 30.0
        self.stall = asyncio.Event()

    def describe(self, seed: int) -> str:
        return (
            f"seed {seed}: n={self.n} victim={self.victim} kill_at={self.kill_at} late={self.late} "
            f"allowed={self.allowed}"
        )


def delay_sends(mesh: InProcessMesh, s: Schedule, hub: MemoryHub) -> None:
    """Random delays on ``mesh``'s DATA frames; the victim's stall past its allowance, and
    it dies once it has sent what it may (kill point ``sending``)."""
    send, sent = mesh.send, dict.fromkeys(s.allowed, 0)
    stall = s.stall  # set when the victim dies: until then, a frame it never gets out
    mesh.send_nowait = lambda *a: False  # type: ignore[method-assign]  # every frame through send()

    async def delayed(peer: int, kind: Kind, header: dict[str, Any], payload: memoryview | None = None) -> None:
        if kind is Kind.DATA:
            await asyncio.sleep(s.rng.choice([0, 0, 0.001, 0.003]))
            if mesh.rank == s.victim and s.kill_at in ("sending", "partition"):
                if sent[peer] >= s.allowed[peer]:
                    await stall.wait()
                sent[peer] += 1
                await send(peer, kind, header, payload)
                if s.kill_at == "sending" and all(sent[p] >= s.allowed[p] for p in s.allowed):
                    hub.kill(mesh.rank)
                return
        await send(peer, kind, header, payload)

    mesh.send = delayed  # type: ignore[method-assign]


def delay_decisions(mesh: InProcessMesh, s: Schedule, hub: MemoryHub, shared: Decide) -> None:
    """Random delays before each proposal; the victim dies just before or after its own."""

    async def decide(group: str, seq: int, proposal: tuple[int, ...], timeout: float) -> tuple[int, ...]:
        await asyncio.sleep(s.rng.choice([0, 0.001, 0.005]))
        if mesh.rank == s.victim and s.kill_at == "proposing":
            hub.kill(mesh.rank)
            raise ConnectionError("died before its proposal reached the decider")
        agreed = await shared(group, seq, proposal, timeout)
        if mesh.rank == s.victim and s.kill_at == "proposed":
            hub.kill(mesh.rank)
        return agreed

    mesh.decider = decide


def reference(xs: list[np.ndarray], contributors: tuple[int, ...]) -> np.ndarray:
    acc = xs[contributors[0]].copy()
    for p in contributors[1:]:
        reduce_into(ReduceOp.SUM, acc, xs[p])
    return acc


async def play(seed: int) -> float:
    s = Schedule(seed)
    t0 = asyncio.get_running_loop().time()
    hub = MemoryHub(s.n)
    shared = hub.decider
    for mesh in hub.meshes:
        delay_sends(mesh, s, hub)
        delay_decisions(mesh, s, hub, shared)
    comms = [Communicator(m, segment_bytes=SEGMENT) for m in hub.meshes]
    xs = [np.random.default_rng(seed * 10 + r).standard_normal(1000).astype(np.float32) for r in range(s.n)]
    if s.victim is not None and s.kill_at == "before":
        hub.kill(s.victim)
    elif s.victim is not None and s.kill_at == "sending" and not any(s.allowed.values()):
        hub.kill(s.victim)  # (it may send nothing: dead before its first frame)
    on_time_done = asyncio.Event()

    async def rank(c: Communicator) -> Any:
        if c.rank == s.late:
            await on_time_done.wait()
        if c.rank == s.victim and s.kill_at == "before":
            return "dead"
        work = c.all_reduce(xs[c.rank], partial=True, timeout=s.window)
        try:
            return await work, work.contributors
        except Exception as exc:  # noqa: BLE001 - judged below
            return exc

    tasks = {c.rank: asyncio.ensure_future(rank(c)) for c in comms}
    survivors = [r for r in tasks if r not in (s.late, s.victim)]
    async with asyncio.timeout(120):
        await asyncio.gather(*(tasks[r] for r in survivors))
        on_time_done.set()
        if s.late is not None:
            await tasks[s.late]
        if s.victim is not None:
            hub.kill(s.victim)  # (a partitioned victim may wait for its stalled sends: it dies now)
            s.stall.set()
            await tasks[s.victim]
    outcome = {r: t.result() for r, t in tasks.items()}
    judge(s, xs, outcome)
    return asyncio.get_running_loop().time() - t0


def judge(s: Schedule, xs: list[np.ndarray], outcome: dict[int, Any]) -> None:
    returned = {r: v for r, v in outcome.items() if isinstance(v, tuple) and r != s.victim}
    agreed = {v[1] for v in returned.values()}
    assert len(agreed) <= 1, f"different contributors: {outcome}"
    if returned:
        (w,) = agreed
        want = reference(xs, w).tobytes()
        assert all(v[0].tobytes() == want for v in returned.values()), "a result differs from the agreed fold"
        assert set(returned) <= set(w)
    for r, v in outcome.items():
        if r == s.victim or isinstance(v, tuple):
            continue
        assert isinstance(v, (PartialExcluded, PartialMismatch)), f"rank {r}: {v!r}"
        if isinstance(v, PartialExcluded):
            assert r not in v.ranks
        else:
            assert r not in v.ranks and set(v.ranks) <= {s.victim}, f"rank {r}: {v!r}"
    if s.late is None and s.window > 1:  # (no window short enough to leave out a rank on time)
        survivors = set(outcome) - {s.victim}
        for r in survivors:
            assert not isinstance(outcome[r], PartialExcluded), f"rank {r} excluded with no late rank: {outcome}"


@pytest.mark.parametrize("seed", SEEDS)
async def test_every_rank_that_returns_agrees(seed: int) -> None:
    try:
        await play(seed)
    except BaseException:
        print(Schedule(seed).describe(seed))
        raise
