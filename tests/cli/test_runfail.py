"""Which rank failed first, from the ranks' notes and exits (netcoll.cli.runfail), and what
a rank notes of its error (netcoll.launched): pure, no processes (issue 38, item 3)."""

from __future__ import annotations

import sys
import types

import pytest

from netcoll import launched
from netcoll.cli.runfail import find_cause, victim_line
from netcoll.errors import CollectiveAborted, CollectiveTimeout, MismatchError, PeerLost
from netcoll.launched import Note, note_of, read_note, record_failure
from netcoll.waits import Wait


def own(t: float, error: str = "ValueError: boom") -> Note:
    return Note(t, error)


def lost(t: float, *blame: int) -> Note:
    return Note(t, "PeerLost: lost", "lost", blame, "all_reduce #1")


def timed(t: float, *blame: int) -> Note:
    return Note(t, "CollectiveTimeout: timed out", "timeout", blame, "all_reduce #0")


def test_a_rank_that_raised_is_the_cause_whoever_exited_first() -> None:
    notes = {3: lost(2.0, 2), 2: own(1.0), 0: lost(2.1, 2)}
    cause = find_cause(notes, {3: "exited with status 1"}, failed=[3])
    assert cause is not None and cause.ranks == (2,) and cause.text == "rank 2 failed: ValueError: boom"


def test_the_earliest_of_several_own_errors_is_the_cause() -> None:
    cause = find_cause({1: own(5.0, "RuntimeError: late"), 2: own(4.0)}, {}, failed=[1, 2])
    assert cause is not None and cause.ranks == (2,)


def test_a_rank_that_never_arrived_is_the_cause_not_the_victim_that_timed_out() -> None:
    notes = {0: timed(1.0, 3), 1: timed(1.1, 3), 2: timed(1.2, 3)}
    cause = find_cause(notes, {0: "exited with status 1"}, failed=[0])
    assert cause is not None and cause.ranks == (3,)
    assert cause.text == "rank 3 never arrived (ranks 0, 1, 2 timed out waiting for it in all_reduce #0)"


def test_a_chain_is_followed_through_the_notes_of_victims() -> None:
    """Rank 1 saw only that rank 0 waited for rank 2; rank 2 noted that it timed out waiting
    for rank 3: rank 3 is the end, rank 2 (which arrived) is not named."""
    notes = {1: timed(1.0, 2, 3), 2: timed(1.0, 3)}
    cause = find_cause(notes, {1: "exited with status 1"}, failed=[1])
    assert cause is not None and cause.ranks == (3,)


def test_a_rank_that_died_is_named_with_how_it_ended() -> None:
    notes = {0: lost(1.0, 1), 2: lost(1.0, 1)}
    cause = find_cause(notes, {1: "was killed by SIGKILL", 0: "exited with status 1"}, failed=[0, 1, 2])
    assert cause is not None and cause.ranks == (1,)
    assert cause.text == "rank 1 was killed by SIGKILL (ranks 0, 2 lost their connection to it)"
    cause = find_cause(notes, {0: "exited with status 1"}, failed=[0])  # not reaped yet
    assert cause is not None and cause.text == "rank 1 was lost (ranks 0, 2 lost their connection to it)"


def test_each_kind_of_pointing_is_said_as_what_it_was() -> None:
    aborted = Note(1.0, "CollectiveAborted: x", "aborted", (3,), "all_reduce #1")
    cause = find_cause({0: lost(1.0, 3), 1: aborted, 2: timed(1.0, 3)}, {}, failed=[0])
    assert cause is not None and cause.text == (
        "rank 3 never arrived (rank 2 timed out waiting for it in all_reduce #0; rank 0 lost its connection to it; "
        "rank 1 was aborted because of it)"
    )


def test_without_notes_the_first_failure_is_the_cause() -> None:
    cause = find_cause({}, {2: "exited with status 3"}, failed=[2])
    assert cause is not None and cause.text == "rank 2 exited with status 3"
    assert find_cause({}, {}, failed=[]) is None


def test_a_victims_line_is_one_line_with_where_it_was() -> None:
    note = Note(1.0, "PeerLost: " + "x" * 1000, "lost", (2,), "all_reduce #1", "train.py:12")
    line = victim_line(0, note)
    assert "\n" not in line and line.startswith("rank 0: PeerLost: x") and line.endswith("... (at train.py:12)")


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - the test wants it with a traceback
        return caught


def test_what_a_rank_notes_of_each_kind_of_error() -> None:
    mine = note_of(_raised(ValueError("boom")), now=1.0)
    assert (mine.time, mine.error, mine.kind, mine.blame, mine.op) == (1.0, "ValueError: boom", "error", (), "")
    assert mine.at.startswith("test_runfail.py:")
    gone = PeerLost(
        "all_reduce #1 of group 'default' failed: lost connection to rank 2", op="all_reduce", seq=1, ranks=(2,)
    )
    note = note_of(_raised(gone), now=1.0)
    assert (note.kind, note.blame, note.op) == ("lost", (2,), "all_reduce #1")
    wrapped = _raised(RuntimeError("DDP failed"))
    wrapped.__cause__ = gone  # a framework re-raising it: the netcoll error decides
    assert note_of(wrapped).kind == "lost" and note_of(wrapped).error.startswith("PeerLost: ")
    late = CollectiveTimeout("timed out", op="all_reduce", seq=0, ranks=(1,))
    late.waits = (Wait(0, "all_reduce #0", (1,)), Wait(1, "all_reduce #0", (3,)))
    assert note_of(late).blame == (3,)  # the end of the wait chain
    told = CollectiveAborted("aborted by rank 0 (timeout)", op="all_reduce", seq=0, ranks=(0,))
    told.waits = late.waits
    assert (note_of(told).kind, note_of(told).blame) == ("timeout", (3,))
    cycle = CollectiveTimeout("deadlock", op="all_reduce", seq=0, ranks=(1,))
    cycle.waits = (Wait(0, "all_reduce #0", (1,)), Wait(1, "all_reduce #0", (0,)))
    assert note_of(cycle).blame == ()  # a deadlock: no one rank to point at
    assert note_of(MismatchError("x", op="all_reduce", seq=0, ranks=(1,))).kind == "error"
    sub = PeerLost("lost", op="all_reduce", seq=0, ranks=(1,))
    sub.world_ranks = {0: 4, 1: 6}  # a sub-group's rank 1 is world rank 6
    assert note_of(sub).blame == (6,)


def test_a_note_is_written_once_and_read_back(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    path = f"{tmp_path}/rank0.json"
    monkeypatch.setenv(launched.ERROR_FILE_ENV, path)
    first = _raised(PeerLost("lost", op="all_reduce", seq=1, ranks=(2,)))
    record_failure(first)
    record_failure(_raised(ValueError("later")))  # the first error stays
    note = read_note(path)
    assert note is not None and (note.kind, note.blame) == ("lost", (2,))
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"time": 1, "error": "x", "kind": "weird", "blame": ["no"]}')
    assert read_note(path) is None  # a rank's file is untrusted
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"time": 1, "error": "x", "kind": "weird"}')
    note = read_note(path)
    assert note is not None and note.kind == "error"


def test_under_netcoll_run_a_noted_victim_prints_nothing_and_tracebacks_hide_netcolls_frames(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(launched.ERROR_FILE_ENV, f"{tmp_path}/rank0.json")
    printed: list[BaseException] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, exc, tb: printed.append(exc))
    launched.install_excepthook()
    launched.install_excepthook()  # once
    hook = sys.excepthook
    assert getattr(hook, "netcoll", False)
    victim = _raised(PeerLost("lost", op="all_reduce", seq=1, ranks=(2,)))
    record_failure(victim)
    hook(type(victim), victim, victim.__traceback__)
    assert printed == []  # the launcher gives it its line
    own_error = _raised(ValueError("mine"))
    frame = types.TracebackType(None, sys._getframe(), 0, 1)
    internal = types.TracebackType(None, _internal_frame(), 0, 1)
    own_error.__traceback__ = types.TracebackType(internal, frame.tb_frame, 0, 1)
    hook(type(own_error), own_error, own_error.__traceback__)
    assert printed == [own_error]
    tb = own_error.__traceback__
    assert tb is not None and tb.tb_next is None  # netcoll's frame is gone, the test's own stays
    monkeypatch.setenv("NETCOLL_TRACEBACK", "full")
    hook(type(victim), victim, victim.__traceback__)
    assert printed == [own_error, victim]


def _internal_frame() -> types.FrameType:
    """A frame whose code is (says it is) in the netcoll package."""
    from pathlib import Path

    import netcoll

    code = compile(
        "import sys\ndef here():\n    return sys._getframe()\n", str(Path(netcoll.__file__).parent / "x.py"), "exec"
    )
    space: dict[str, object] = {}
    exec(code, space)
    return space["here"]()  # type: ignore[operator,no-any-return]
