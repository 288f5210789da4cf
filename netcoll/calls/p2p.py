"""Plans of point-to-point messages: ``send`` and ``recv``.

Each ordered pair ``(src, dst)`` and ``tag`` is a sequence of its own (a
group named ``<group>/p2p/<tag>/<src>><dst>``): the n-th ``send`` to a rank
with a tag matches that rank's n-th ``recv`` from us with that tag,
whatever else runs in between.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .. import algorithms
from ..arrays import array_from_meta, as_array, meta_of
from ..engine import Call, Engine
from ..mesh.channel import Channel, as_bytes
from ..tensors import from_peer
from ._common import fp


def _route(e: Engine, src: Any, dst: Any, tag: Any) -> tuple[str, int, tuple[int, ...], dict[int, int]]:
    """The message's (group, seq, world ranks, their ranks in the communicator): the
    seq is taken now. Errors name the communicator's ranks, not 0 and 1 of the pair."""
    if isinstance(tag, bool) or not isinstance(tag, numbers.Integral) or tag < 0:
        raise ValueError(f"tag must be a non-negative int, got {tag!r}")
    for what, r in (("dst", dst), ("src", src)):
        if isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 0 <= int(r) < e.world_size:
            raise ValueError(f"{what} must be a rank in 0..{e.world_size - 1}, got {r!r}")
    if src == dst:
        raise ValueError(f"rank {src} cannot send to itself")
    group = f"{e.group}/p2p/{tag}/{src}>{dst}"
    seq = e.p2p_seq.get(group, 0)
    e.p2p_seq[group] = seq + 1
    return group, seq, (e.members[src], e.members[dst]), e.rank_labels


def send(e: Engine, x: Any, dst: Any, tag: Any, torch: bool = False) -> Call:
    arr = as_array(x)
    data = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
    group, seq, members, labels = _route(e, e.rank, dst, tag)
    return Call(
        "send",
        fp(e, "p2p"),
        lambda ch: algorithms.direct.send_message(
            ch, 1, data, meta=meta_of(data, torch), segment_bytes=e.segment_bytes
        ),
        lambda _: None,
        group=group,
        seq=seq,
        members=members,
        labels=labels,
    )


def recv(e: Engine, src: Any, tag: Any) -> Call:
    group, seq, members, labels = _route(e, src, e.rank, tag)

    async def body(ch: Channel) -> Any:
        buf, meta = await algorithms.direct.recv_message(ch, 0, segment_bytes=e.segment_bytes)
        return from_peer(array_from_meta(meta, as_bytes(buf)), meta)  # a tensor if a tensor was sent

    return Call("recv", fp(e, "p2p"), body, group=group, seq=seq, members=members, labels=labels)
