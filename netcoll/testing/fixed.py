"""Issue 34's two programs, as fixed scenarios of the explorer (every rank runs
one; the reports are judged like a seed's, :func:`.worlds.judge`).

* :func:`pair` — 30 iterations: rank 0 issues two all_reduces and awaits the
  second first, the others await each as they issue it (the README's "keep
  several in flight and await them in any order", which hung from 3 ranks).
  The seed picks the algorithm: ``auto``, ``ring``, ``tree``, ``doubling``.
* :func:`mixed` — rounds of 4 mixed collectives (all_reduce, all_gather,
  broadcast; 16 B to 1 MiB) issued on every rank and awaited in a different
  random order per rank.

:func:`issue34` runs both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from ..comm import Communicator
from ..errors import NetcollError
from ..operation import Work
from .schedule import RankReport, digest

PAIR_ALGORITHMS = ("auto", "ring", "tree", "doubling")
MIXED_KINDS = ("all_reduce", "all_gather", "broadcast")


def _values(seed: int, it: int, i: int, rank: int, count: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng([seed, it, i, rank]).integers(-8, 9, count).astype(np.float32)


async def pair(comm: Communicator, seed: int, iterations: int = 30) -> RankReport:
    """Issue 34's first program (see the module docstring)."""
    report = RankReport(seed, comm.rank)
    algo: Any = PAIR_ALGORITHMS[seed % len(PAIR_ALGORITHMS)]  # one of the Literal names
    n = comm.world_size
    for it in range(iterations):
        xs = [[_values(seed, it, i, r, (1, 10)[i]) for r in range(n)] for i in (0, 1)]
        x1, x10 = xs[0][comm.rank], xs[1][comm.rank]
        try:
            if comm.rank == 0:
                a, b = comm.all_reduce(x1, algorithm=algo), comm.all_reduce(x10, algorithm=algo)
                vb = await b
                va = await a
            else:
                va = await comm.all_reduce(x1, algorithm=algo)
                vb = await comm.all_reduce(x10, algorithm=algo)
        except NetcollError as exc:
            report.failures.append(f"rank {comm.rank}: iteration {it} ({algo}): {type(exc).__name__}: {exc}")
            return report
        for i, got in enumerate((va, vb)):
            want = np.sum(xs[i], axis=0, dtype=np.float32)
            _check(report, 2 * it + i, f"iteration {it} all_reduce x{(1, 10)[i]} ({algo})", got, want)
            report.digests[2 * it + i] = digest(got.tobytes())
    return report


async def mixed(comm: Communicator, seed: int, rounds: int = 6) -> RankReport:
    """Issue 34's second program (see the module docstring)."""
    report, n, me = RankReport(seed, comm.rank), comm.world_size, comm.rank
    calls = np.random.default_rng([seed, 34])  # the same on every rank
    order = np.random.default_rng([seed, 34, me])  # this rank's own
    for it in range(rounds):
        plan: list[tuple[str, int, int]] = []
        for _ in range(4):
            kind = MIXED_KINDS[int(calls.integers(3))]
            count = max(4, int(2 ** calls.uniform(4, 20))) // 4
            plan.append((kind, count, int(calls.integers(n))))
        works: list[tuple[Work, Callable[[], Any], str]] = []
        for i, (kind, count, root) in enumerate(plan):
            xs = [_values(seed, it, i, r, count) for r in range(n)]
            what = f"round {it} call {i}: {kind} float32[{count}]" + f" root={root}" * (kind == "broadcast")
            if kind == "all_reduce":
                works.append((comm.all_reduce(xs[me]), _const(np.sum(xs, axis=0, dtype=np.float32)), what))
            elif kind == "all_gather":
                works.append((comm.all_gather(xs[me]), _const(np.stack(xs)), what))
            else:
                works.append((comm.broadcast(xs[root] if me == root else None, root), _const(xs[root]), what))
        for j in order.permutation(4):
            work, want, what = works[int(j)]
            try:
                got = await work
            except NetcollError as exc:
                report.failures.append(f"rank {me}: {what}: {type(exc).__name__}: {exc}")
                return report
            _check(report, 4 * it + int(j), what, got, want())
    return report


def _const(value: Any) -> Callable[[], Any]:
    return lambda: value


def _check(report: RankReport, index: int, what: str, got: Any, want: Any) -> None:
    want = np.asarray(want, np.float32)
    if (
        not isinstance(got, np.ndarray)
        or got.dtype != want.dtype
        or got.shape != want.shape
        or got.tobytes() != want.tobytes()
    ):
        report.failures.append(f"rank {report.rank}: #{index} {what}: WRONG VALUE: got {got!r:.200}")


async def issue34(comm: Communicator, seed: int) -> RankReport:
    """Both programs, one after the other (one world runs both: half the processes)."""
    report = await pair(comm, seed)
    if report.failures:
        return report
    second = await mixed(comm, seed)
    report.failures += second.failures
    report.digests.update({MIXED_DIGESTS + k: v for k, v in second.digests.items()})
    return report


MIXED_DIGESTS = 1000  # where :func:`issue34` numbers the second program's calls
SCENARIOS: dict[str, Callable[[Communicator, int], Awaitable[RankReport]]] = {
    "issue34": issue34,
    "pair": pair,
    "mixed": mixed,
}

__all__ = ["MIXED_KINDS", "PAIR_ALGORITHMS", "SCENARIOS", "issue34", "mixed", "pair"]
