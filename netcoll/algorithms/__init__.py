"""Collective algorithms, one module per family, and their registry :data:`ALGORITHMS`.

Algorithms are coroutines over a :class:`~netcoll.mesh.channel.Channel`
(one operation's ``send``/``recv`` to group ranks); they know nothing of
sockets, the coordinator or the wire. They work in place on caller buffers
(C-contiguous numpy arrays), fold with :func:`netcoll.ops.reduce_into`, and
never call :func:`netcoll.ops.finalize` — ``avg`` comes back as a sum and the
caller divides once. Every rank of one operation must run the same algorithm
with the same sizes and the same ``segment_bytes``.

Uniform signatures, per collective (``ALGORITHMS[collective][name]``); every
one also takes ``segment_bytes: int = DEFAULT_SEGMENT_BYTES`` as a keyword:

==================  =========================  ==============================================
collective          algorithms                 call
==================  =========================  ==============================================
``all_reduce``      ring, tree, doubling,      ``fn(ch, buf, op) -> None``  (buf in place,
                    allpairs, halving,         bit-identical on every rank; weighted
                    weighted                   also takes ``rates=``, the agreed
                                               per-rank bandwidths)
``broadcast``       tree, ring, sized          ``fn(ch, buf_or_None, root, meta=None)
                                               -> (buf, meta)`` (sized: also
                                               ``chain=``, the root's choice,
                                               and ``ran=``)
``reduce``          tree, ring                 ``fn(ch, buf, op, root) -> None``  (result in
                                               the root's buf; others' buf clobbered)
``all_gather``      ring, doubling             ``fn(ch, buf) -> None``  (P equal blocks, own
                                               block filled; the rest are filled)
``reduce_scatter``  ring, halving              ``fn(ch, buf, op, out) -> None``  (buf: P
                                               blocks, read-only; out: one block)
``all_to_all``      pairwise, linear           ``fn(ch, send, recv) -> None``  (P blocks each)
``gather``          direct                     ``fn(ch, send, recv_or_None, root) -> None``
``scatter``         direct                     ``fn(ch, send_or_None, recv, root) -> None``
``barrier``         doubling                   ``fn(ch) -> None``
==================  =========================  ==============================================

Compressed reductions (``compression=``) run :mod:`.compressed` (an all_to_all of
encoded shards, a reduction in the input's dtype, then an all_gather or gather of the
encoded result); it is not in the table: its signature takes the codec and the
all_to_all it runs.

Block buffers (all_gather, all_to_all, gather, scatter) are handled as raw
bytes; reduction buffers keep their dtype. Which one ``algorithm="auto"``
runs is :mod:`netcoll.selection`'s business. Point-to-point messages of any
size use :func:`netcoll.algorithms.direct.send_message` / ``recv_message``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from . import (
    allpairs,
    compressed,
    direct,
    doubling,
    halving,
    linear,
    pairwise,
    ring,
    sized,
    tree,
    weighted,
)
from ._scratch import DEFAULT_SEGMENT_BYTES

__all__ = [
    "ALGORITHMS",
    "DEFAULT_SEGMENT_BYTES",
    "allpairs",
    "compressed",
    "direct",
    "doubling",
    "linear",
    "pairwise",
    "ring",
    "sized",
    "tree",
    "weighted",
]

ALGORITHMS: Final[dict[str, dict[str, Callable[..., Any]]]] = {
    "all_reduce": {
        "ring": ring.all_reduce,
        "tree": tree.all_reduce,
        "doubling": doubling.all_reduce,
        "allpairs": allpairs.all_reduce,
        "halving": halving.all_reduce,
        "weighted": weighted.all_reduce,
    },
    "broadcast": {"tree": tree.broadcast, "ring": ring.broadcast, "sized": sized.broadcast},
    "reduce": {"tree": tree.reduce, "ring": ring.reduce},
    "all_gather": {"ring": ring.all_gather, "doubling": doubling.all_gather},
    "reduce_scatter": {"ring": ring.reduce_scatter, "halving": halving.reduce_scatter},
    "all_to_all": {"pairwise": pairwise.all_to_all, "linear": linear.all_to_all},
    "gather": {"direct": direct.gather},
    "scatter": {"direct": direct.scatter},
    "barrier": {"doubling": doubling.barrier},
}
