"""Wait chains (netcoll.waits): a cycle of waits is named a deadlock with the ranks and
the operations in it; a chain that ends at a rank with no wait of its own names that
rank as never delivered; a cycle whose ranks still received data is too slow, not stuck."""

from __future__ import annotations

from netcoll.waits import Wait, explain, find_cycle, from_rows, graph, seconds, summary


def test_a_two_rank_cycle_across_operations_is_a_deadlock() -> None:
    waits = [Wait(0, "all_reduce #1", (2,), 9.0), Wait(2, "all_reduce #0", (0,), 9.0)]
    assert explain(0, waits).text() == (
        "deadlock: rank 0 in all_reduce #1 waits for rank 2, rank 2 in all_reduce #0 waits for rank 0"
    )


def test_the_cycle_begins_at_the_rank_explaining_it() -> None:
    ring = [Wait(r, "all_reduce #0", ((r - 1) % 4,), 5.0) for r in range(4)]
    assert explain(2, ring).text() == (
        "deadlock: rank 2 in all_reduce #0 waits for rank 1, rank 1 in all_reduce #0 waits for rank 0, "
        "rank 0 in all_reduce #0 waits for rank 3, rank 3 in all_reduce #0 waits for rank 2"
    )


def test_a_chain_ends_at_the_rank_that_never_delivered() -> None:
    waits = [Wait(2, "all_reduce #0", (1,)), Wait(1, "all_reduce #0", (3,))]
    assert explain(2, waits).text() == (
        "rank 1 in all_reduce #0 waits for rank 3; rank 3 never delivered: not called yet, stuck, or too slow"
    )
    # with nothing known of the others, only the end is named (the caller names its own wait)
    assert explain(2, [Wait(2, "all_reduce #0", (1, 3))]).text() == (
        "rank 1, rank 3 never delivered: not called yet, stuck, or too slow"
    )


def test_a_cycle_and_a_silent_rank_are_both_named() -> None:
    waits = [Wait(0, "all_reduce #1", (1, 2), None), Wait(2, "recv #0", (0,), None)]
    ex = explain(0, waits)
    assert ex.deadlock and ex.ends == [1]
    assert ex.text() == (
        "deadlock: rank 0 in all_reduce #1 waits for rank 2, rank 2 in recv #0 waits for rank 0; "
        "rank 1 never delivered: not called yet, stuck, or too slow"
    )


def test_a_cycle_not_through_the_start_is_found_beyond_it() -> None:
    waits = [Wait(0, "x #0", (1,), 3.0), Wait(1, "x #0", (2,), 3.0), Wait(2, "x #0", (1,), 3.0)]
    assert explain(0, waits).text() == "deadlock: rank 1 in x #0 waits for rank 2, rank 2 in x #0 waits for rank 1"


def test_a_wait_is_stuck_after_a_second_or_half_its_age_without_data() -> None:
    assert Wait(0, "x", (1,), 1.0, 60.0).stuck and not Wait(0, "x", (1,), 0.9, 60.0).stuck
    assert Wait(0, "x", (1,), 0.3, 0.3).stuck  # (nothing since it began: stuck, however young)
    assert not Wait(0, "x", (1,), 0.1, 0.3).stuck
    assert Wait(0, "x", (1,)).stuck  # unknown


def test_a_cycle_still_receiving_is_too_slow_not_a_deadlock() -> None:
    ring = [Wait(0, "all_reduce #0", (1,), 0.01, 30.0), Wait(1, "all_reduce #0", (0,), 4.0, 30.0)]
    ex = explain(0, ring)
    assert not ex.deadlock
    assert ex.text() == (
        "waits in a cycle, but data was still arriving (too slow, not a deadlock): "
        "rank 0 in all_reduce #0 waits for rank 1, rank 1 in all_reduce #0 waits for rank 0"
    )


def test_the_summary_names_every_cycle_then_the_other_waits_then_the_silent() -> None:
    waits = [
        Wait(3, "all_reduce #0", (2,), 8.0),
        Wait(1, "all_reduce #0", (0,), 8.0),
        Wait(0, "all_reduce #0", (3,), 8.0),
        Wait(2, "all_reduce #0", (1,), 8.0),
        Wait(4, "all_reduce #0", (5,), 8.0),
        Wait(6, "recv #2", (7,), 8.0),
        Wait(7, "send #2", (6,), 8.0),
    ]
    ex = summary(waits)
    assert ex.text() == (
        "deadlock: rank 0 in all_reduce #0 waits for rank 3, rank 3 in all_reduce #0 waits for rank 2, "
        "rank 2 in all_reduce #0 waits for rank 1, rank 1 in all_reduce #0 waits for rank 0; "
        "deadlock: rank 6 in recv #2 waits for rank 7, rank 7 in send #2 waits for rank 6; "
        "rank 4 in all_reduce #0 waits for rank 5; rank 5 never delivered: not called yet, stuck, or too slow"
    )
    assert summary(waits, known=[5]).ends == []


def test_labels_name_the_ranks_as_their_users_know_them() -> None:
    waits = [Wait(10, "all_reduce #0", (11,)), Wait(11, "all_reduce #0", (10,))]
    text = explain(10, waits).text(lambda r: f"rank {r - 10}")
    assert text == "deadlock: rank 0 in all_reduce #0 waits for rank 1, rank 1 in all_reduce #0 waits for rank 0"


def test_no_cycle_in_a_tree_of_waits() -> None:
    g = graph([Wait(0, "x", (1, 2)), Wait(1, "x", (3,)), Wait(2, "x", (3,))])
    assert find_cycle(g, [0, 1, 2]) == []
    assert summary(g[0] + g[1] + g[2]).text() == (
        "rank 0 in x waits for rank 1, rank 2; rank 1 in x waits for rank 3; rank 2 in x waits for rank 3; "
        "rank 3 never delivered: not called yet, stuck, or too slow"
    )


def test_rows_from_another_process_are_checked_and_bounded() -> None:
    good = Wait(1, "all_reduce #4", (0, 2), 1.5, 3.0)
    assert from_rows([good.row()]) == [good]
    bad = [
        "x",
        [1, "op"],
        [-1, "op", [0], None, None],
        [True, "op", [0], None, None],
        [1, 7, [0], None, None],
        [1, "op", [0, "2"], None, None],
        [1, "op", "0", None, None],
        [1, "op", [0], "slow", float("nan")],
    ]
    assert from_rows(bad) == [Wait(1, "op", (0,), None, None)]  # (an unreadable time is just unknown)
    assert from_rows("nope") == []
    long = from_rows([[1, "o" * 999, list(range(2000)), 0.0, 1.0]])
    assert len(long[0].op) == 200 and len(long[0].ranks) == 512


def test_durations_read_plainly() -> None:
    assert [seconds(x) for x in (300.0, 11.9163, 0.3, 0.30000000000000004, 86400.0, 1.23456)] == [
        "300",
        "11.9",
        "0.3",
        "0.3",
        "86400",
        "1.235",
    ]


def test_what_is_known_of_a_silent_rank_is_said_instead_of_the_guesses() -> None:
    waits = [Wait(1, "all_reduce #1", (0,)), Wait(0, "all_reduce #1", (2, 3))]
    notes = {3: "has not called it: idle after #0; last heartbeat 0.4s ago"}
    assert explain(1, waits).text(notes=notes) == (
        "rank 0 in all_reduce #1 waits for rank 2, rank 3; rank 2 never delivered: not called yet, stuck, or too slow; "
        "rank 3 never delivered (has not called it: idle after #0; last heartbeat 0.4s ago)"
    )
