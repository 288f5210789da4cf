"""Operation deadlines under one timer per engine (netcoll.deadlines): the
timer is not re-made per operation, yet every deadline (and slow warning)
fires on time, also when a shorter deadline comes after a longer one."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from netcoll.deadlines import Deadlines
from netcoll.errors import CollectiveTimeout
from netcoll.logs import ContextFilter, bind
from tests.support.worlds import memory_world


class _Op:
    """What a deadline reads of its operation (for the slow warning)."""

    name, seq = "all_reduce", 7
    opened = moved = 0.0

    def where(self) -> str:
        return "all_reduce #7"

    def short(self) -> str:
        return "all_reduce #7"

    def me(self, rank: int) -> int:
        return rank

    def waiting_for(self) -> tuple[int, ...]:
        return (3,)


async def _sleeper() -> None:
    await asyncio.sleep(60)


def _task() -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(_sleeper())


async def _cancel(*tasks: asyncio.Task[None]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_operations_in_sequence_share_one_timer() -> None:
    deadlines = Deadlines()
    first = deadlines.start(_task(), _Op(), 30.0, 10.0, 0)  # type: ignore[arg-type]
    timer = deadlines.timer
    assert timer is not None and deadlines.at == pytest.approx(asyncio.get_running_loop().time() + 10.0, abs=0.5)
    first.cancel()
    tasks = []
    for _ in range(100):
        tasks.append(_task())
        deadlines.start(tasks[-1], _Op(), 30.0, 10.0, 0).cancel()  # type: ignore[arg-type]
    assert deadlines.timer is timer and not deadlines.active  # no timer per operation
    await _cancel(*tasks, first.task)
    deadlines.close()
    assert deadlines.timer is None and timer.cancelled()


async def test_a_shorter_deadline_after_a_longer_one_fires_on_time() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    long_task, short_task = _task(), _task()
    long = deadlines.start(long_task, _Op(), 60.0, 60.0, 0)  # type: ignore[arg-type]
    start = loop.time()
    short = deadlines.start(short_task, _Op(), 0.2, 60.0, 0)  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError):
        await short_task
    assert 0.15 <= loop.time() - start < 2.0
    assert short.expired and not long.expired and not long_task.done()
    assert deadlines.active == {long} and deadlines.at == pytest.approx(long.end)  # re-armed for what runs
    long.cancel()
    await _cancel(long_task)
    deadlines.close()


async def test_a_timer_that_fires_with_nothing_due_rearms_or_rests() -> None:
    deadlines = Deadlines()
    first_task = _task()
    deadlines.start(first_task, _Op(), 0.1, 60.0, 0).cancel()  # type: ignore[arg-type]
    later_task = _task()
    later = deadlines.start(later_task, _Op(), 1.0, 60.0, 0)  # type: ignore[arg-type]
    await asyncio.sleep(0.15)  # the first one's time passed: nothing due, re-armed for the later one
    assert deadlines.timer is not None and not later.expired
    with pytest.raises(asyncio.CancelledError):
        await later_task
    assert later.expired and deadlines.timer is None and not deadlines.active
    await _cancel(first_task)


async def test_slow_warnings_come_at_growing_intervals_then_the_end(caplog: pytest.LogCaptureFixture) -> None:
    deadlines = Deadlines()
    task = _task()
    with caplog.at_level(logging.WARNING, logger="netcoll.engine"):
        deadline = deadlines.start(task, _Op(), 1.5, 0.1, 2)  # type: ignore[arg-type]
        with pytest.raises(asyncio.CancelledError):
            await task
    assert deadline.expired
    assert [r.getMessage() for r in caplog.records] == [
        "slow operation: all_reduce #7 still running on rank 2 after 0.1s; waiting for rank 3; "
        "next warning at 0.3s, timeout at 1.5s",
        "slow operation: all_reduce #7 still running on rank 2 after 0.3s; waiting for rank 3; "
        "next warning at 0.9s, timeout at 1.5s",
        "slow operation: all_reduce #7 still running on rank 2 after 0.9s; waiting for rank 3; timeout at 1.5s",
    ]


async def test_a_slow_warning_carries_the_job_of_its_operation() -> None:
    """The timer is shared: armed in one job's context, it still fires for the next job's
    operation, whose warning must name that job (not the one that armed the timer)."""
    deadlines = Deadlines()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    handler.addFilter(ContextFilter("test"))
    logger = logging.getLogger("netcoll.engine")
    logger.addHandler(handler)
    try:
        with bind(job=8):  # an operation of job 8 arms the timer for its warning, and ends
            early = deadlines.start(_task(), _Op(), 60.0, 0.05, 0)  # type: ignore[arg-type]
            early.cancel()
        with bind(job=9):  # job 9's comes later: the timer armed in job 8 serves it
            task = _task()
            deadlines.start(task, _Op(), 0.4, 0.1, 0)  # type: ignore[arg-type]
        assert deadlines.at < deadlines.loop.time() + 0.08  # type: ignore[union-attr]  # (not re-armed)
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        logger.removeHandler(handler)
    jobs = [r.netcoll.get("job") for r in records if r.getMessage().startswith("slow operation")]  # type: ignore[attr-defined]
    assert jobs == [9, 9]
    await _cancel(early.task)
    deadlines.close()


async def test_collectives_time_out_on_their_own_deadlines_one_after_another() -> None:
    """Through the engine: a long-deadline call that completes, then short ones
    that cannot (rank 1 never calls), each timing out after its own limit."""
    _, comms = memory_world(2)
    x = np.ones(4, np.float32)
    await asyncio.gather(*(c.all_reduce(x, timeout=60) for c in comms))
    loop = asyncio.get_running_loop()
    for limit in (0.3, 0.2):
        start = loop.time()
        with pytest.raises(CollectiveTimeout, match="waiting for rank 1"):
            await comms[0].all_reduce(x, timeout=limit)
        assert limit * 0.9 <= loop.time() - start < limit + 2.0
    await asyncio.gather(*(c.close() for c in comms))


async def test_closing_a_communicator_stops_its_timer() -> None:
    """A closed communicator leaves no timer armed on the loop (the last
    call's deadline would otherwise fire up to its timeout later)."""
    _, comms = memory_world(2)
    x = np.ones(4, np.float32)
    await asyncio.gather(*(c.all_reduce(x, timeout=60) for c in comms))
    timers = [c._engine.deadlines.timer for c in comms]
    assert all(t is not None and not t.cancelled() for t in timers)
    await asyncio.gather(*(c.close() for c in comms))
    assert all(t is not None and t.cancelled() for t in timers)
    assert all(c._engine.deadlines.timer is None for c in comms)
