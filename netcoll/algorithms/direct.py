"""Direct (flat, one-to-all / all-to-one) algorithms: gather, scatter, and
segmented point-to-point messages.

* **gather**: every non-root sends its block to the root, which has posted
  receives straight into ``recv`` (segment-major, up to ``RELAY_WINDOW``
  segments per rank ahead, so every rank's stream lands in place). The
  non-roots' sends are synchronous (``Channel.sync_from``): over TCP one of
  512 KiB or more waits for the root's receive, so a non-root does not run
  calls ahead of the root and have it hold and copy its blocks twice
  (measured 1.1-1.24x at 4-16 MiB, 4 ranks).
* **scatter**: the root sends block ``k`` to rank ``k``, segment-major across
  ranks so every rank's stream starts at once; the others receive in place.
* **send_message / recv_message**: one message of any size from one rank to
  another, cut into segments of at most ``segment_bytes``, with the sender's
  ``meta`` (plus ``"nbytes"``) in the header of segment 0 so the receiver can
  pass ``out=None`` and have a buffer allocated.
* **gather_list / scatter_list** (the "v" variants, MPI's ``gatherv`` /
  ``scatterv``): blocks of *different* sizes, each sent as one such message,
  so its size and the sender's ``meta`` (dtype, shape) travel with it and the
  receiver allocates. The root posts every peer's receive at once (gather) or
  sends segment-major across ranks so every stream starts at once (scatter).

Flat trees are latency-optimal (one step) and move each byte once, but the
root's link carries everything, so they suit moderate sizes and P.

Cost, ``P`` ranks, blocks of ``B`` bytes, a message of ``N`` bytes:

* ``gather``: 1 step; each non-root sends ``B``, the root receives ``(P-1) B``.
* ``scatter``: 1 step; the root sends ``(P-1) B``, each non-root receives ``B``.
* ``send_message``: 1 step; ``N`` bytes in ``max(1, ceil(N/segment_bytes))``
  messages.
* ``gather_list`` / ``scatter_list``: as gather/scatter with ``B_k`` the
  block of rank ``k``: the root receives (sends) ``sum of B_k, k != root``;
  the first segment of each block is copied once (its size is not known
  before it arrives), the rest land in place.

Bits: pure data movement.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrays import contiguous_copy
from ._args import as_u8, check_root, check_segment_bytes
from ._common import RELAY_WINDOW, RecvWindow, gather_all, send_each
from ._relay import relay
from ._scratch import DEFAULT_SEGMENT_BYTES, num_segments, split

if TYPE_CHECKING:
    from ..mesh.channel import Channel

__all__ = ["gather", "gather_list", "recv_message", "scatter", "scatter_list", "send_message"]


def _blocks(ch: Channel, block: int, whole: np.ndarray, name: str) -> None:
    if whole.nbytes != ch.size * block:
        raise ValueError(f"{name} has {whole.nbytes} bytes, not {ch.size} blocks of {block}")


async def gather(
    ch: Channel, send: np.ndarray, recv: np.ndarray | None, root: int, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> None:
    """Direct gather: the root's ``recv`` block ``k`` = rank ``k``'s ``send``.

    Args:
        send: this rank's block (C-contiguous, handled as bytes), same byte
            size on every rank.
        recv: root: writeable C-contiguous array of ``P`` such blocks. Others:
            ``None`` (ignored).
        root: the gathering rank.
    """
    check_root(ch, root)
    check_segment_bytes(segment_bytes)
    mine = as_u8(send, "send", writeable=False)
    P, r = ch.size, ch.rank
    block = mine.nbytes
    segs = split(block, num_segments(block, segment_bytes))
    if r != root:
        ch.sync_from(0)  # wait for the root's receive: not ahead of it, into its memory
        for j, (a, b) in enumerate(segs):
            await ch.send(root, mine[a:b], step=0, chunk=j)
        return
    if recv is None:
        raise ValueError("gather: the root must pass a recv buffer")
    whole = as_u8(recv, "recv")
    _blocks(ch, block, whole, "gather recv")
    whole[root * block : (root + 1) * block] = mine
    peers = [(root + k) % P for k in range(1, P)]
    n = len(peers)

    def plan(i: int) -> tuple[int, int, int, np.ndarray]:
        j, k = divmod(i, n)
        a, b = segs[j]
        return peers[k], 0, j, whole[peers[k] * block + a : peers[k] * block + b]

    async with RecvWindow(ch, plan, n * len(segs), RELAY_WINDOW * n) as window:
        await window.start()
        for i in range(n * len(segs)):
            await window.get(i)


async def scatter(
    ch: Channel, send: np.ndarray | None, recv: np.ndarray, root: int, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> None:
    """Direct scatter: ``recv`` = block ``ch.rank`` of the root's ``send``.

    Args:
        send: root: C-contiguous array of ``P`` equal blocks. Others: ``None``.
        recv: writeable C-contiguous array of one block's byte size.
        root: the scattering rank.
    """
    check_root(ch, root)
    check_segment_bytes(segment_bytes)
    mine = as_u8(recv, "recv")
    P, r = ch.size, ch.rank
    block = mine.nbytes
    segs = split(block, num_segments(block, segment_bytes))
    if r == root:
        if send is None:
            raise ValueError("scatter: the root must pass a send buffer")
        whole = as_u8(send, "send", writeable=False)
        _blocks(ch, block, whole, "scatter send")
        mine[:] = whole[root * block : (root + 1) * block]
        peers = [(root + k) % P for k in range(1, P)]
        for j, (a, b) in enumerate(segs):
            await send_each(ch, [(p, whole[p * block + a : p * block + b], None) for p in peers], step=0, chunk=j)
        return

    def plan(j: int) -> tuple[int, int, int, np.ndarray]:
        a, b = segs[j]
        return root, 0, j, mine[a:b]

    async with RecvWindow(ch, plan, len(segs), RELAY_WINDOW) as window:
        await window.start()
        for j in range(len(segs)):
            await window.get(j)


async def send_message(
    ch: Channel,
    peer: int,
    data: np.ndarray,
    *,
    meta: dict[str, Any] | None = None,
    step: int = 0,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> dict[str, Any]:
    """Send ``data`` (any C-contiguous array) to ``peer`` in segments.

    Returns:
        The meta actually sent (``meta`` plus ``"nbytes"``).
    """
    check_root(ch, peer)
    _, sent = await relay(ch, None, [peer], data, meta, step=step, segment_bytes=segment_bytes, what="send")
    return sent


async def recv_message(
    ch: Channel, peer: int, out: np.ndarray | None = None, *, step: int = 0, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> tuple[np.ndarray, dict[str, Any]]:
    """Receive one :func:`send_message` from ``peer``.

    Args:
        out: ``None`` (a flat ``uint8`` buffer of the sender's size is
            allocated) or a writeable C-contiguous array of exactly the
            sender's byte size (else :class:`~netcoll.errors.MismatchError`).

    Returns:
        ``(buffer, meta)``.
    """
    check_root(ch, peer)
    return await relay(ch, peer, [], out, None, step=step, segment_bytes=segment_bytes, what="recv")


Message = tuple[np.ndarray, dict[str, Any]]


def _own(block: np.ndarray, meta: dict[str, Any] | None, name: str) -> Message:
    """This rank's own block, as a receiver would see it: a fresh flat
    ``uint8`` copy and the meta (plus ``"nbytes"``)."""
    data = as_u8(block, name, writeable=False)
    return contiguous_copy(data), dict(meta or {}, nbytes=data.nbytes)


async def gather_list(
    ch: Channel,
    block: np.ndarray,
    root: int,
    *,
    meta: dict[str, Any] | None = None,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> list[Message] | None:
    """Direct gather of blocks of any (per-rank different) byte size.

    Args:
        block: this rank's block (any C-contiguous array, handled as bytes).
        root: the gathering rank.
        meta: a small msgpack-able dict sent along (e.g. dtype and shape);
            ``"nbytes"`` is added.

    Returns:
        Root: ``[(buffer, meta)]`` indexed by rank — ``buffer`` a new flat
        ``uint8`` array with rank ``k``'s bytes, ``meta`` rank ``k``'s meta
        (its own entry is a copy). Others: ``None``.
    """
    check_root(ch, root)
    check_segment_bytes(segment_bytes)
    P, r = ch.size, ch.rank
    if r != root:
        await send_message(ch, root, block, meta=meta, segment_bytes=segment_bytes)
        return None
    out: list[Message | None] = [None] * P
    out[root] = _own(block, meta, "block")
    peers = [(root + k) % P for k in range(1, P)]
    tasks = [asyncio.ensure_future(recv_message(ch, p, segment_bytes=segment_bytes)) for p in peers]
    for p, got in zip(peers, await gather_all(tasks), strict=True):
        out[p] = got
    return out  # type: ignore[return-value]


async def scatter_list(
    ch: Channel,
    blocks: Sequence[np.ndarray] | None,
    root: int,
    *,
    metas: Sequence[dict[str, Any] | None] | None = None,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> Message:
    """Direct scatter of blocks of any (per-rank different) byte size.

    Args:
        blocks: root: ``P`` C-contiguous arrays, block ``k`` for rank ``k``.
            Others: ``None`` (ignored).
        root: the scattering rank.
        metas: root only: ``P`` small dicts (or ``None``), ``metas[k]``
            delivered with block ``k``; ``"nbytes"`` is added.

    Returns:
        ``(buffer, meta)`` on every rank: a new flat ``uint8`` array with this
        rank's block and the meta sent with it.
    """
    check_root(ch, root)
    check_segment_bytes(segment_bytes)
    P, r = ch.size, ch.rank
    if r != root:
        return await recv_message(ch, root, segment_bytes=segment_bytes)
    if blocks is None or len(blocks) != P:
        raise ValueError(
            f"scatter_list: the root must pass {P} blocks, got {'None' if blocks is None else len(blocks)}"
        )
    if metas is None:
        metas = [None] * P
    if len(metas) != P:
        raise ValueError(f"scatter_list: {len(metas)} metas for {P} blocks")
    datas = [as_u8(b, f"blocks[{k}]", writeable=False) for k, b in enumerate(blocks)]
    sent = [dict(m or {}, nbytes=d.nbytes) for m, d in zip(metas, datas, strict=True)]
    # The same cut recv_message expects; segment-major across ranks so every
    # rank's stream starts at once.
    segs = [split(d.nbytes, num_segments(d.nbytes, segment_bytes)) for d in datas]
    peers = [(root + k) % P for k in range(1, P)]
    for j in range(max((len(segs[p]) for p in peers), default=0)):
        sends = [(p, datas[p][slice(*segs[p][j])], sent[p] if j == 0 else None) for p in peers if j < len(segs[p])]
        await send_each(ch, sends, step=0, chunk=j)
    return contiguous_copy(datas[root]), sent[root]
