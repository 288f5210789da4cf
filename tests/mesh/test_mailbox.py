"""The receive-side demultiplexer on its own: early frames, late frames,
fingerprint mismatches, aborts, lost peers, and posted buffers."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from netcoll.errors import CollectiveAborted, MismatchError, PeerLost
from netcoll.mesh.mailbox import Mailbox
from netcoll.operation import Reason
from netcoll.wire import FrameDecoder, Kind, encode


def hdr(q: int = 0, s: int = 0, c: int = 0, f: str = "fp", g: str = "g") -> dict:
    return {"g": g, "q": q, "s": s, "c": c, "f": f}


async def test_early_frame_is_kept_and_late_frame_dropped() -> None:
    mb = Mailbox(rank=0)
    mb.deliver(1, hdr(q=0), memoryview(b"abcd"))  # before the op opens
    op = mb.open("g", 0, "fp", (0, 1), "test")
    payload, _ = await mb.take(op, (1, 0, 0), None)
    assert bytes(payload) == b"abcd"
    mb.close(op)
    mb.deliver(1, hdr(q=0, s=1), memoryview(b"late"))  # for a finished op: dropped
    assert not mb.early


async def test_fingerprint_mismatch_names_both_calls() -> None:
    mb = Mailbox(rank=0)
    op = mb.open("g", 0, "all_reduce(x=float32[4])", (0, 1), "all_reduce")
    fut = mb.take(op, (1, 0, 0), None)
    mb.deliver(1, hdr(f="all_reduce(x=float32[5])"), memoryview(b"x"))
    with pytest.raises(MismatchError) as info:
        await fut
    assert "float32[4]" in str(info.value) and "float32[5]" in str(info.value)


async def test_abort_before_open_and_lost_peer() -> None:
    mb = Mailbox(rank=0)
    mb.on_abort(2, {"g": "g", "q": 0, "reason": "boom", "origin": 2, "cause": "error"})
    op = mb.open("g", 0, "fp", (0, 1, 2), "x")
    assert isinstance(op.error, CollectiveAborted) and "boom" in str(op.error)
    op2 = mb.open("g", 1, "fp", (0, 1, 2), "x")
    fut = mb.take(op2, (1, 0, 0), None)
    mb.peer_lost(1, ConnectionResetError("gone"))
    with pytest.raises(PeerLost):
        await fut
    assert isinstance(mb.open("g", 2, "fp", (0, 1), "x").error, PeerLost)  # later ops fail at open


async def test_posted_buffer_is_diverted_when_its_op_closes() -> None:
    """A payload being written straight into a caller's buffer stops landing
    there once the collective has ended (failed or cancelled)."""
    mb = Mailbox(rank=0)
    dec = FrameDecoder(sink=lambda kind, header, n: mb.sink(1, header, n))
    mb.divert = lambda src: dec.divert()
    out = np.zeros(8, np.uint8)
    op = mb.open("g", 0, "fp", (0, 1), "x")
    fut = mb.take(op, (1, 0, 0), memoryview(out))
    frame = b"".join(bytes(p) for p in encode(Kind.DATA, hdr(), bytes(range(1, 9))))
    dec.feed(frame[:-5])  # header + 3 payload bytes land in `out`
    assert out[:3].tolist() == [1, 2, 3]
    mb.close(op)  # the caller is done with `out`
    fut.exception() if fut.done() else None
    frames = dec.feed(frame[-5:])
    assert out[3:].tolist() == [0] * 5  # not written after close
    assert len(frames) == 1  # the stream stays in sync
    mb.deliver(1, frames[0].header, frames[0].payload)  # dropped quietly
    await asyncio.sleep(0)


async def test_abort_for_an_op_that_succeeded_here_fails_the_next_one() -> None:
    mb = Mailbox(rank=0)
    op = mb.open("g", 0, "fp", (0, 1), "broadcast")
    mb.close(op)  # succeeded here (a root that only sends)
    mb.on_abort(1, {"g": "g", "q": 0, "reason": "mismatch x vs y", "origin": 1, "cause": "mismatch"})
    nxt = mb.open("g", 1, "fp2", (0, 1), "barrier")
    assert isinstance(nxt.error, CollectiveAborted)
    assert "broadcast #0 failed on rank 1" in str(nxt.error) and "mismatch x vs y" in str(nxt.error)
    mb.close(nxt)
    failed = mb.open("g", 2, "fp", (0, 1), "x")  # an abort for an op that failed here too: nothing more
    failed.fail_with(Reason.ABORTED, "boom")
    mb.close(failed)
    mb.on_abort(1, {"g": "g", "q": 2, "reason": "r", "origin": 1, "cause": "error"})
    assert mb.open("g", 3, "fp", (0, 1), "x").error is None


async def test_a_late_cancel_for_an_op_that_succeeded_here_changes_nothing() -> None:
    """Rank 1 cancelled #0 after this rank had its (right) result: the next operation
    is not failed for it (a cancel leaves the communicator usable)."""
    mb = Mailbox(rank=0)
    mb.close(mb.open("g", 0, "fp", (0, 1), "all_reduce"))
    mb.on_abort(
        1, {"g": "g", "q": 0, "reason": "all_reduce #0 was cancelled on rank 1", "origin": 1, "cause": "cancelled"}
    )
    assert mb.open("g", 1, "fp", (0, 1), "x").error is None
