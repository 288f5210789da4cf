"""Array arguments are checked for size before any work (issue 10, finding 4):
an input whose *logical* size (elements x itemsize, whatever its strides) is
over ``max_array_bytes`` is a ValueError at the call, before anything is
copied or sent -- a stride-0 view of a few bytes that stands for gigabytes
included -- and array metadata from a peer is checked before anything is
allocated for it."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from netcoll.arrays import array_from_meta, as_array, contiguous_copy
from netcoll.errors import LimitExceeded, MismatchError
from netcoll.limits import DEFAULT, Limits
from tests.support import memory_group, memory_world

SMALL = Limits(max_array_bytes=1024)


def _huge_view(nbytes_over: int = 8) -> np.ndarray:
    """A stride-0 float32 view just over the default limit, backed by 4 bytes."""
    n = DEFAULT.max_array_bytes // 4 + nbytes_over
    return np.broadcast_to(np.float32(1.0), (n,))


def test_over_limit_is_refused_before_any_copy() -> None:
    x = _huge_view()
    assert x.strides == (0,) and x.nbytes > DEFAULT.max_array_bytes
    tracemalloc.start()
    try:
        start = time.thread_time()  # CPU time: no pass over the 4 G elements (waits for a core do not count)
        with pytest.raises(ValueError, match=r"max_array_bytes=17179869184.*NETCOLL_LIMIT_MAX_ARRAY_BYTES") as info:
            as_array(x)
        took = time.thread_time() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "strides (0,)" in str(info.value)
    assert took < 0.05 and peak < 1 << 20, (took, peak)
    with pytest.raises(ValueError, match="max_array_bytes"):
        contiguous_copy(x)


def test_limit_is_configurable_and_under_it_everything_works() -> None:
    ok = np.arange(256, dtype=np.float32)  # exactly 1024 bytes
    assert as_array(ok, limits=SMALL) is ok
    with pytest.raises(ValueError, match="x: a float32\\[257\\] array is 1028 bytes, over the limit"):
        as_array(np.arange(257, dtype=np.float32), limits=SMALL)
    with pytest.raises(ValueError, match=r"buf: .*max_array_bytes=1024"):
        as_array([[1.0] * 200] * 2, "buf", limits=SMALL)  # array-likes too
    view = np.broadcast_to(np.int64(7), (4, 3))  # small non-contiguous inputs are still copied
    got = contiguous_copy(as_array(view))
    assert got.flags.c_contiguous and got.tolist() == [[7] * 3] * 4


@pytest.mark.parametrize("call", ["all_reduce", "broadcast", "all_gather", "reduce", "gather", "send"])
async def test_collectives_refuse_a_huge_view_at_the_call_and_stay_usable(call: str) -> None:
    group = memory_group(2)
    try:
        c0, c1 = group.communicators()
        start = time.thread_time()  # CPU time, as above
        with pytest.raises(ValueError, match="max_array_bytes"):
            if call == "send":
                c0.send(_huge_view(), 1)
            else:
                getattr(c0, call)(_huge_view())
        assert time.thread_time() - start < 0.05
        x = np.arange(4, dtype=np.float64)
        a, b = c0.all_reduce(x), c1.all_reduce(x * 2)
        np.testing.assert_array_equal(await a, x * 3)
        np.testing.assert_array_equal(await b, x * 3)
    finally:
        await group.close()


@pytest.mark.parametrize(
    "shape",
    [[2**40, 2**40], [DEFAULT.max_array_bytes // 8 + 1], [3] * 40],
    ids=["2^80", "just-over", "3^40"],
)
def test_peer_metadata_over_the_limit_allocates_nothing(shape: list[int]) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(LimitExceeded, match="max_array_bytes"):
            array_from_meta({"dtype": "<f8", "shape": shape})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize(
    "shape",
    [[-1], [True], [1.5], ["3"], [None], [0, 2**70], [1] * 65, "12"],
    ids=["negative", "bool", "float", "str", "none", "0x2^70", "65dims", "not-a-list"],
)
def test_malformed_peer_shapes_are_mismatches(shape: Any) -> None:
    with pytest.raises(MismatchError):
        array_from_meta({"dtype": "<f4", "shape": shape})


DIMS = st.one_of(
    st.integers(min_value=0, max_value=8),
    st.integers(),
    st.sampled_from([2**31, 2**62, 2**63, 2**64, 2**70, 10**5000]),
    st.booleans(),
    st.floats(),
    st.none(),
    st.text(max_size=3),
)


@given(shape=st.lists(DIMS, max_size=70), dtype=st.sampled_from(["<f4", "<i8", "bfloat16", "|b1", "<c16", "x", 7]))
def test_peer_metadata_of_any_shape_is_accepted_or_refused_cleanly(shape: list[Any], dtype: Any) -> None:
    try:
        arr = array_from_meta({"dtype": dtype, "shape": shape}, limits=Limits(max_array_bytes=1 << 20))
    except (MismatchError, LimitExceeded):
        return
    assert arr.nbytes <= 1 << 20 and list(arr.shape) == shape
    assert array_from_meta({"dtype": dtype, "shape": shape}, memoryview(bytes(arr.nbytes))).shape == arr.shape


def test_one_root_check_for_calls_algorithms_jobs_and_the_cli() -> None:
    """netcoll.ranks.check_root is the one check of a root (issue 39: three copies had three
    messages); the Communicator's calls, the algorithms and the job specs say the same."""
    from netcoll import choices, collectives
    from netcoll.ranks import check_root

    assert check_root(np.int64(2), 4) == 2 and check_root(7, None) == 7
    with pytest.raises(ValueError, match=r"root 4 is out of range for 4 ranks \(valid roots are 0..3\)"):
        check_root(4, 4)
    with pytest.raises(ValueError, match=r"root 1 is out of range for 1 rank \(valid roots are 0..0\)"):
        check_root(1, 1)
    with pytest.raises(ValueError, match="root must be >= 0, got -1"):
        check_root(-1, None)
    for bad in (True, 1.0, "0", None):
        with pytest.raises(TypeError, match="root must be an int rank"):
            check_root(bad, 4)
    bcast, gather = collectives.get("broadcast"), collectives.get("all_gather")
    with pytest.raises(ValueError, match=r"valid roots are 0\.\.1"):
        choices.check_root(bcast, 2, 2)
    choices.check_root(gather, 9, 2)  # no root: any root >= 0 is ignored


async def test_a_calls_root_is_checked_before_anything_is_sent() -> None:
    _, comms = memory_world(2)
    with pytest.raises(ValueError, match=r"root 2 is out of range for 2 ranks \(valid roots are 0..1\)"):
        comms[0].broadcast(np.zeros(2), root=2)
    with pytest.raises(TypeError, match=r"root must be an int rank, got 1\.5"):
        comms[0].reduce(np.zeros(2), root=1.5)  # type: ignore[call-overload]
