"""What a job names, checked against the registry before anything is queued.

``netcoll submit`` (before it connects) and the coordinator (on every submit,
through :class:`netcoll.service.jobs.JobSpec`) check the same things with the
same words: the collective, its algorithm, the root, the dtype and the
reduction. Each error is a :class:`ValueError` of one line that lists the
valid choices and, for a near miss, says "did you mean ...?" (:mod:`difflib`)::

    unknown collective 'all_reduc'; did you mean 'all_reduce'? choose from all_reduce, ...
    all_reduce has no algorithm 'rign'; did you mean 'ring'? choose from auto, ring, tree, ...
    unknown dtype 'float33'; did you mean 'float32'? choose from bool, int8, ...
    root 4 is out of range for 4 ranks (valid roots are 0..3)
    all_gather takes no --op: it reduces nothing (collectives with a reduction: all_reduce, ...)

The dtype check loads numpy (the others do not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from . import collectives
from .collectives import Collective, did_you_mean
from .ranks import check_root as check_root_arg

__all__ = [
    "check_algorithm",
    "check_arguments",
    "check_collective",
    "check_dtype_name",
    "check_reduce_op",
    "check_root",
    "did_you_mean",
    "dtype_names",
]

REDUCE_OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor")


def _unknown(what: str, word: object, choices: Iterable[str]) -> str:
    """``what 'word'; did you mean 'x'? choose from a, b, c``"""
    choices = tuple(choices)
    return f"{what} {word!r}; {did_you_mean(word, choices)}choose from {', '.join(choices)}"


def check_collective(name: str) -> Collective:
    """The registry entry called ``name`` (ValueError with the choices otherwise):
    :func:`netcoll.collectives.get`."""
    return collectives.get(name)


def check_algorithm(coll: Collective, algorithm: str) -> str:
    """``algorithm`` if ``coll`` has it (``auto`` always), else ValueError."""
    if algorithm not in coll.algorithms:
        raise ValueError(_unknown(f"{coll.name} has no algorithm", algorithm, coll.algorithms))
    return algorithm


def check_root(coll: Collective, root: int, world_size: int | None) -> None:
    """A root rank in ``0..world_size-1`` (any root >= 0 while the size is unknown) for a
    collective with a root; any root >= 0 for one without (it is ignored)."""
    check_root_arg(root, world_size if coll.takes_root else None)


#: argument -> (whether a collective takes it, why one does not, who does: "" for none)
_TAKES: dict[str, tuple[Callable[[Collective], bool], str, str]] = {
    "op": (lambda c: c.takes_op, "it reduces nothing", "collectives with a reduction"),
    "root": (lambda c: c.takes_root, "every rank gets the result", "collectives with a root"),
    "data": (lambda c: c.has_data, "it moves no data", ""),
}


def check_arguments(coll: Collective, given: Mapping[str, str]) -> None:
    """ValueError for an argument ``coll`` does not take, rather than ignoring it (what ran
    would not be what was asked). ``given``: each argument passed (``op``, ``root``,
    ``data``) and how the caller spelled it (``{"op": "--op"}``)."""
    for arg, spelled in given.items():
        takes, why, who = _TAKES[arg]
        if not takes(coll):
            others = f" ({who}: {', '.join(c.name for c in collectives.REGISTRY.values() if takes(c))})" if who else ""
            raise ValueError(f"{coll.name} takes no {spelled}: {why}{others}")


def dtype_names() -> tuple[str, ...]:
    """Every dtype a job accepts, by name (``float32``, ``bfloat16``, ``bool``...)."""
    from .ops import SUPPORTED_DTYPES

    return tuple(str(dt) for dt in SUPPORTED_DTYPES)


def check_dtype_name(name: str) -> str:
    """``name`` if it names a supported dtype (numpy's spellings, e.g. ``f4``, too)."""
    import numpy as np

    from .ops import BFLOAT16, check_dtype

    try:
        check_dtype(BFLOAT16 if name == "bfloat16" else np.dtype(name))
    except (TypeError, ValueError):
        raise ValueError(_unknown("unknown dtype", name, dtype_names())) from None
    return name


def check_reduce_op(name: str) -> str:
    """A reduction's name (case-insensitive), lower-cased."""
    text = name.strip().lower() if isinstance(name, str) else name
    if text not in REDUCE_OPS:
        raise ValueError(_unknown("unknown reduction", name, REDUCE_OPS))
    return str(text)
