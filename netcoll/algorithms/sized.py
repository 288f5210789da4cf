"""Broadcast by size, chosen by the root alone: the pipelined binomial tree or the
pipelined chain, for a message whose size only the root may know.

``"auto"`` must choose a collective's algorithm alike on every rank, from what every
rank knows. A broadcast's non-roots may pass ``None`` and learn the size from the
data, so they cannot choose by it: before this, ``auto`` always ran the tree, and on a
1 Gbit/s link the chain was 1.5-2x faster from 64 KiB (docs/emulated-network.md). Here
the root chooses (``chain``: the plan's verdict for this size, its links and the cost
model) and says so by where it sends: the tree's segments go out at step 0, the
chain's at step 1. A non-root posts a receive for segment 0 from both the parent it
has in the tree and the one it has in the chain (two steps apart, so the two never
match each other's message, even when they are the same rank), takes whichever
comes (one receive posted under both: :meth:`Channel.post_either`, as cheap as one),
withdraws the other (:meth:`Channel.unpost`), and runs the rest of that
algorithm (:func:`._relay.relay`): it forwards to its children of the same shape,
so every rank follows the root's choice and no rank ever hears from both parents.
With one or two ranks the two shapes are the same, and this is the tree.

Cost: the tree's or the chain's (:mod:`.tree`, :mod:`.ring`), whichever the root
ran; every non-root posts its first receive under two keys and withdraws one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ._args import as_u8, check_root
from ._relay import relay
from ._scratch import DEFAULT_SEGMENT_BYTES, num_segments, split
from .ring import chain_links
from .tree import links as tree_links

if TYPE_CHECKING:
    from ..mesh.channel import Channel

__all__ = ["broadcast"]

TREE_STEP = 0
CHAIN_STEP = 1


async def broadcast(
    ch: Channel,
    buf: np.ndarray | None,
    root: int,
    meta: dict[str, Any] | None = None,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    chain: bool = False,
    ran: Callable[[str], None] | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Broadcast the root's ``buf`` by the tree or the chain, as the root chooses.

    Args:
        buf, root, meta: as for :func:`netcoll.algorithms.tree.broadcast` (a
            non-root passes ``None`` or a buffer of exactly the root's size).
        chain: read by the root only: run the chain (else the tree).
        ran: told the shape this rank runs, once it knows it (the root at once, the
            others when segment 0 arrives): ``"ring"`` (the chain) or ``"tree"``, the
            names of :data:`netcoll.selection.cost.FORMULAS` (the model learns from it).

    Returns:
        ``(buf, meta)`` on every rank.
    """
    check_root(ch, root)
    tree, chained = tree_links(ch, root), chain_links(ch, root)
    tell = ran if ran is not None else _ignore
    if ch.size <= 2:
        tell("tree")
        return await relay(ch, tree[0], tree[1], buf, meta, step=TREE_STEP, segment_bytes=segment_bytes)
    if ch.rank == root:
        step, (_, dsts) = (CHAIN_STEP, chained) if chain else (TREE_STEP, tree)
        tell("ring" if chain else "tree")
        return await relay(ch, None, dsts, buf, meta, step=step, segment_bytes=segment_bytes)
    (tree_parent, tree_children), (chain_parent, chain_children) = tree, chained
    assert tree_parent is not None and chain_parent is not None
    out = None if buf is None else _segment0(buf, segment_bytes)
    got = ch.post_either(((tree_parent, TREE_STEP), (chain_parent, CHAIN_STEP)), out=out)
    try:
        payload, header = await got
    finally:  # the shape that did not send (or both, if this failed or was cancelled)
        ch.unpost(tree_parent, step=TREE_STEP)
        ch.unpost(chain_parent, step=CHAIN_STEP)
    if header["s"] == CHAIN_STEP:
        src, step, dsts = chain_parent, CHAIN_STEP, chain_children
    else:
        src, step, dsts = tree_parent, TREE_STEP, tree_children
    tell("ring" if step == CHAIN_STEP else "tree")
    return await relay(
        ch, src, dsts, buf, None, step=step, segment_bytes=segment_bytes, first=(payload, header.get("m"))
    )


def _ignore(shape: str) -> None:
    """No one asked which shape ran."""


def _segment0(buf: np.ndarray, segment_bytes: int) -> np.ndarray:
    """The bytes of ``buf`` segment 0 lands in, if the root's size is ``buf``'s (else the
    receive's size check makes it a MismatchError)."""
    data = as_u8(buf)
    a, b = split(data.nbytes, num_segments(data.nbytes, segment_bytes))[0]
    return data[a:b]
