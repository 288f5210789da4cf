"""The netcoll session under torch's process groups, and the backend factory.

``init_process_group("netcoll")`` calls :func:`create` for the default group:
it joins a netcoll group (``"torch"``) at the coordinator that ``netcoll run``
names in ``NETCOLL_COORDINATOR`` (token ``NETCOLL_TOKEN``), as torch's rank of
torch's world size, through :func:`netcoll.sync.connect`: one event loop
thread per process carries every group's traffic. Each later group
(``new_group``, which torch creates on its members only) gets a communicator
of its own over the same links, named after torch's group name (the same on
every rank) and made of torch's global ranks, which are the netcoll ranks.

:func:`rebuild` makes torch's default group anew on a communicator the caller
already holds (a ``netcoll.sync`` one, typically the one a ``regroup``
returned), in the same process: elastic training's "rebuild the process
group" step. The caller keeps that communicator: the process group never
closes it.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .. import settings, sync
from ..comm import Communicator
from .backend import ProcessGroupNetcoll
from .issue import Issuer

__all__ = ["GROUP", "create", "rebuild", "world"]

#: the netcoll group that the default torch process group joins at the coordinator
GROUP = "torch"

_lock = threading.Lock()
_world: sync.SyncCommunicator | None = None
_given: sync.SyncCommunicator | None = None  # the communicator rebuild() hands to create()


def world() -> sync.SyncCommunicator | None:
    """This process's session under the default torch process group, if one is open."""
    return _world


def create(opts: Any, pg_options: Any = None) -> ProcessGroupNetcoll:
    """torch's backend factory (``extended_api``): the process group for one
    torch group; ``opts`` is torch's ``_DistributedBackendOptions``."""
    rank, size = int(opts.group_rank), int(opts.group_size)
    seconds = max(float(opts.timeout.total_seconds()), 1.0)
    ranks = [int(r) for r in opts.global_ranks_in_group]
    if not ranks and _given is not None:  # rebuild(): the caller's communicator
        return _adopt(_given, rank, size)
    if not ranks:  # the default group
        default = _connect(rank, size, seconds)
        return ProcessGroupNetcoll(Issuer(default.communicator, default.loop), rank, size, on_shutdown=_close_world)
    open_world = _world
    if open_world is None or open_world.closed:
        raise RuntimeError("netcoll: create the default process group first: init_process_group('netcoll')")
    session: sync.SyncCommunicator = open_world
    parent = session.communicator
    comm = Communicator(
        parent.transport,
        group=f"{GROUP}/{opts.group_id}",
        members=tuple(ranks),
        timeout=seconds,
        segment_bytes=parent.segment_bytes,
    )

    def close() -> None:
        if not comm.closed and not session.closed:
            asyncio.run_coroutine_threadsafe(comm.close(), session.loop).result(seconds)

    return ProcessGroupNetcoll(Issuer(comm, session.loop), rank, size, on_shutdown=close)


def _connect(rank: int, size: int, seconds: float) -> sync.SyncCommunicator:
    global _world
    if not settings.raw(settings.registry.COORDINATOR.name):
        raise RuntimeError(
            "netcoll: NETCOLL_COORDINATOR is not set; start the script with `netcoll run -n N script.py` "
            "(or set NETCOLL_COORDINATOR=HOST:PORT of a running `netcoll coordinator`, and NETCOLL_TOKEN)"
        )
    with _lock:
        if _world is not None and not _world.closed:
            raise RuntimeError("netcoll: the default process group is already initialized in this process")
        _world = sync.connect(world_size=size, rank=rank, group=GROUP, timeout=seconds, collective_timeout=seconds)
        return _world


def _close_world() -> None:
    global _world
    with _lock:
        session, _world = _world, None
    if session is not None:
        session.close()


def rebuild(comm: sync.SyncCommunicator, *, timeout: float | None = None) -> None:
    """Make torch's default process group the ``"netcoll"`` group over ``comm``
    (its rank and world size), destroying the current one first (and with it
    every group ``new_group`` made): after ``comm = comm.regroup()``, every rank
    of the new group calls ``rebuild(comm)`` and wraps its model in a new
    ``DistributedDataParallel``. Also builds the first group from a
    communicator of one's own (``netcoll.sync.connect(..., elastic=True)``).

    ``comm`` stays the caller's: neither this nor ``destroy_process_group``
    closes it (the one a regroup replaced is closed already). ``timeout``:
    torch's default for the group's collectives (default: ``comm.timeout``).
    Not a collective: nothing is sent (torch's own store is a local
    ``HashStore``, unused).
    """
    global _given, _world
    if not isinstance(comm, sync.SyncCommunicator) or comm.closed:
        raise ValueError(f"netcoll.torch.rebuild needs an open netcoll.sync communicator, got {comm!r}")
    with _lock:
        _world = None  # detached, never closed here: a regrouped one is closed already, else it is the caller's
    if dist.is_initialized():
        dist.destroy_process_group()
    seconds = comm.timeout if timeout is None else float(timeout)
    with _lock:
        _given = comm
    try:
        dist.init_process_group(
            "netcoll",
            store=dist.HashStore(),  # type: ignore[attr-defined]  # (exported at runtime; the stub lacks it)
            rank=comm.rank,
            world_size=comm.world_size,
            timeout=timedelta(seconds=seconds),
        )
    finally:
        with _lock:
            _given = None


def _adopt(comm: sync.SyncCommunicator, rank: int, size: int) -> ProcessGroupNetcoll:
    """The default group over the communicator :func:`rebuild` was given."""
    global _world
    if (rank, size) != (comm.rank, comm.world_size):
        raise RuntimeError(f"netcoll: torch asks for rank {rank} of {size}, the communicator is {comm!r}")
    with _lock:
        _world = comm

    def release() -> None:  # the group ends; the communicator stays the caller's
        global _world
        with _lock:
            if _world is comm:
                _world = None

    return ProcessGroupNetcoll(Issuer(comm.communicator, comm.loop), rank, size, on_shutdown=release)
