"""The pool of large result arrays (netcoll.resultpool): a block is reused only
once every array over it is gone, the pool stays within its size, and
collectives hand out pooled results with the right contents."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from netcoll import resultpool
from netcoll.resultpool import GRAIN, ResultPool, keep_from_env
from tests.support.worlds import memory_world, run_world

MIN = 1 << 16  # a pool that takes small arrays, so the tests stay cheap


def addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def pooled(a: np.ndarray) -> bool:
    """Whether ``a`` lies in a block of the pool (its bases end in the pool's ctypes holder)."""
    base: object = a
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return isinstance(base, ctypes.Array)


def test_small_arrays_are_plain_numpy() -> None:
    pool = ResultPool(1 << 30, min_bytes=MIN)
    a = pool.empty((10,), np.float32)
    assert a.flags.owndata and a.shape == (10,) and a.dtype == np.float32
    assert pool.stats() == {"held_bytes": 0, "lent": 0, "reused": 0, "made": 0}


def test_a_pooled_array_looks_like_np_empty() -> None:
    pool = ResultPool(1 << 30, min_bytes=MIN)
    a = pool.empty((3, MIN // 8), np.float64)
    assert a.shape == (3, MIN // 8) and a.dtype == np.float64
    assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
    a[...] = 7.0
    assert float(a.sum()) == 7.0 * a.size
    assert pool.stats()["lent"] == 1


def test_a_dropped_result_is_reused() -> None:
    pool = ResultPool(1 << 30, min_bytes=MIN)
    a = pool.empty((MIN,), np.uint8)
    where = addr(a)
    del a
    gc.collect()
    assert pool.stats() == {"held_bytes": GRAIN, "lent": 0, "reused": 0, "made": 1}
    b = pool.empty((MIN // 4,), np.int32)  # another dtype, same size class
    assert addr(b) == where
    assert pool.stats()["reused"] == 1


def test_a_view_keeps_the_block_out_of_the_pool() -> None:
    pool = ResultPool(1 << 30, min_bytes=MIN)
    a = pool.empty((MIN // 4,), np.float32)
    a[...] = np.arange(a.size, dtype=np.float32)
    tail = a[5:].reshape(-1)
    held = memoryview(a)
    del a
    gc.collect()
    assert pool.stats()["lent"] == 1  # the view and the memoryview still use it
    other = pool.empty((MIN // 4,), np.float32)
    other[...] = -1.0
    assert addr(other) != addr(tail) - 20
    assert tail[0] == 5.0 and tail[-1] == MIN // 4 - 1
    del tail
    gc.collect()
    assert pool.stats()["lent"] == 2  # `held` still exports it
    del held
    gc.collect()
    assert pool.stats()["lent"] == 1


def test_the_pool_keeps_no_more_than_its_size() -> None:
    pool = ResultPool(3 * GRAIN, min_bytes=MIN)
    small = [pool.empty((GRAIN,), np.uint8) for _ in range(2)]
    large = pool.empty((2 * GRAIN,), np.uint8)
    del small, large
    gc.collect()
    s = pool.stats()
    assert s["held_bytes"] <= 3 * GRAIN and s["lent"] == 0
    assert s["held_bytes"] == 2 * GRAIN  # the largest block went first
    pool.configure(GRAIN)
    assert pool.stats()["held_bytes"] == GRAIN
    pool.clear()
    assert pool.stats()["held_bytes"] == 0


def test_size_zero_pools_nothing() -> None:
    pool = ResultPool(0, min_bytes=MIN)
    a = pool.empty((MIN,), np.uint8)
    assert a.flags.owndata
    assert pool.stats()["made"] == 0


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1M"])
def test_a_bad_size_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="result pool"):
        ResultPool(bad, min_bytes=MIN)  # type: ignore[arg-type]


def test_blocks_come_back_from_other_threads() -> None:
    pool = ResultPool(1 << 30, min_bytes=MIN)
    arrays = [pool.empty((MIN,), np.uint8) for _ in range(8)]

    def drop() -> None:
        while arrays:
            arrays.pop()

    t = threading.Thread(target=drop)
    t.start()
    t.join()
    gc.collect()
    assert pool.stats()["lent"] == 0 and pool.stats()["held_bytes"] == 8 * GRAIN


def test_the_size_comes_from_the_environment() -> None:
    assert keep_from_env({}) == resultpool.DEFAULT_KEEP
    assert keep_from_env({"NETCOLL_RESULT_POOL": "  "}) == resultpool.DEFAULT_KEEP
    assert keep_from_env({"NETCOLL_RESULT_POOL": "512M"}) == 512 << 20
    assert keep_from_env({"NETCOLL_RESULT_POOL": "0"}) == 0
    with pytest.raises(ValueError, match="NETCOLL_RESULT_POOL"):
        keep_from_env({"NETCOLL_RESULT_POOL": "lots"})


@pytest.fixture
def small_results(monkeypatch: pytest.MonkeyPatch) -> Iterator[ResultPool]:
    """The process's pool, taking arrays from MIN bytes for the test's length."""
    pool = resultpool.RESULTS
    monkeypatch.setattr(pool, "min_bytes", MIN)
    pool.clear()
    yield pool
    pool.clear()


def test_a_malformed_environment_fails_making_a_communicator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_RESULT_POOL", "-3")
    with pytest.raises(ValueError, match="NETCOLL_RESULT_POOL"):
        memory_world(2)


async def test_collectives_return_pooled_results(small_results: ResultPool) -> None:
    n = MIN  # float32 elements: 4 * MIN bytes

    async def body(comm: object) -> list[float]:
        x = np.full(n, comm.rank + 1, np.float32)  # type: ignore[attr-defined]
        seen = []
        for algo in ("ring", "tree", "ring"):
            y = await comm.all_reduce(x, algorithm=algo)  # type: ignore[attr-defined]
            assert not y.flags.owndata  # from the pool
            seen.append(float(y[0]) + float(y[-1]))
            del y
        g = await comm.all_gather(x)  # type: ignore[attr-defined]
        assert not g.flags.owndata and g.shape == (2, n)
        seen.append(float(g[1, -1]))
        return seen

    results = await run_world(2, body)
    assert results == [[6.0, 6.0, 6.0, 2.0]] * 2
    assert small_results.stats()["reused"] >= 2  # the later calls took back what the earlier dropped


async def test_results_sized_on_arrival_are_pooled_too(small_results: ResultPool) -> None:
    """Results an algorithm allocates itself (a broadcast into no buffer, a
    receive, uneven gather / scatter / all_to_all, whose sizes travel with the
    data) come from the pool, and the later calls take back what the earlier dropped."""
    n = MIN  # float32 elements: 4 * MIN bytes

    async def body(comm: object) -> list[float]:
        r = comm.rank  # type: ignore[attr-defined]
        x = np.full(n, r + 1, np.float32)
        seen: list[float] = []
        for _ in range(2):
            b = await comm.broadcast(x if r == 0 else None, 0)  # type: ignore[attr-defined]
            assert pooled(b) == (r == 1)  # the root's result is its input
            seen.append(float(b[-1]))
            del b
        if r == 0:
            await comm.send(x * 3, 1)  # type: ignore[attr-defined]
        else:
            got = await comm.recv(0)  # type: ignore[attr-defined]
            assert pooled(got)
            seen.append(float(got[-1]))
            del got
        lists = await comm.all_to_all([x, x * 2])  # type: ignore[attr-defined]
        assert all(pooled(a) for a in lists)  # the own block is a pooled copy too
        seen.append(float(lists[0][-1] + lists[1][-1]))
        del lists
        parts = await comm.scatter([x, x * 5] if r == 0 else None, 0)  # type: ignore[attr-defined]
        assert pooled(parts)
        seen.append(float(parts[-1]))
        del parts
        g = await comm.gather(x, 0, uneven=True)  # type: ignore[attr-defined]
        if r == 0:
            assert all(pooled(a) for a in g)
            seen.append(float(g[0][-1] + g[1][-1]))
        return seen

    results = await run_world(2, body)
    # x = r + 1. Rank 0: broadcast 1, 1; all_to_all 1 + 2 (block 0 of [x, 2x] from each
    # rank); scatter 1; gather 1 + 2. Rank 1: broadcast 1, 1; recv 3; all_to_all 2 + 4; scatter 5.
    assert results == [[1.0, 1.0, 3.0, 1.0, 3.0], [1.0, 1.0, 3.0, 6.0, 5.0]]
    assert small_results.stats()["reused"] >= 3


@pytest.mark.parametrize("which", ["results", "scratch"])
def test_a_forked_child_can_use_the_pool_while_a_thread_held_its_lock(which: str) -> None:
    """fork() while another thread holds a pool's lock: the child gets a new one
    (the result pool, and the algorithms' scratch pool)."""
    import os

    from netcoll.algorithms._scratch import SCRATCH_POOL

    lock = (lambda: resultpool.RESULTS._lock) if which == "results" else (lambda: SCRATCH_POOL.lock)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock():
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: would block forever on the inherited, held lock
            ok = lock().acquire(timeout=5)
            os._exit(0 if ok else 1)
    finally:
        release.set()
        t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


async def test_closing_a_communicator_drops_the_free_blocks(small_results: ResultPool) -> None:
    """Done with collectives: the memory kept for reuse goes back to the system
    (a block still used by an array stays with it)."""
    _, comms = memory_world(2)
    x = np.ones(MIN, np.float32)

    async def call(c: object) -> np.ndarray | None:
        y = await c.all_reduce(x)  # type: ignore[attr-defined]
        return y if c.rank == 0 else None  # type: ignore[attr-defined]

    kept, _ = await asyncio.gather(*(call(c) for c in comms))
    gc.collect()
    assert small_results.stats()["held_bytes"] > 0  # rank 1's result came back
    await asyncio.gather(*(c.close() for c in comms))
    assert small_results.stats()["held_bytes"] == 0 and small_results.stats()["lent"] == 1
    assert float(kept[0]) == 2.0
