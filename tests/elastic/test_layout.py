"""The pieces of a heal without a network: a state's layout (canonical, checked when it
comes from a peer), the stream's slices and chunks, reads and writes across arrays."""

from __future__ import annotations

import dataclasses
import itertools

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from netcoll.elastic import HealError
from netcoll.elastic import layout as lay
from netcoll.elastic.stream import ALIGN, Stream, chunks, slices
from netcoll.limits import DEFAULT
from tests.elastic.states import live_state


def test_layout_is_canonical_whatever_the_insertion_order() -> None:
    a = {"b": np.ones(3), "a": {"y": 1, "x": np.zeros(2, np.int8)}}
    b = {"a": {"x": np.zeros(2, np.int8), "y": 1}, "b": np.ones(3)}
    ea, _ = lay.flatten(a, strict=True)
    eb, _ = lay.flatten(b, strict=True)
    assert lay.encode(ea) == lay.encode(eb)
    assert [e.path for e in ea] == [("a", "x"), ("a", "y"), ("b",)]


def test_a_layout_round_trips_through_decode() -> None:
    entries, arrays = lay.flatten(live_state(), strict=True)
    assert lay.decode(lay.encode(entries), sender=1) == entries
    assert set(arrays) == {e.path for e in entries if e.dtype is not None}


def test_a_joiner_skips_what_a_live_member_refuses() -> None:
    state = {"ok": np.ones(2), "bad": object(), 3: np.ones(1), "big": 1 << 70}
    with pytest.raises(TypeError, match="bad is of type object"):
        lay.flatten(state, strict=True)
    entries, _ = lay.flatten(state, strict=False)
    assert [e.path for e in entries] == [("ok",)]


def test_nesting_deeper_than_the_limit_is_refused() -> None:
    state: dict[str, object] = {"x": 1}
    for _ in range(lay.MAX_DEPTH):
        state = {"d": state}
    with pytest.raises(TypeError, match="nested deeper"):
        lay.flatten(state, strict=True)


@pytest.mark.parametrize(
    ("blob", "why"),
    [
        (b"\xc1", "malformed"),
        (msgpack.packb({"a": 1}), "malformed"),
        (msgpack.packb([[["w"], "array", "<f4", [-1], None]]), "malformed"),
        (msgpack.packb([[["w"], "array", "<f4", [1 << 40, 1 << 40], None]]), "max_array_bytes"),
        (msgpack.packb([[["w"], "array", "|O", [3], None]]), "unusable dtype"),
        (msgpack.packb([[["w"], "weird", None, [], None]]), "kind"),
        (msgpack.packb([[["s"], "value", None, [], {"no": "maps"}]]), "value of s"),
        (msgpack.packb([[["b"], "value", None, [], 1], [["a"], "value", None, [], 1]]), "out of order"),
        (msgpack.packb([[["a"], "value", None, [], 1], [["a"], "value", None, [], 1]]), "repeated"),
    ],
)
def test_a_malformed_layout_from_a_peer_is_a_heal_error(blob: bytes, why: str) -> None:
    with pytest.raises(HealError, match=f"rank 3 sent a .*{why}"):
        lay.decode(blob, sender=3, limits=DEFAULT)


def test_a_layout_over_the_array_limit_allocates_nothing() -> None:
    small = dataclasses.replace(DEFAULT, max_array_bytes=100)
    blob = lay.encode(lay.flatten({"w": np.zeros(26, np.float32)}, strict=True)[0])
    with pytest.raises(HealError, match="max_array_bytes"):
        lay.decode(blob, sender=0, limits=small)


@given(st.integers(0, 1 << 26), st.integers(1, 8), st.integers(4096, 1 << 30))
def test_slices_cover_the_stream_evenly(total: int, sources: int, slice_bytes: int) -> None:
    cuts = slices(total, sources, slice_bytes)
    if total == 0:
        assert cuts == []
        return
    assert cuts[0][0] == 0 and cuts[-1][1] == total and len(cuts) % sources == 0
    assert all(a <= b for a, b in cuts) and all(x[1] == y[0] for x, y in itertools.pairwise(cuts))
    assert all(b - a <= slice_bytes + ALIGN for a, b in cuts)
    share = [sum(b - a for i, (a, b) in enumerate(cuts) if i % sources == s) for s in range(sources)]
    assert max(share) - min(share) <= -(-total // len(cuts)) + ALIGN  # no source more than a slice behind


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(1, 3000))
def test_chunks_cut_a_range(a: int, n: int, chunk: int) -> None:
    parts = list(chunks(a, a + n, chunk))
    assert sum(y - x for x, y in parts) == n and all(0 < y - x <= chunk for x, y in parts)


def test_a_stream_reads_views_inside_an_array_and_copies_across() -> None:
    xs = [np.arange(10, dtype=np.uint8), np.zeros(0, np.float32), np.arange(4, dtype=np.int16), np.ones((2, 3))]
    s = Stream(xs)
    whole = b"".join(np.ascontiguousarray(x).tobytes() for x in xs)
    assert s.nbytes == len(whole)
    inside = s.read(2, 7)
    assert np.shares_memory(inside, xs[0]) and inside.tobytes() == whole[2:7]
    assert s.read(5, 30).tobytes() == whole[5:30]
    ys = [np.empty_like(x) for x in xs]
    t = Stream(ys)
    for a, b in chunks(0, len(whole), 7):
        t.write(a, np.frombuffer(whole[a:b], np.uint8))
    assert all(np.array_equal(x, y) for x, y in zip(xs, ys, strict=True))
    with pytest.raises(ValueError, match="outside"):
        s.read(0, len(whole) + 1)
