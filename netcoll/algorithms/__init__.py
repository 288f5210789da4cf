"""Collective algorithms, one module per family, and the table that picks one.

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
                    allpairs, halving          bit-identical on every rank)
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

Block buffers (all_gather, all_to_all, gather, scatter) are handled as raw
bytes; reduction buffers keep their dtype. :func:`choose` maps
``algorithm="auto"`` to a name by the table (:mod:`.table`, by the group's
links: :mod:`.media`); :func:`decide` maps it to
``(name, segment_bytes, predicted seconds)`` by the cost model
(:mod:`.cost`) when the group's parameters are known, and
:func:`overrides_from_env` reads ``NETCOLL_ALGO``. Point-to-point messages of any size use
:func:`netcoll.algorithms.direct.send_message` / ``recv_message``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..errors import ConfigError
from . import (
    allpairs,
    cost,
    direct,
    doubling,
    halving,
    linear,
    media,
    pairwise,
    probe,
    ring,
    sized,
    table,
    tree,
    tuning,
)
from ._common import DEFAULT_SEGMENT_BYTES

__all__ = [
    "ALGORITHMS",
    "ALGO_ENV",
    "DEFAULT_SEGMENT_BYTES",
    "allpairs",
    "choose",
    "cost",
    "decide",
    "overrides_from_env",
    "parse_overrides",
    "probe",
    "tuning",
    "direct",
    "doubling",
    "linear",
    "media",
    "pairwise",
    "ring",
    "sized",
    "table",
    "tree",
]

ALGORITHMS: Final[dict[str, dict[str, Callable[..., Any]]]] = {
    "all_reduce": {
        "ring": ring.all_reduce,
        "tree": tree.all_reduce,
        "doubling": doubling.all_reduce,
        "allpairs": allpairs.all_reduce,
        "halving": halving.all_reduce,
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


def choose(
    collective: str, nbytes: int, world_size: int, medium: str | None = None, ranks_per_core: float | None = None
) -> str:
    """The algorithm ``algorithm="auto"`` runs by the table (:mod:`.table`).

    Args:
        collective: a key of :data:`ALGORITHMS`.
        nbytes: the byte size of the collective's buffer: the array reduced
            (all_reduce, reduce), the whole ``P``-block array (all_gather's
            output, gather's output, reduce_scatter's and all_to_all's
            input). EVERY RANK MUST PASS THE SAME VALUE, or ranks would pick
            different algorithms: for broadcast and scatter only the root
            knows the size, so pass ``0`` there.
        world_size: ``P``.
        medium: the group's agreed links (:func:`.media.medium`: ``"shm"``,
            ``"socket"`` or None for unknown), the same on every rank.
        ranks_per_core: the most rank processes per core on the group's hosts
            (:func:`.media.ranks_per_core`; None: unknown), the same on every rank.

    Raises:
        ValueError: unknown collective.
    """
    if collective not in ALGORITHMS:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(ALGORITHMS)}")
    return table.pick(collective, nbytes, world_size, medium, ranks_per_core) or next(iter(ALGORITHMS[collective]))


#: collectives whose size only the root knows: the Communicator passes 0, so the ranks
#: cannot weigh their algorithms together (the table's choice, at the default segment size;
#: a broadcast's root chooses alone in ``sized``: :func:`broadcast_shape`)
SIZE_UNKNOWN: Final = cost.SIZE_UNKNOWN


def decide(
    collective: str,
    nbytes: int,
    world_size: int,
    params: cost.Params | None,
    segment: int | None = None,
    medium: str | None = None,
    ranks_per_core: float | None = None,
) -> tuple[str, int | None, float | None]:
    """``algorithm="auto"`` with the cost model: ``(algorithm, segment_bytes,
    predicted seconds)``: :func:`cost.learnt` (the model's candidates, then
    the fastest measured in this size band). ``params`` None (not agreed yet,
    or the model is off) or a size only the root knows: the table
    (:func:`choose`), segment and prediction None. ``segment``: the
    communicator's fixed segment size (set by the user), else the model picks
    one of :data:`cost.SEGMENTS`. ``medium``, ``ranks_per_core``: the group's
    agreed links and crowding, for the table (:func:`choose`). Every rank
    passing the same arguments gets the same answer."""
    if collective == "broadcast" and params is not None and world_size >= 3:
        return "sized", None, None  # the root weighs the tree and the chain (broadcast_shape)
    if params is None or collective in SIZE_UNKNOWN or world_size < 2:
        return choose(collective, nbytes, world_size, medium, ranks_per_core), None, None
    return _decided(collective, nbytes, world_size, params, segment)


def broadcast_shape(
    nbytes: int, world_size: int, params: cost.Params | None, segment: int, medium: str | None = None
) -> tuple[str, float | None]:
    """For the root of a ``sized`` broadcast of ``nbytes`` (:mod:`.sized`): ``("ring", predicted
    seconds)`` to run the chain, ``("tree", ...)`` for the tree. With the group's parameters:
    the model proposes and the agreed measured times of broadcasts in this size band decide
    (:func:`cost.learnt`, exploring a shape not yet measured unless it is predicted far
    slower). Without them: the table (:func:`.table.broadcast_chain`), no prediction. Only
    the root asks, so only it needs to know the size."""
    if world_size < 3:
        return "tree", None
    if params is not None:
        shape, _, predicted = cost.learnt("broadcast", nbytes, world_size, params, segments=(segment,))
        return shape, predicted
    return ("ring" if table.broadcast_chain(nbytes, world_size, medium) else "tree"), None


@functools.lru_cache(maxsize=4096)
def _decided(
    collective: str, nbytes: int, world_size: int, params: cost.Params, segment: int | None
) -> tuple[str, int | None, float]:
    """:func:`decide` by the model, remembered (every call of a training loop asks the same)."""
    segments = cost.SEGMENTS if segment is None else (segment,)
    algo, seg, predicted = cost.learnt(collective, nbytes, world_size, params, segments=segments)
    return algo, (None if segment is not None else seg), predicted


ALGO_ENV: Final = "NETCOLL_ALGO"


def parse_overrides(text: str, what: str = ALGO_ENV) -> dict[str, str]:
    """``"all_reduce=ring,broadcast=tree"`` (per collective) or ``"ring"`` (every
    collective that has it) -> ``{collective: algorithm}``; empty: no overrides.

    Raises:
        ConfigError: an unknown collective or algorithm, naming ``what`` and the choices.
    """
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" not in part:
            have = [c for c, table in ALGORITHMS.items() if part in table]
            if not have and part != "auto":
                names = sorted({a for table in ALGORITHMS.values() for a in table})
                raise ConfigError(f"{what}: no collective has an algorithm {part!r}; known: {', '.join(names)}")
            out.update(dict.fromkeys(have, part))
            continue
        coll, _, algo = (x.strip() for x in part.partition("="))
        if coll not in ALGORITHMS:
            raise ConfigError(f"{what}: unknown collective {coll!r}; known: {', '.join(ALGORITHMS)}")
        if algo != "auto" and algo not in ALGORITHMS[coll]:
            choices = ", ".join(["auto", *sorted(ALGORITHMS[coll])])
            raise ConfigError(f"{what}: {coll} has no algorithm {algo!r}; choose one of {choices}")
        out[coll] = algo
    return {c: a for c, a in out.items() if a != "auto"}


def overrides_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """:func:`parse_overrides` of ``$NETCOLL_ALGO`` (unset: none)."""
    env = os.environ if environ is None else environ
    return parse_overrides(env.get(ALGO_ENV, ""))
