"""``SyncCommunicator``: the :class:`~netcoll.comm.Communicator` as blocking calls,
each handed to the loop thread (:class:`~netcoll.sync.runner.Runner`) and waited for
(see :mod:`netcoll.sync`)."""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import functools
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from ..comm import Communicator
from ..comm.types import (
    AllGatherAlgorithm,
    AllReduceAlgorithm,
    AllToAllAlgorithm,
    ArrayIn,
    BarrierAlgorithm,
    BroadcastAlgorithm,
    GatherAlgorithm,
    Op,
    ReduceAlgorithm,
    ReduceScatterAlgorithm,
    ScatterAlgorithm,
    TensorLike,
)
from ..compression import Compression
from ..elastic import CHUNK_BYTES, SLICE_BYTES
from ..elastic import heal as _heal
from ..errors import CommunicatorClosed
from ..launched import record_failure
from ..operation import Work
from .runner import CLOSE_TIMEOUT, Runner, copy_outcome

Array = np.ndarray[Any, Any]
F = TypeVar("F", bound=Callable[..., Any])
REGROUP_MARGIN = 30.0  # seconds a regroup may take beyond its timeout (linking the new epoch)
INTERRUPT_WAIT = 10.0  # seconds a Ctrl-C waits for the cancelled collective to be aborted on the peers


def _blocking(method: F) -> F:
    """Give a blocking method the docstring of the Communicator method it wraps."""
    original = getattr(Communicator, method.__name__).__doc__ or ""
    method.__doc__ = (
        f"{original}\n\n        Blocks until done and returns the result; ``async_op=True`` returns the "
        "``netcoll.Work`` at once."
    )
    return method


class SyncCommunicator:
    """A :class:`~netcoll.comm.Communicator` whose calls block (see :mod:`netcoll.sync`).

    Attributes (those of the Communicator): ``rank``, ``world_size``, ``group``,
    ``members``, ``timeout``, ``segment_bytes``, ``closed``; ``communicator`` is
    the async Communicator itself and ``loop`` the event loop it runs on.
    """

    def __init__(self, runner: Runner, comm: Communicator, *, owner: bool) -> None:
        self._runner, self._comm, self._owner = runner, comm, owner
        self._closed = False
        self._next: SyncCommunicator | None = None  # the communicator a regroup replaced this one with

    def __repr__(self) -> str:
        return f"<SyncCommunicator group={self.group!r} rank={self.rank} world_size={self.world_size}>"

    def __enter__(self) -> SyncCommunicator:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None:
            record_failure(exc)  # before closing: the peers fail only once we have left
        self.close()

    communicator = property(lambda self: self._comm, doc="the async Communicator underneath")
    loop = property(lambda self: self._runner.loop, doc="the event loop the calls run on")
    rank = property(lambda self: self._comm.rank, doc="this rank in the group")
    world_size = property(lambda self: self._comm.world_size, doc="ranks in the group")
    group = property(lambda self: self._comm.group, doc="the group's name")
    members = property(lambda self: self._comm.members, doc="the group's world ranks")
    timeout = property(lambda self: self._comm.timeout, doc="the default deadline (s)")
    segment_bytes = property(lambda self: self._comm.segment_bytes, doc="message segment size")
    medium = property(lambda self: self._comm.medium, doc="the group's agreed links (Communicator.agree_links)")
    joined = property(lambda self: self._comm.joined, doc="True when an elastic connect's regroup admitted it")
    closed = property(lambda self: self._closed or self._comm.closed, doc="True once closed")

    # -- the one path every call takes ------------------------------------------------
    def _call(self, method: Callable[..., Any], async_op: bool, *args: Any, **kwargs: Any) -> Any:
        """Issue ``method(*args, **kwargs)`` on the loop; its Work (``async_op``) or result."""
        if not isinstance(async_op, bool):
            raise TypeError(f"async_op must be True or False, got {async_op!r}")
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        issued: list[Work] = []

        def issue() -> None:
            if not done.set_running_or_notify_cancel():
                return  # interrupted before it was issued: never issued at all
            try:
                work = method(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - a bad argument: raised in the caller
                done.set_exception(exc)
                return
            if async_op or not isinstance(work, Work):
                done.set_result(work)
                return
            issued.append(work)
            work.add_done_callback(functools.partial(copy_outcome, done, self._comm.rank))

        try:
            self._runner.submit(issue)
            return done.result()
        except BaseException:
            if not done.done():  # interrupted (Ctrl-C) while blocked: cancel, everywhere
                self._interrupt(done, issued)
            raise

    def _interrupt(self, done: concurrent.futures.Future[Any], issued: list[Work]) -> None:
        if done.cancel():
            return
        with contextlib.suppress(CommunicatorClosed):
            self._runner.submit(lambda: issued[0].cancel() if issued else None)
        concurrent.futures.wait([done], INTERRUPT_WAIT)  # the ABORT reaches the peers before we go on

    # -- collectives ----------------------------------------------------------------
    @_blocking
    def all_reduce(
        self,
        x: ArrayIn | TensorLike[Any],
        op: Op = "sum",
        *,
        out: Array | None = None,
        timeout: float | None = None,
        algorithm: AllReduceAlgorithm = "auto",
        compression: Compression | None = None,
        async_op: bool = False,
        partial: bool = False,
        deadline: float | None = None,
    ) -> Any:
        """:meth:`netcoll.Communicator.all_reduce`, blocking. With ``partial=True`` it
        returns the reduction over the ranks that delivered by the deadline; to know which,
        pass ``async_op=True`` too and read the Work's ``contributors`` after ``wait()``."""
        return self._call(
            self._comm.all_reduce,
            async_op,
            x,
            op,
            out=out,
            timeout=timeout,
            algorithm=algorithm,
            compression=compression,
            partial=partial,
            deadline=deadline,
        )

    @_blocking
    def broadcast(
        self,
        x: ArrayIn | TensorLike[Any] | None = None,
        root: int = 0,
        *,
        timeout: float | None = None,
        algorithm: BroadcastAlgorithm = "auto",
        compression: Compression | None = None,
        async_op: bool = False,
    ) -> Any:
        return self._call(
            self._comm.broadcast, async_op, x, root, timeout=timeout, algorithm=algorithm, compression=compression
        )

    @_blocking
    def reduce(
        self,
        x: ArrayIn | TensorLike[Any],
        op: Op = "sum",
        root: int = 0,
        *,
        out: Array | None = None,
        timeout: float | None = None,
        algorithm: ReduceAlgorithm = "auto",
        compression: Compression | None = None,
        async_op: bool = False,
    ) -> Any:
        return self._call(
            self._comm.reduce,
            async_op,
            x,
            op,
            root,
            out=out,
            timeout=timeout,
            algorithm=algorithm,
            compression=compression,
        )

    @_blocking
    def all_gather(
        self,
        x: ArrayIn | TensorLike[Any],
        *,
        uneven: bool = False,
        out: Array | None = None,
        timeout: float | None = None,
        algorithm: AllGatherAlgorithm = "auto",
        compression: Compression | None = None,
        async_op: bool = False,
    ) -> Any:
        return self._call(
            self._comm.all_gather,
            async_op,
            x,
            uneven=uneven,
            out=out,
            timeout=timeout,
            algorithm=algorithm,
            compression=compression,
        )

    @_blocking
    def gather(
        self,
        x: ArrayIn | TensorLike[Any],
        root: int = 0,
        *,
        uneven: bool = False,
        out: Array | None = None,
        timeout: float | None = None,
        algorithm: GatherAlgorithm = "auto",
        async_op: bool = False,
    ) -> Any:
        return self._call(
            self._comm.gather, async_op, x, root, uneven=uneven, out=out, timeout=timeout, algorithm=algorithm
        )

    @_blocking
    def scatter(
        self,
        x: ArrayIn | TensorLike[Any] | None = None,
        root: int = 0,
        *,
        out: Array | None = None,
        timeout: float | None = None,
        algorithm: ScatterAlgorithm = "auto",
        async_op: bool = False,
    ) -> Any:
        return self._call(self._comm.scatter, async_op, x, root, out=out, timeout=timeout, algorithm=algorithm)

    @_blocking
    def reduce_scatter(
        self,
        x: ArrayIn | TensorLike[Any],
        op: Op = "sum",
        *,
        out: Array | None = None,
        timeout: float | None = None,
        algorithm: ReduceScatterAlgorithm = "auto",
        compression: Compression | None = None,
        async_op: bool = False,
    ) -> Any:
        return self._call(
            self._comm.reduce_scatter,
            async_op,
            x,
            op,
            out=out,
            timeout=timeout,
            algorithm=algorithm,
            compression=compression,
        )

    @_blocking
    def all_to_all(
        self,
        x: ArrayIn | TensorLike[Any],
        *,
        out: Array | None = None,
        timeout: float | None = None,
        algorithm: AllToAllAlgorithm = "auto",
        async_op: bool = False,
    ) -> Any:
        return self._call(self._comm.all_to_all, async_op, x, out=out, timeout=timeout, algorithm=algorithm)

    @_blocking
    def barrier(
        self, *, timeout: float | None = None, algorithm: BarrierAlgorithm = "auto", async_op: bool = False
    ) -> Any:
        return self._call(self._comm.barrier, async_op, timeout=timeout, algorithm=algorithm)

    @_blocking
    def agree_links(self, *, timeout: float | None = None, async_op: bool = False) -> Any:
        """Collective: agree on every rank's link kinds for ``auto`` (connect() already did)."""
        return self._call(self._comm.agree_links, async_op, timeout=timeout)

    @_blocking
    def calibrate(self, *, timeout: float | None = None, async_op: bool = False) -> Any:
        """Collective: measure the links and agree on the cost model (connect() already did)."""
        return self._call(self._comm.calibrate, async_op, timeout=timeout)

    @_blocking
    def send(
        self,
        x: ArrayIn | TensorLike[Any],
        dst: int,
        tag: int = 0,
        *,
        timeout: float | None = None,
        async_op: bool = False,
    ) -> Any:
        return self._call(self._comm.send, async_op, x, dst, tag, timeout=timeout)

    @_blocking
    def recv(self, src: int, tag: int = 0, *, timeout: float | None = None, async_op: bool = False) -> Any:
        return self._call(self._comm.recv, async_op, src, tag, timeout=timeout)

    # -- groups and state -------------------------------------------------------------
    def split(self, color: int | None, key: int = 0, *, timeout: float | None = None) -> SyncCommunicator | None:
        """Collective: ranks passing the same ``color`` form a sub-group (its
        own sequence of collectives, the same links and thread), ordered by
        (``key``, rank); ``None`` for ``color=None``. See Communicator.split."""
        sub = self._call(self._comm.split, False, color, key, timeout=timeout)
        return None if sub is None else SyncCommunicator(self._runner, sub, owner=False)

    def regroup(self, timeout: float = 60.0) -> SyncCommunicator:
        """Blocking :meth:`Communicator.regroup <netcoll.comm.Communicator.regroup>`: every
        live member calls it; returns this communicator if nothing changed, else the
        next epoch's (this one is then closed, and the new one owns the loop thread:
        closing it, or leaving this one's ``with`` block, ends the session)."""
        new = self._runner.run(lambda: self._comm.regroup(timeout), timeout + REGROUP_MARGIN)
        if new is self._comm:
            return self
        sync = SyncCommunicator(self._runner, new, owner=self._owner)
        if self._owner:  # the session (the loop thread, atexit) goes with the current epoch
            atexit.unregister(self.close)
            atexit.register(sync.close)
        self._next = sync  # closing this one (its ``with`` block ending) closes the current one
        return sync

    def heal(
        self,
        state: Mapping[str, Any],
        *,
        timeout: float | None = None,
        slice_bytes: int = SLICE_BYTES,
        chunk_bytes: int = CHUNK_BYTES,
        checksum: bool = True,
        joined: bool | None = None,
    ) -> dict[str, Any]:
        """Blocking :func:`netcoll.elastic.heal`: every rank of the group calls it (after a
        :meth:`regroup` that admitted newcomers); a joiner (``joined`` True) gets the live
        members' state, a live member its own back. The arguments are heal's."""
        wait = (self._comm.timeout if timeout is None else timeout) + REGROUP_MARGIN
        return self._runner.run(
            lambda: _heal(
                self._comm,
                state,
                timeout=timeout,
                slice_bytes=slice_bytes,
                chunk_bytes=chunk_bytes,
                checksum=checksum,
                joined=joined,
            ),
            wait,
        )

    def link_stats(self) -> dict[int, dict[str, Any]]:
        """This rank's link to each other member (see Communicator.link_stats)."""
        return self._call(self._comm.link_stats, False)  # type: ignore[no-any-return]

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Close the communicator; for the one :func:`connect` made, also leave
        the group and stop the loop thread (waiting up to ``timeout`` s). On one a
        :meth:`regroup` replaced, it closes the current one."""
        if self._next is not None:
            self._next.close(timeout)
            return
        if self._closed:
            return
        self._closed = True
        if self._owner:
            atexit.unregister(self.close)
            self._runner.stop(timeout)
        else:
            with contextlib.suppress(CommunicatorClosed):
                self._runner.run(self._comm.close, timeout)


__all__ = ["SyncCommunicator"]
