"""Which algorithm ``algorithm="auto"`` runs: the table's choice (:mod:`.table`,
by the group's links: :mod:`.media`), the cost model's (:mod:`.cost`) once the
group's parameters are agreed, a sized broadcast's root's shape, and the
``NETCOLL_ALGO`` overrides. Pure functions of their arguments: every rank
passing the same arguments gets the same answer.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Final

from .. import settings
from ..algorithms import ALGORITHMS
from ..errors import ConfigError
from . import cost, table, weighting


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
    the fastest measured in this size band), or the weighted all_reduce when the
    group's measured per-rank rates favour it (:func:`.weighting.consider`). ``params`` None (not agreed yet,
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
    """For the root of a ``sized`` broadcast of ``nbytes`` (:mod:`netcoll.algorithms.sized`): ``("ring", predicted
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
    """:func:`decide` by the model, remembered (every call of a training loop asks the same);
    then the weighted all_reduce if the group's measured rates favour it (:mod:`.weighting`)."""
    segments = cost.SEGMENTS if segment is None else (segment,)
    algo, seg, predicted = cost.learnt(collective, nbytes, world_size, params, segments=segments)
    algo, _, predicted = weighting.consider(collective, nbytes, world_size, params, (algo, seg, predicted))
    return algo, (None if segment is not None else seg), predicted


ALGO_ENV: Final = settings.registry.ALGO.name


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
    return parse_overrides(settings.algo(environ))


__all__ = [
    "ALGO_ENV",
    "SIZE_UNKNOWN",
    "broadcast_shape",
    "choose",
    "decide",
    "overrides_from_env",
    "parse_overrides",
]
