"""The receive low-water mark's policy (sans I/O): never above what is due, raised in
few steps, back to 1 between frames."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from netcoll.links.readmark import MAX, MIN, mark_for


def test_marks_of_one_frame() -> None:
    assert mark_for(0, 1) is None  # between frames at 1: no system call
    assert mark_for(MIN - 1, 1) is None  # a small remainder is read as it comes
    assert mark_for(1 << 20, 1) == MAX
    assert mark_for(1 << 20, MAX) is None
    assert mark_for(100_000, MAX) == 100_000  # lowered at once below what is due
    assert mark_for(0, 100_000) == 1  # the frame is in: back to 1
    assert mark_for(MIN, MIN) is None


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(st.integers(0, 3 << 20), min_size=1, max_size=8),
    reads=st.lists(st.integers(1, 1 << 20), min_size=1, max_size=64),
)
def test_a_stream_of_frames_never_waits_for_more_than_is_due(frames: list[int], reads: list[int]) -> None:
    """Frames' payloads read in arbitrary pieces (a read takes at most what the mark
    lets through and what the frame still has): after every read the mark is at most
    what is due (at least 1), and setting it costs at most four calls per frame."""
    mark, sets, k = 1, 0, 0
    for size in frames:
        due = size
        change = mark_for(due, mark)  # the header is in: the payload is due
        if change is not None:
            mark, sets = change, sets + 1
        while due:
            got = min(due, max(mark, reads[k % len(reads)]))
            k += 1
            due -= got
            change = mark_for(due, mark)
            if change is not None:
                mark, sets = change, sets + 1
            assert mark <= max(due, 1), (size, due, mark)
    assert sets <= 4 * len(frames)
