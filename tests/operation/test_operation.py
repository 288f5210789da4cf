"""The operation state machine and the mailbox's routing, without any
mesh: states, first-cause-wins failures, and the exactly-once
``released`` accounting that flow control relies on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from netcoll.errors import CollectiveAborted, CollectiveCancelled, CollectiveClosed, MismatchError, PeerLost
from netcoll.mesh.mailbox import Mailbox
from netcoll.operation import Failure, Operation, Reason, State


def hdr(q: int = 0, s: int = 0, c: int = 0, f: str = "fp", g: str = "g") -> dict[str, Any]:
    return {"g": g, "q": q, "s": s, "c": c, "f": f}


def ledger(mb: Mailbox) -> list[tuple[int, int]]:
    log: list[tuple[int, int]] = []
    mb.released = lambda src, n: log.append((src, n))
    return log


async def test_life_and_first_cause_wins() -> None:
    op = Operation("g", 0, "fp", (0, 1), "x")
    assert op.state is State.ISSUED
    op.start()
    fut = op.take((1, 0, 0), None)
    assert op.fail(Failure(Reason.TIMEOUT, "late", (1,)))
    assert not op.fail(Failure(Reason.PEER_LOST, "gone", (1,)))
    assert op.state is State.FAILED and op.failure is not None and op.failure.reason is Reason.TIMEOUT
    with pytest.raises(TimeoutError):
        await fut
    done = Operation("g", 1, "fp", (0, 1), "x")
    done.start()
    done.close()
    assert done.state is State.SUCCEEDED
    assert not done.fail(Failure(Reason.ERROR, "after the end"))


@pytest.mark.parametrize(
    ("cause", "cls"),
    [
        ("cancelled", CollectiveCancelled),
        ("timeout", CollectiveAborted),
        ("error", CollectiveAborted),
        ("whatever", CollectiveAborted),
    ],
)
async def test_abort_frames_become_typed_failures(cause: str, cls: type) -> None:
    op = Operation("g", 0, "fp", (0, 1, 2), "all_reduce")
    op.start()
    op.on_abort({"g": "g", "q": 0, "origin": 2, "cause": cause, "reason": "why", "ranks": [2]}, 0)
    assert type(op.error) is cls and op.error.ranks == (2,)  # type: ignore[union-attr]
    assert op.failure is not None and op.failure.told  # not echoed back


async def test_waiters_and_rts_end_with_the_operation() -> None:
    op = Operation("g", 0, "fp", (0, 1), "x")
    op.start()
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    op.watch(waiter)
    answers: list[bool] = []
    op.when_posted((1, 0, 0), answers.append)
    op.take((1, 0, 0), None)
    op.when_posted((1, 1, 0), answers.append)
    assert answers == [True]
    op.fail(Failure(Reason.PEER_LOST, "gone", (1,)))
    assert answers == [True, False]
    with pytest.raises(PeerLost):
        await waiter
    finished = Operation("g", 1, "fp", (0, 1), "x")
    finished.start()
    finished.close()
    late: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    finished.watch(late)
    with pytest.raises(CollectiveClosed):
        await late


async def test_released_once_for_every_held_payload() -> None:
    mb = Mailbox(rank=0)
    log = ledger(mb)
    mb.deliver(1, hdr(q=0, c=0), memoryview(bytearray(10)))  # early: held
    mb.deliver(1, hdr(q=0, c=1), memoryview(bytearray(20)))  # early: held, never taken
    assert log == [] and mb.early_bytes == 30
    op = mb.open("g", 0, "fp", (0, 1), "x")
    await mb.take(op, (1, 0, 0), memoryview(bytearray(10)))
    assert log == [(1, 10)]
    mb.close(op)  # the untaken one is dropped
    assert log == [(1, 10), (1, 20)] and mb.early_bytes == 0
    mb.deliver(1, hdr(q=0, c=2), memoryview(bytearray(5)))  # late frame of a finished op
    assert log[-1] == (1, 5)


async def test_frames_for_an_operation_opened_after_a_later_one_are_kept() -> None:
    """Operations in flight open in whatever order their tasks run: #1 awaited
    first runs inline and opens before #0. Frames, aborts and RTSes for #0
    arriving then are held for it, not dropped as if #0 had finished (the cause
    of the in-flight deadlock of issue 34); once #0 closes, its late frames are."""
    mb = Mailbox(rank=0)
    log = ledger(mb)
    later = mb.open("g", 1, "fp", (0, 1), "x")
    mb.deliver(1, hdr(q=0), memoryview(bytearray(b"abcd")))
    answers: list[bool] = []
    mb.when_posted(1, hdr(q=0, s=1), answers.append)
    assert log == [] and answers == []
    earlier = mb.open("g", 0, "fp", (0, 1), "x")
    payload, _ = await mb.take(earlier, (1, 0, 0), None)
    assert bytes(payload) == b"abcd" and log == [(1, 4)]
    mb.take(earlier, (1, 1, 0), None)
    assert answers == [True]
    mb.close(later)
    mb.deliver(1, hdr(q=1), memoryview(bytearray(3)))  # #1 finished before #0: dropped
    assert log[-1] == (1, 3)
    mb.on_abort(1, {**hdr(q=0), "origin": 1, "cause": "error", "reason": "boom", "ranks": [1]})
    assert earlier.state is State.FAILED  # #0 still open: the abort reaches it
    mb.close(earlier)
    mb.when_posted(1, hdr(q=0, s=2), answers.append)
    assert answers == [True, False]  # both finished: an RTS is told so at once
    assert mb.finished["g"].below == 2 and not mb.finished["g"].above


async def test_payload_written_in_place_is_never_released() -> None:
    mb = Mailbox(rank=0)
    log = ledger(mb)
    op = mb.open("g", 0, "fp", (0, 1), "x")
    out = memoryview(bytearray(8))
    fut = mb.take(op, (1, 0, 0), out)
    target = mb.sink(1, hdr(), 8)
    assert target is out
    mb.deliver(1, hdr(), target)
    await fut
    posted_none = mb.take(op, (1, 1, 0), None)  # a receive posted without a buffer
    assert mb.sink(1, hdr(s=1), 4) is None
    mb.deliver(1, hdr(s=1), memoryview(bytearray(4)))
    await posted_none
    mb.close(op)
    assert log == [(1, 4)]


async def test_when_posted_before_the_operation_opens() -> None:
    mb = Mailbox(rank=0)
    answers: list[bool] = []
    mb.when_posted(1, hdr(q=3), answers.append)  # an RTS for a future operation
    mb.when_posted(1, hdr(q=0, s=9), answers.append)
    op0 = mb.open("g", 0, "fp", (0, 1), "x")
    mb.close(op0)  # op 0 never posted step 9
    assert answers == [False]
    mb.when_posted(1, hdr(q=0), answers.append)  # a finished operation
    assert answers == [False, False]
    for q in (1, 2):
        mb.close(mb.open("g", q, "fp", (0, 1), "x"))
    op3 = mb.open("g", 3, "fp", (0, 1), "x")
    mb.take(op3, (1, 0, 0), None)
    assert answers == [False, False, True]
    mb.close(op3)


async def test_a_wait_for_a_posted_receive_can_be_taken_back() -> None:
    """``unwait``: a callback given to ``when_posted`` (for an open operation or one not
    open yet) is forgotten, and is never called; the others still are."""
    mb = Mailbox(rank=0)
    answers: list[tuple[str, bool]] = []

    def waiter(name: str) -> Any:
        return lambda posted: answers.append((name, posted))

    early, kept = waiter("early"), waiter("kept")
    mb.when_posted(1, hdr(q=1), early)
    mb.when_posted(1, hdr(q=1), kept)
    mb.unwait(1, hdr(q=1), early)
    mb.unwait(1, hdr(q=1, s=5), kept)  # another slot: nothing to forget
    op0 = mb.open("g", 0, "fp", (0, 1), "x")
    gone, stays = waiter("gone"), waiter("stays")
    mb.when_posted(1, hdr(q=0), gone)
    mb.when_posted(1, hdr(q=0), stays)
    mb.unwait(1, hdr(q=0), gone)
    mb.unwait(1, hdr(q=0), gone)  # twice: nothing more
    mb.take(op0, (1, 0, 0), None)
    assert answers == [("stays", True)]
    only = waiter("only")
    mb.when_posted(1, hdr(q=0, s=2), only)
    mb.unwait(1, hdr(q=0, s=2), only)
    assert not op0.rts  # nothing left behind for the slot
    mb.close(op0)
    op1 = mb.open("g", 1, "fp", (0, 1), "x")
    mb.close(op1)
    assert answers == [("stays", True), ("kept", False)] and not mb.early_rts


async def test_sends_are_lent_from_the_step_an_algorithm_says() -> None:
    """Operations that only move data lend from step 0; the reductions (and calibrate)
    from no step, unless their algorithm says from which one (``Channel.lend_from``)."""
    from netcoll.mesh.channel import Channel
    from netcoll.mesh.inprocess import MemoryHub

    t = MemoryHub(2).meshes[0]
    moving = t.mailbox.open("g", 0, "fp", (0, 1), "all_gather")
    reducing = t.mailbox.open("g", 1, "fp", (0, 1), "all_reduce")
    assert t.mailbox.lends(hdr(q=0, s=0)) and not t.mailbox.lends(hdr(q=1, s=0))
    assert not t.mailbox.lends(hdr(q=1, s=1 << 40)) and not t.mailbox.lends(hdr(q=7))  # (not open)
    ch = Channel(t, reducing)
    ch.lend_from(3)
    ch.lend_from(5)  # a later step changes nothing
    assert [t.mailbox.lends(hdr(q=1, s=s)) for s in (0, 2, 3, 9)] == [False, False, True, True]
    for op in (moving, reducing):
        t.mailbox.close(op)


async def test_wrong_size_into_a_posted_buffer_fails_that_receive() -> None:
    """The receive whose buffer did not fit must raise, not hang (its future
    was already taken off the posted list when the frame arrived)."""
    mb = Mailbox(rank=0)
    op = mb.open("g", 0, "fp", (0, 1), "broadcast")
    fut = mb.take(op, (1, 0, 0), memoryview(bytearray(8)))
    mb.deliver(1, hdr(), memoryview(bytearray(6)))
    with pytest.raises(MismatchError, match="6 bytes"):
        await asyncio.wait_for(fut, 5)


async def test_a_receive_from_either_of_two_senders() -> None:
    """take_either posts one future under both keys: the first message completes it (its
    header says which came), the other key is withdrawn without cancelling it, and the
    operation closes with nothing posted; a failure reaches it once; a message that had
    already arrived is taken at once."""
    a, b = (1, 0, 0), (2, 1, 0)
    op = Operation("g", 0, "fp", (0, 1, 2), "broadcast")
    op.start()
    fut = op.take_either((a, b), None)
    assert op.posted[a][0] is op.posted[b][0] is fut
    op.deliver(2, hdr(s=1), memoryview(b"chain"), held=False)
    payload, header = await fut
    assert bytes(payload) == b"chain" and header["s"] == 1
    op.withdraw(a)
    op.withdraw(b)  # (delivered already: nothing)
    assert op.posted == {} and not fut.cancelled()
    op.close()
    assert op.state is State.SUCCEEDED

    pending = Operation("g", 1, "fp", (0, 1, 2), "broadcast")
    pending.start()
    fut = pending.take_either((a, b), None)
    pending.withdraw(a)
    assert not fut.cancelled() and b in pending.posted  # still posted under the other key
    pending.withdraw(b)
    assert fut.cancelled() and pending.posted == {}

    failing = Operation("g", 2, "fp", (0, 1, 2), "broadcast")
    failing.start()
    fut = failing.take_either((a, b), None)
    failing.fail(Failure(Reason.PEER_LOST, "gone", (1,)))
    with pytest.raises(PeerLost):
        await fut

    early = Operation("g", 3, "fp", (0, 1, 2), "broadcast")
    early.start()
    early.deliver(1, hdr(q=3, s=0), memoryview(b"tree"), held=False)
    fut = early.take_either((a, b), None)
    assert fut.done() and bytes(fut.result()[0]) == b"tree" and early.posted == {}


async def test_a_receive_from_either_sender_outlives_the_one_that_left_in_order() -> None:
    """A non-root of a ``sized`` broadcast waits for segment 0 from its tree parent or its
    chain parent; the one the root did not choose may finish and leave in order (BYE)
    first: the receive still waits for the other. Only when both are gone does it fail.
    (It failed with PeerLost at once: found by the schedule explorer, 8 ranks over TCP,
    a rank that finished its last seed and left.)"""
    a, b = (1, 0, 0), (2, 1, 0)
    mb = Mailbox(0)
    op = mb.open("g", 0, "fp", (0, 1, 2), "broadcast")
    fut = mb.take_either(op, (a, b), None)
    mb.peer_lost(2, ConnectionResetError("closed by peer"), graceful=True)
    assert op.state is State.RUNNING and not fut.done()
    mb.deliver(1, hdr(), memoryview(b"tree"))
    assert bytes((await fut)[0]) == b"tree"
    mb.close(op)
    late = mb.open("g", 1, "fp", (0, 1, 2), "broadcast")  # opened after rank 2 left
    fut = mb.take_either(late, (a, b), None)
    assert late.state is State.RUNNING
    mb.peer_lost(1, ConnectionResetError("closed by peer"), graceful=True)  # now no sender is left
    with pytest.raises(PeerLost, match="rank 1"):
        await fut
    gone = mb.open("g", 2, "fp", (0, 1, 2), "broadcast")
    with pytest.raises(PeerLost):
        await mb.take_either(gone, (a, b), None)
