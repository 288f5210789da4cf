"""The arrival board's rules, with injected reports at told times (no real timing):
healthy progress flags no one, however the heartbeats interleave; a rank is flagged
only when its last reports agree it has waited in one operation for the same ranks
with no data past the threshold; a cycle of such waits is named a deadlock."""

from __future__ import annotations

from typing import Any

from netcoll.rendezvous import board as arrivals
from netcoll.rendezvous.board import KEEP, Report

AFTER = 5.0  # the threshold (seconds without data)
STALE = 2.0


def _report(rank: int, at: float, ops: list[list[Any]], nxt: dict[str, int]) -> Report:
    rep = arrivals.parse({"rank": rank, "ops": ops, "next": nxt}, at)
    assert rep is not None
    return rep


def _history(rank: int, beats: list[tuple[float, list[list[Any]], dict[str, int]]]) -> Report:
    """A rank's reports in order, each following the one before (as the coordinator keeps them)."""
    rep = None
    for at, ops, nxt in beats:
        rep = arrivals.follow(rep, _report(rank, at, ops, nxt))
    assert rep is not None
    return rep


def _op(seq: int, age: float, idle: float, waiting: list[int], members: tuple[int, ...] = (0, 1, 2)) -> list[Any]:
    return ["default", seq, "all_reduce", "fp", age, list(members), waiting, idle, waiting]


def _waiting_in(seq: int, waiting: list[int], times: list[float], start: float) -> list[Any]:
    """Beats of a rank that has sat in ``seq`` since ``start`` with nothing received."""
    return [(t, [_op(seq, t - start, t - start, waiting)], {"default": seq + 1}) for t in times]


def test_healthy_progress_flags_no_one_whatever_the_interleaving() -> None:
    """The issue's case: rank 0 seen in #675 a moment ago, rank 1's last beat in #633."""
    ring = {0: [2], 1: [0], 2: [1]}
    reports = []
    for r in range(3):
        beats = []
        for k in range(KEEP + 2):
            t = 100.0 + k + 0.3 * r
            seq = 600 + 11 * k + 3 * r
            beats.append((t, [_op(seq, 0.1, 0.02, ring[r])], {"default": seq}))
        reports.append(_history(r, beats))
    assert arrivals.build(reports, 105.0, STALE, AFTER) == []
    # a long healthy operation: the same ranks awaited in every beat, but data keeps arriving
    slow = [
        _history(r, [(t, [_op(9, t - 80, 0.4, ring[r])], {"default": 10}) for t in (100, 101, 102)]) for r in range(3)
    ]
    assert arrivals.build(slow, 102.5, STALE, AFTER) == []


def test_a_wait_is_flagged_once_its_last_reports_agree_past_the_threshold() -> None:
    times = [106.0, 107.0, 108.0]  # in #1 since 100: no data for 6, 7, 8 s
    reports = [
        _history(0, _waiting_in(1, [2], times, 100.0)),
        _history(1, _waiting_in(1, [0], times, 100.0)),
        _history(2, [(t, [], {"default": 1}) for t in times]),  # idle after #0
    ]
    board = arrivals.build(reports, 108.5, STALE, AFTER)
    assert [(r["seq"], r["arrived"]) for r in board] == [(1, [0, 1])]
    assert board[0]["stuck"] == [
        {"rank": 0, "waiting": [2], "idle_s": 8.0},
        {"rank": 1, "waiting": [0], "idle_s": 8.0},
    ]
    assert arrivals.lines(board) == [
        "all_reduce #1 (group default, running 8.5s): waiting for rank 2 (has not called it: idle after #0; "
        "last heartbeat 0.5s ago); arrived: ranks 0, 1"
    ]
    # two agreeing reports are not enough, nor three of which one came before the threshold
    early = [_history(0, _waiting_in(1, [2], times[1:], 100.0)), *reports[1:]]
    (row,) = arrivals.build(early, 108.5, STALE, AFTER)
    assert row["stuck"] == [{"rank": 1, "waiting": [0], "idle_s": 8.0}]  # rank 0: two reports only
    young = [_history(r, _waiting_in(1, [(r - 1) % 3], [104.0, 105.5, 106.5], 100.0)) for r in (0, 1)]
    assert arrivals.build([*young, reports[2]], 107.0, STALE, AFTER) == []


def test_a_wait_that_changes_or_receives_is_not_flagged() -> None:
    moving = [(106.0, [_op(1, 6, 6, [2])], {}), (107.0, [_op(1, 7, 7, [1])], {}), (108.0, [_op(1, 8, 8, [2])], {})]
    fed = [(106.0, [_op(1, 6, 6, [2])], {}), (107.0, [_op(1, 7, 0.2, [2])], {}), (108.0, [_op(1, 8, 8, [2])], {})]
    other = [(106.0, [_op(1, 6, 6, [2])], {}), (107.0, [_op(2, 1, 1, [2])], {}), (108.0, [_op(1, 8, 8, [2])], {})]
    for beats in (moving, fed, other):
        assert arrivals.build([_history(0, beats)], 108.5, STALE, AFTER) == [], beats


def test_a_rank_is_named_missing_only_on_a_report_taken_once_the_wait_was_stuck() -> None:
    times = [106.0, 107.0, 108.0]
    stuck = _history(0, _waiting_in(1, [1, 2], times, 100.0))
    before = _history(1, [(105.0, [], {"default": 1})])  # its last beat came before the evidence
    before.seen = 108.4  # (heard since: not stale)
    after = _history(2, [(108.2, [], {"default": 1})])
    (row,) = arrivals.build([stuck, before, after], 108.5, STALE, AFTER)
    assert [m["rank"] for m in row["missing"]] == [2]
    assert row["arrived"] == [0]


def test_a_cycle_of_stuck_waits_in_one_operation_is_a_deadlock() -> None:
    """Issue 38's large all_reduce: every rank arrived, each waits for the next."""
    times = [110.0, 111.0, 112.0]
    members = (0, 1, 2, 3)
    reports = []
    for r in members:
        beats = [(t, [_op(0, t - 100, t - 104, [(r - 1) % 4], members)], {"default": 1}) for t in times]
        reports.append(_history(r, beats))
    board = arrivals.build(reports, 112.5, STALE, AFTER)
    assert arrivals.lines(board) == [
        "deadlock: rank 0 in all_reduce #0 waits for rank 3, rank 3 in all_reduce #0 waits for rank 2, "
        "rank 2 in all_reduce #0 waits for rank 1, rank 1 in all_reduce #0 waits for rank 0",
        "all_reduce #0 (group default, running 12.5s): every rank arrived (ranks 0, 1, 2, 3); no data for 8s: "
        "rank 0 waits for rank 3, rank 1 waits for rank 0, rank 2 waits for rank 1, rank 3 waits for rank 2",
    ]


def test_a_deadlock_across_operations_and_groups_names_both() -> None:
    times = [106.0, 107.0, 108.0]
    p2p = ["default/p2p/0/0>1", 0, "recv", "p2p", 0.0, [0, 1], [0], 0.0, [0]]

    def recv(t: float) -> list[Any]:
        return [*p2p[:4], t - 100, p2p[5], p2p[6], t - 100, p2p[8]]

    reports = [
        _history(0, _waiting_in(1, [1], times, 100.0)),
        _history(1, [(t, [recv(t)], {"default": 1}) for t in times]),
    ]
    text = arrivals.lines(arrivals.build(reports, 108.5, STALE, AFTER))
    assert text[0] == "deadlock: rank 0 in all_reduce #1 waits for rank 1, rank 1 in recv #0 waits for rank 0"


def test_reports_of_older_ranks_are_read_by_their_running_time() -> None:
    old = [[*_op(1, t - 100, 0, [2])[:7]] for t in (106.0, 107.0, 108.0)]
    rep = _history(0, [(t, [row], {}) for t, row in zip((106.0, 107.0, 108.0), old, strict=True)])
    (row,) = arrivals.build([rep], 108.5, STALE, AFTER)
    assert row["stuck"] == [{"rank": 0, "waiting": [2], "idle_s": 8.0}] and row["deadlock"] is None


def test_a_mismatch_shows_at_once() -> None:
    a = _report(0, 100.0, [["default", 0, "reduce", "root=0", 0.1, [0, 1], [1], 0.1, [1]]], {})
    b = _report(1, 100.0, [["default", 0, "reduce", "root=1", 0.1, [0, 1], [0], 0.1, [0]]], {})
    (row,) = arrivals.build([a, b], 100.2, STALE, AFTER)
    assert row["mismatch"] and row["stuck"] == []


def test_malformed_new_fields_drop_the_report() -> None:
    assert arrivals.parse({"rank": 0, "ops": [[*_op(1, 1, "x", [2])]]}, 0.0) is None
    assert arrivals.parse({"rank": 0, "ops": [[*_op(1, 1, 1, [2])[:8], ["2"]]]}, 0.0) is None
    assert arrivals.parse({"rank": 0, "ops": [[*_op(1, 1, float("inf"), [2])]]}, 0.0) is None


def test_a_point_to_point_row_names_the_ranks_of_its_communicator() -> None:
    """A recv on world rank 7 from world rank 5, which are ranks 1 and 0 of group "g"."""
    times = [106.0, 107.0, 108.0]

    def recv(t: float) -> list[Any]:
        return ["g/p2p/0/0>1", 0, "recv", "p2p", t - 100, [5, 7], [0], t - 100, [5]]

    reports = [_history(7, [(t, [recv(t)], {}) for t in times]), _history(5, [(108.2, [], {"g": 3})])]
    (row,) = arrivals.build(reports, 108.5, STALE, AFTER)
    assert row["arrived"] == [1] and [m["rank"] for m in row["missing"]] == [0]
    assert row["calls"] == [{"call": "p2p", "ranks": [1]}]
    assert row["stuck"] == [{"rank": 1, "waiting": [0], "idle_s": 8.0}]


def test_a_waiting_ranks_heartbeat_is_answered_with_its_chain() -> None:
    """What the coordinator tells rank 1 (waiting for rank 0): rank 0's stuck wait, and
    what rank 2, where the chain ends, is doing."""
    times = [106.0, 107.0, 108.0]
    reports = [
        _history(0, _waiting_in(1, [2], times, 100.0)),
        _history(1, _waiting_in(1, [0], times, 100.0)),
        _history(2, [(t, [], {"default": 1}) for t in times]),
    ]
    answer = arrivals.chain_answer(arrivals.index(reports), reports[1], AFTER, 108.5, STALE)
    assert answer == {
        "waits": [[0, "all_reduce", 1, "default", [2], 8.0, 8.0]],
        "ends": [[2, "has not called it: idle after #0; last heartbeat 0.5s ago"]],
    }
    young = _history(0, _waiting_in(1, [2], [104.0], 100.0))  # one report: not stuck yet
    assert arrivals.chain_answer(arrivals.index([young, *reports[1:]]), reports[1], AFTER, 108.5, STALE) == {
        "waits": [],
        "ends": [[0, "in all_reduce #1; no heartbeat for 4s"]],  # (its only report is old)
    }
