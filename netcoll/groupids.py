"""Group ids as frames carry them (``"g"``), and the epoch one names.

A group's first epoch carries its name (``"default"``); each regroup that changes
its membership starts the next epoch, whose id is ``"<name>/e<epoch>"`` (group
names hold no ``/``; a sub-group of ``split`` adds ``/split<i>:<color>``). The
mailbox drops a frame of another epoch than its mesh's (:mod:`netcoll.mesh.mailbox`).
Pure functions, no imports: the coordinator and the mesh both use them.
"""

from __future__ import annotations

EPOCH_MARK = "e"


def epoch_group(name: str, epoch: int) -> str:
    """The group id the frames of ``name``'s epoch ``epoch`` carry (``name`` itself at 0)."""
    return name if epoch == 0 else f"{name}/{EPOCH_MARK}{epoch}"


def epoch_of(group: str) -> int:
    """The epoch a group id names (``"<name>/e<N>"`` and its sub-groups: N; else 0)."""
    parts = group.split("/", 2)
    if len(parts) > 1 and parts[1][:1] == EPOCH_MARK and parts[1][1:].isdigit():
        return int(parts[1][1:])
    return 0


__all__ = ["EPOCH_MARK", "epoch_group", "epoch_of"]
