"""``netcoll.sync``: the :class:`~netcoll.comm.Communicator` as blocking calls,
for ordinary (synchronous) training scripts::

    import netcoll.sync

    with netcoll.sync.connect() as comm:        # under `netcoll run`: address etc. from the environment
        grads = comm.all_reduce(grads, op="avg")  # blocks, returns the result
        work = comm.all_gather(w, async_op=True)  # returns the netcoll.Work at once
        ...
        params = work.wait()

An asyncio event loop runs in a daemon thread of its own per :func:`connect`;
each call hands its collective to that loop (*issuing* it there, in the order
the calls are made) and blocks the calling thread until it ends. Errors are the
async API's typed errors, raised in the caller. See docs/training.md for the
rules on threads, ``async_op`` and shutdown; in short:

* calls from several threads are safe and are issued in the order they reach
  the communicator; every rank must issue the same collectives in the same
  order, so either fix the order across threads yourself or give each thread
  its own sub-communicator (:meth:`SyncCommunicator.split`);
* ``async_op=True`` returns the :class:`~netcoll.Work`: ``wait(timeout)``,
  ``done()``, ``result()`` and ``cancel()`` may be called from any thread.
  Don't modify an input array until its Work is done;
* Ctrl-C (``KeyboardInterrupt``) while a call blocks cancels that collective,
  which aborts it on every rank with :class:`~netcoll.errors.CollectiveCancelled`,
  and the ``KeyboardInterrupt`` propagates;
* leaving the ``with`` block, :meth:`SyncCommunicator.close` and interpreter
  exit (``atexit``) close the communicator (peers see an orderly leave) and
  stop the thread.
"""

from __future__ import annotations

import atexit
from typing import Any

from ..comm import DEFAULT_TIMEOUT
from .communicator import SyncCommunicator
from .runner import Runner


def connect(
    address: str | None = None,
    *,
    world_size: int | None = None,
    rank: int | None = None,
    group: str = "default",
    token: str | None = None,
    timeout: float = 60.0,
    collective_timeout: float = DEFAULT_TIMEOUT,
    loop: str | None = None,
    elastic: bool = False,
    **options: Any,
) -> SyncCommunicator:
    """Join ``group`` at the coordinator and return a :class:`SyncCommunicator`
    (also a context manager: ``with netcoll.sync.connect() as comm:``).

    The arguments are those of :func:`netcoll.connect` (``address``,
    ``world_size`` and ``rank`` default to ``$NETCOLL_COORDINATOR``,
    ``$NETCOLL_WORLD_SIZE``, ``$NETCOLL_RANK``; ``options`` are its other keyword
    arguments: ``listen_host``, ``local_host``, ``recv_window``, ...), plus
    ``loop``: the event loop kind (``"asyncio"`` by default, else
    ``$NETCOLL_LOOP``; see :mod:`netcoll.loop`). Blocks until every rank has
    joined (at most ``timeout`` s); with ``elastic=True``, until a regroup of the
    running group admits this process (``comm.joined`` is then True)."""
    runner = Runner(loop)
    comm = runner.start(
        address=address,
        world_size=world_size,
        rank=rank,
        group=group,
        token=token,
        timeout=timeout,
        collective_timeout=collective_timeout,
        elastic=elastic,
        **options,
    )
    sync = SyncCommunicator(runner, comm, owner=True)
    atexit.register(sync.close)
    return sync


__all__ = ["SyncCommunicator", "connect"]
