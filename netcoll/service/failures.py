"""A failed job's one error, from its ranks' reports.

Every rank of a failed job reports its own error; said once per rank they
repeat each other ("job deadline passed on rank 0; ... on rank 1; ..."). So:

* when ranks timed out waiting (their reports carry ``waits``: what each
  waited for, in which operation, and what it heard from the others), the
  waits are merged, each rank's own word about itself first, and said once as
  a wait chain (:mod:`netcoll.waits`)::

      job deadline (300s) passed: deadlock: rank 0 in all_reduce #4 waits for rank 3,
          rank 3 in all_reduce #4 waits for rank 2, ...
      job deadline (300s) passed: rank 0 in all_reduce #4 waits for rank 3; rank 3 never
          delivered: not called yet, stuck, or too slow

* other errors are said once each with the ranks that had them ("ranks 0, 1:
  ..."), those caused elsewhere (aborted by another rank, a lost peer) only
  when nothing else is known.
"""

from __future__ import annotations

from typing import Any

from ..waits import Wait, from_rows, seconds, summary

#: errors that only echo another rank's failure
ECHOES = ("CollectiveAborted", "PeerLost")


def job_error(failures: dict[int, dict[str, Any]], deadline: float) -> list[str]:
    """The parts of a job's error from its failed ranks' reports (rank -> report)."""
    chain = wait_chain(failures, deadline)
    rest = {r: rep for r, rep in sorted(failures.items()) if not rep.get("waits")}
    primary = {r: rep for r, rep in rest.items() if rep.get("error_type") not in ECHOES}
    if chain is not None:
        return [chain, *grouped(primary)]
    return grouped(primary) or grouped(dict(list(rest.items())[:2]))


def wait_chain(failures: dict[int, dict[str, Any]], deadline: float) -> str | None:
    """``"job deadline (300s) passed: <the merged waits>"``, or None when no rank said
    what it waited for."""
    own: dict[int, list[Wait]] = {}
    heard: list[Wait] = []
    for r, rep in sorted(failures.items()):
        for w in from_rows(rep.get("waits")):
            if w.rank == r:
                own.setdefault(r, []).append(w)
            else:
                heard.append(w)
    merged = [w for ws in own.values() for w in ws]
    told: set[int] = set()
    for w in heard:  # another's account of a rank that did not report its own wait
        if w.rank not in own and w.rank not in told:
            told.add(w.rank)
            merged.append(w)
    if not merged:
        return None
    return f"job deadline ({seconds(deadline)}s) passed: {summary(merged).text()}"


def grouped(reports: dict[int, dict[str, Any]]) -> list[str]:
    """``"rank 2: <error>"``, or ``"ranks 0, 1, 3: <error>"`` for an error several had."""
    ranks: dict[str, list[int]] = {}
    for r, rep in sorted(reports.items()):
        ranks.setdefault(str(rep.get("error")), []).append(r)
    return [
        f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(str(r) for r in rs)}: {error}" for error, rs in ranks.items()
    ]


__all__ = ["ECHOES", "grouped", "job_error", "wait_chain"]
