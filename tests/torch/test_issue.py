"""netcoll.torch.issue: a Work issued without waiting comes back before the loop has issued
the collective (the caller goes on), keeps the calls' order, and hands the issue's errors to
its future; waiting, an argument error raises in the caller."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")

from netcoll.operation import Work
from netcoll.torch.issue import Issuer


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def blocked(loop: asyncio.AbstractEventLoop) -> threading.Event:
    """An event the loop waits for (its thread busy) until the test sets it."""
    release = threading.Event()
    loop.call_soon_threadsafe(lambda: release.wait(10))
    return release


def done_work(loop: asyncio.AbstractEventLoop, value: Any) -> Work[Any]:
    work: Work[Any] = Work("all_reduce", 1, loop=loop)
    work.set_result(value)
    return work


def test_without_waiting_the_work_comes_back_before_the_issue_and_in_order(loop: asyncio.AbstractEventLoop) -> None:
    issue, order = Issuer(object(), loop), []  # type: ignore[arg-type]  # start() ignores the communicator
    release = blocked(loop)

    def start(name: str) -> Any:
        return lambda _comm: order.append(name) or done_work(loop, name)

    first = issue(start("a"), lambda r: [r], wait=False)
    second = issue(start("b"), lambda r: [r], wait=False)
    assert order == [] and not first.is_completed()  # the loop has not issued them yet
    release.set()
    assert first.result() == ["a"] and second.result() == ["b"]
    assert order == ["a", "b"]


def test_the_issues_error_is_the_futures_without_waiting_and_raised_with(loop: asyncio.AbstractEventLoop) -> None:
    issue = Issuer(object(), loop)  # type: ignore[arg-type]

    def bad(_comm: Any) -> Work[Any]:
        raise ValueError("bad shape")

    work = issue(bad, lambda r: r, wait=False)
    with pytest.raises(ValueError, match="bad shape"):
        work.wait()
    with pytest.raises(RuntimeError, match="bad shape"):  # torch's C++ side (DDP) sees an errored future
        work.get_future().wait()
    with pytest.raises(ValueError, match="bad shape"):
        issue(bad, lambda r: r)


def test_an_issue_on_the_loop_thread_keeps_its_place_behind_queued_ones(loop: asyncio.AbstractEventLoop) -> None:
    """A torch future's callback (on netcoll's loop) issuing a collective while an issue of
    autograd's thread is still queued: it goes after that one, as on a rank where the
    callback ran later; with nothing queued it runs at once."""
    issue, order = Issuer(object(), loop), []  # type: ignore[arg-type]
    go, seen = threading.Event(), []

    def start(name: str) -> Any:
        return lambda _comm: order.append(name) or done_work(loop, name)

    def on_loop() -> None:  # the loop thread, busy until the other thread's issue is queued
        go.wait(10)
        later.append(issue(start("b"), lambda r: [r]))  # (wait=True would block this thread: not here)
        seen.append(list(order))

    later: list[Any] = []
    loop.call_soon_threadsafe(on_loop)
    first = issue(start("a"), lambda r: [r], wait=False)
    go.set()
    assert first.result() == ["a"] and later[0].result() == ["b"]
    assert seen == [[]] and order == ["a", "b"]  # b waited for a

    def inline() -> None:
        issue(start("c"), lambda r: [r])
        seen.append(list(order))

    done = threading.Event()
    loop.call_soon_threadsafe(lambda: (inline(), done.set()))
    assert done.wait(10) and seen[-1] == ["a", "b", "c"]  # nothing queued: at once
