"""The segmented, pipelined "receive from one, forward to some" (:func:`relay`) used by
the broadcasts and by point-to-point messages: the first segment carries the message's
size (``meta['nbytes']``), so a receiver without a buffer gets one of that size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import resultpool
from ..errors import MismatchError
from ._args import as_u8, check_segment_bytes, where
from ._common import RELAY_WINDOW, RecvWindow, send_each
from ._scratch import num_segments, split

if TYPE_CHECKING:
    from ..mesh.channel import Channel


async def relay(
    ch: Channel,
    src: int | None,
    dsts: Sequence[int],
    buf: np.ndarray | None,
    meta: dict[str, Any] | None,
    *,
    step: int,
    segment_bytes: int,
    what: str = "broadcast",
    first: tuple[memoryview, dict[str, Any] | None] | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Receive one segmented message from ``src`` and forward every segment to
    each of ``dsts`` as soon as it has arrived (the pipelined core of the chain
    and tree broadcasts and of point-to-point messages). ``first``: segment 0's
    payload and meta, already received from ``src`` (:mod:`.sized` waits for it
    from either of two senders).

    ``src is None`` means this rank originates the message: ``buf`` is sent,
    with ``meta`` (plus ``"nbytes"``) in the header of segment 0. Otherwise
    ``buf`` is the destination — its byte size must equal the sender's, else
    :class:`MismatchError` — or ``None``, and a ``uint8`` buffer of
    ``meta["nbytes"]`` bytes is allocated once segment 0 has told us the size.
    Segment boundaries depend only on the byte size and ``segment_bytes``.

    Returns ``(buf, meta)``: the (possibly new) buffer and the origin's meta.
    """
    check_segment_bytes(segment_bytes)
    if src is None:
        if buf is None:
            raise ValueError(f"{what}: the sending rank must pass a buffer")
        data = as_u8(buf, writeable=False)
        meta = dict(meta or {})
        if meta.setdefault("nbytes", data.nbytes) != data.nbytes:
            raise ValueError(f"{what}: meta['nbytes'] = {meta['nbytes']} but the buffer has {data.nbytes} bytes")
        segs = split(data.nbytes, num_segments(data.nbytes, segment_bytes))
        for j, (a, b) in enumerate(segs):
            m = meta if j == 0 else None
            await send_each(ch, [(d, data[a:b], m) for d in dsts], step=step, chunk=j)
        return buf, meta

    got_meta: dict[str, Any] | None = None
    if buf is None or first is not None:
        # The size is unknown until segment 0 arrives: take it unposted (one
        # copy of at most one segment), then post the rest in place.
        payload, got_meta = first if first is not None else await ch.recv_meta(src, step=step, chunk=0)
        data, segs = _first_segment(ch, src, buf, payload, _nbytes_of(ch, got_meta, what), segment_bytes, what)
        buf = data if buf is None else buf
        a, b = segs[0]
        await send_each(ch, [(d, data[a:b], got_meta) for d in dsts], step=step, chunk=0)
        first_left = 1
    else:
        data = as_u8(buf)
        segs = split(data.nbytes, num_segments(data.nbytes, segment_bytes))
        first_left = 0

    def plan(i: int) -> tuple[int, int, int, np.ndarray]:
        a, b = segs[i + first_left]
        return src, step, i + first_left, data[a:b]

    async with RecvWindow(ch, plan, len(segs) - first_left, RELAY_WINDOW) as window:
        await window.start()
        for i in range(len(segs) - first_left):
            j = i + first_left
            _, m = await window.get(i)
            if j == 0:
                got_meta = m
                nbytes = _nbytes_of(ch, got_meta, what)
                if nbytes != data.nbytes:
                    raise MismatchError(
                        f"{what}: rank {src} sends {nbytes} bytes but this rank's buffer has {data.nbytes}",
                        ranks=(src, ch.rank),
                        **where(ch),
                    )
            a, b = segs[j]
            m = got_meta if j == 0 else None
            await send_each(ch, [(d, data[a:b], m) for d in dsts], step=step, chunk=j)
    assert got_meta is not None
    return buf, got_meta


def _first_segment(
    ch: Channel, src: int, buf: np.ndarray | None, payload: memoryview, nbytes: int, segment_bytes: int, what: str
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The destination bytes (``buf``'s, or a new result buffer of the sender's ``nbytes``)
    with segment 0 in place, and the segments: a MismatchError when ``buf``'s size or
    segment 0's is not the sender's."""
    if buf is None:
        data = resultpool.empty((nbytes,), np.uint8)  # a result: reuses a dropped one's memory
    else:
        data = as_u8(buf)
        if nbytes != data.nbytes:
            raise MismatchError(
                f"{what}: rank {src} sends {nbytes} bytes but this rank's buffer has {data.nbytes}",
                ranks=(src, ch.rank),
                **where(ch),
            )
    segs = split(nbytes, num_segments(nbytes, segment_bytes))
    a, b = segs[0]
    if payload.nbytes != b - a:
        raise MismatchError(
            f"{what}: segment 0 has {payload.nbytes} bytes, expected {b - a} (ranks disagree on segment_bytes?)",
            ranks=(src,),
            **where(ch),
        )
    seg0 = data[a:b]
    got = np.frombuffer(payload, dtype=np.uint8)
    if got.size and got.__array_interface__["data"][0] != seg0.__array_interface__["data"][0]:
        seg0[...] = got  # (a receive posted into this very segment needs no copy)
    return data, segs


def _nbytes_of(ch: Channel, meta: dict[str, Any] | None, what: str) -> int:
    n = None if meta is None else meta.get("nbytes")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise MismatchError(f"{what}: the first segment carries no valid meta['nbytes'] ({meta!r})", **where(ch))
    return n


__all__ = ["relay"]
