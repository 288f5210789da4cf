"""The :class:`Communicator`: a group of ranks, its state and sub-groups, and
the cost model's group operations. Its collectives come from the method groups
it inherits (:mod:`.reducing`, :mod:`.gathering`, :mod:`.moving`,
:mod:`.p2p`); the package docstring (:mod:`netcoll.comm`) says how calls behave."""

from __future__ import annotations

import contextlib
import logging
import numbers
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np

from .. import resultpool, settings
from ..calls import agreements, moving
from ..calls._common import Done, Plan
from ..engine import DEFAULT_TIMEOUT, Call, Engine
from ..errors import CollectiveError, CommunicatorClosed, RendezvousError
from ..mesh.channel import Mesh, as_bytes
from ..operation import Work
from ..selection import TRIAL_LAG, Pending, Version
from ..tensors import TorchIO
from . import gathering, p2p, reducing
from . import moving as moving_
from .types import Array

COST_MODEL_ENV = settings.registry.COST_MODEL.name


def cost_model_enabled(env: Mapping[str, str] | None = None, *, default: bool = False) -> bool:
    """Whether groups calibrate when they form (``NETCOLL_COST_MODEL=1``; ``0`` never;
    unset or empty: ``default``, see :func:`model_by_default`)."""
    chosen = settings.cost_model(env)
    return default if chosen is None else chosen


async def form_group(comm: Communicator) -> None:
    """What a new world group does before its first collective (``connect()``
    and the rank daemons): agree on every rank's link kinds, so that ``auto``
    chooses by them (:meth:`Communicator.agree_links`), then calibrate the cost
    model if it is on (:func:`calibrate_if_enabled`)."""
    await comm.agree_links()
    await calibrate_if_enabled(comm)


def model_by_default(comm: Communicator) -> bool:
    """Whether ``auto`` chooses by the cost model when ``NETCOLL_COST_MODEL`` is unset:
    when the group spans more than one host (by the hosts agreed when it formed). The
    fixed table's thresholds were measured with every rank on one host, where the model
    chooses as well as the table but its agreements act as barriers the table does not
    need (docs/performance.md, "Cost model"). Between hosts the table's loopback
    thresholds do not hold: on an emulated 200 µs, 1 Gbit/s network the table's all_reduce
    and all_gather were 1.65-2.8x the best at 256 KiB-4 MiB, and the model within 10 % of
    the best in 9 of the 10 cells from 64 KiB (docs/emulated-network.md)."""
    hosts = comm._engine.hosts
    return hosts is not None and hosts > 1


async def calibrate_if_enabled(comm: Communicator) -> None:
    """A new group's calibration when :func:`cost_model_enabled` (what ``connect()``
    and the rank daemons do, after the group agreed on its links and hosts). A failure
    is logged and leaves the fixed table."""
    if cost_model_enabled(default=model_by_default(comm)):
        with contextlib.suppress(CollectiveError):
            await comm.calibrate()


log = logging.getLogger("netcoll.comm")


class Communicator:
    """A group of ranks that run collectives together (what
    :func:`netcoll.connect` yields).

    Every collective (``all_reduce``, ``broadcast``, ``reduce``,
    ``all_gather``, ``gather``, ``scatter``, ``reduce_scatter``,
    ``all_to_all``, ``barrier``) and ``send``/``recv`` is *issued when it is
    called* and returns a :class:`~netcoll.Work`; see each method's docstring,
    and :mod:`netcoll.comm` for what they share. The methods are written in
    :mod:`.reducing`, :mod:`.gathering`, :mod:`.moving` and :mod:`.p2p` (typed
    overloads and reference docstrings) and are this class's own: it has no
    base class; it holds the group's engine.

    Attributes:
        rank: this process's rank in the group (0..world_size-1).
        world_size: the number of ranks in the group.
        group: the group's name (sub-groups from :meth:`split` get derived names).
    """

    def __init__(
        self,
        transport: Mesh,
        *,
        group: str = "default",
        members: tuple[int, ...] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        segment_bytes: int | None = None,
    ) -> None:
        self._engine = Engine(transport, group=group, members=members, timeout=timeout, segment_bytes=segment_bytes)
        self._splits = 0
        self._on_close: list[Callable[[], Awaitable[None]]] = []
        #: set by :func:`netcoll.connect`: makes the next epoch's Communicator (:meth:`regroup`)
        self._regrouper: Callable[[Communicator, float], Awaitable[Communicator]] | None = None
        self._joined = False
        self._replaced = False  # closed by a regroup that made the next epoch's (which may yet fail)

    def __repr__(self) -> str:
        return f"<Communicator group={self.group!r} rank={self.rank} world_size={self.world_size}>"

    @property
    def rank(self) -> int:
        """This rank in the group (``0 <= rank < world_size``)."""
        return self._engine.rank

    @property
    def world_size(self) -> int:
        """The number of ranks in the group."""
        return self._engine.world_size

    @property
    def group(self) -> str:
        """The group's name."""
        return self._engine.group

    @property
    def members(self) -> tuple[int, ...]:
        """The group's world ranks, in group rank order."""
        return self._engine.members

    @property
    def transport(self) -> Mesh:
        """The process's mesh (:class:`~netcoll.mesh.channel.Mesh`): its links to every world
        rank. Named ``transport``, as is the constructor's first argument, from before the
        mesh had a name of its own (public names stay)."""
        return self._engine.mesh

    @property
    def timeout(self) -> float:
        """The default deadline of each call, in seconds (``timeout=`` overrides it)."""
        return self._engine.timeout

    @property
    def segment_bytes(self) -> int:
        """The message segment size, in bytes."""
        return self._engine.segment_bytes

    @property
    def closed(self) -> bool:
        """True once closed."""
        return self._engine.closed

    @property
    def joined(self) -> bool:
        """True for the Communicator an elastic :func:`netcoll.connect` got when a
        regroup admitted it (this process joined a running group); False for every other.
        :func:`netcoll.elastic.heal` reads it to tell joiners from live members."""
        return self._joined

    async def regroup(self, timeout: float = 60.0) -> Communicator:
        """Collective of the live members: agree on the group's membership now.

        Every live member calls it (after a failure, or every few steps); the
        coordinator waits until each member still connected has called, then drops
        the members that are gone and admits the newcomers waiting
        (``netcoll.connect(..., elastic=True)``). Returns a Communicator of the live
        members in their old order (ranks renumbered from 0), then the admitted
        newcomers in arrival order; this one is closed. With nothing changed it returns
        this Communicator itself (the call then costs about one small collective: a
        round trip to the coordinator). A member that does not call within ``timeout``
        seconds is named in the :class:`~netcoll.errors.RegroupTimeout` the others get.
        Only a Communicator made by :func:`netcoll.connect` can regroup
        (:class:`~netcoll.errors.RendezvousError` otherwise). When linking the new epoch
        fails (a member died meanwhile), the error is raised and calling ``regroup``
        again, on this Communicator, starts the next round."""
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not float(timeout) > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if self.closed and not self._replaced:
            raise CommunicatorClosed(f"{self!r} was closed")
        if self._regrouper is None:
            raise RendezvousError(
                f"{self!r} cannot regroup: only the Communicator netcoll.connect made (or a regroup returned) can"
            )
        return await self._regrouper(self, float(timeout))

    # -- the collectives: thin, typed, documented where they are written ----------------
    all_reduce = reducing.all_reduce
    reduce = reducing.reduce
    reduce_scatter = reducing.reduce_scatter
    all_gather = gathering.all_gather
    gather = gathering.gather
    broadcast = moving_.broadcast
    scatter = moving_.scatter
    all_to_all = moving_.all_to_all
    barrier = moving_.barrier
    send = p2p.send
    recv = p2p.recv

    # -- issuing: a plan to the engine ---------------------------------------------------
    def _issue(self, plan: Plan, timeout: float | None, io: TorchIO | None = None) -> Work:
        _torch_out(plan, io)
        if isinstance(plan, Done):
            return Work.completed(getattr(plan, "name", "local"), plan.value)
        return self._engine.issue(plan, timeout)

    def _plan(self, make: Callable[[Engine], Plan], timeout: float | None, io: TorchIO | None = None) -> Work:
        """Plan and issue a collective; a call whose cost-model parameters are still
        being agreed is issued now (its sequence number) and planned once they are."""
        e = self._engine
        e.choice, e.tuner.asked = None, None
        try:
            plan = make(e)
        except Pending as pending:
            rebuild = self._rebuilder(make, io, pending.version)
            plan = Call(pending.name, "", _never, waits=pending.future, rebuild=rebuild)
            io = None
        if isinstance(plan, Done):
            return self._issue(plan, timeout, io)
        if plan.rebuild is None:
            plan.choice = e.choice
        work = self._issue(plan, timeout, io)
        tuner = e.tuner
        tuner.collectives += 1
        if tuner.due():
            self._model_op(agreements.refine(e), e.seq + tuner.lag)
        elif trial := tuner.trial_due():  # the times of this size band's trial so far, agreed soon
            self._model_op(agreements.refine(e, trial, after=[work]), e.seq + TRIAL_LAG)
        return work

    def _rebuilder(
        self, make: Callable[[Engine], Plan], io: TorchIO | None, version: Version
    ) -> Callable[[Call], None]:
        """Plan a deferred call once ``version`` (its parameters, which it waited for) is agreed."""
        e = self._engine

        def rebuild(call: Call) -> None:
            e.plan_version, e.choice = version, None
            try:
                plan = make(e)
            finally:
                e.plan_version = None
            assert isinstance(plan, Call)  # deferred: a group of 2+ ranks
            _torch_out(plan, io)
            call.fp, call.body, call.post, call.choice, call.ran = plan.fp, plan.body, plan.post, e.choice, plan.ran

        return rebuild

    def _model_op(self, call: Call, start: int) -> Work:
        """Issue a model operation whose parameters apply from sequence number ``start``."""
        work = self._engine.issue(call, None)
        work.add_done_callback(_log_model)
        self._engine.tuner.add(start, work)
        return work

    def agree_links(self, *, timeout: float | None = None) -> Work[str | None]:
        """Collective: agree on the kind of every rank's links and on its host
        and cores, so that ``algorithm="auto"`` chooses by them (shared memory
        and sockets, crowded and roomy hosts favour different algorithms:
        docs/algorithms.md, "Choosing by link kind").
        :func:`form_group` does it when ``connect()`` forms the world group;
        sub-groups made afterwards know theirs without talking. The Work's
        result is the group's medium (``"shm"``, ``"socket"``, or None when
        unknown); once agreed, it completes at once. Only a group of every
        world rank agrees (ValueError otherwise, before anything is sent)."""
        e = self._engine
        if e.members != tuple(range(e.mesh.size)):
            raise ValueError(
                f"agree_links is for a group of every rank ({e.mesh.size}); group {self.group!r} has "
                f"{e.world_size}: a sub-group knows its links from the world group's agreement"
            )
        if e.world_size < 2 or e.mesh.layout is not None:
            return Work.completed("agree_links", e.medium)
        work = e.issue(agreements.agree_links(e), timeout)
        work.add_done_callback(self._log_links)
        return work

    def _log_links(self, work: Work[str | None]) -> None:
        if not work.cancelled() and work.exception() is None:
            e = self._engine
            kinds, crowd = work.result() or "of an unknown kind", e.ranks_per_core
            per_core = "unknown" if crowd is None else f"{crowd:.3g}"
            hosts = "unknown hosts" if e.hosts is None else f"{e.hosts} host" + ("s" if e.hosts > 1 else "")
            model = cost_model_enabled(default=model_by_default(self))
            chooser = "the cost model chooses" if model else "auto's table chooses"
            log.info(
                "group %s: links %s, %s ranks per core, %s; %s for them", self.group, kinds, per_core, hosts, chooser
            )

    @property
    def medium(self) -> str | None:
        """The group's agreed links (:meth:`agree_links`): ``"shm"``, ``"socket"``, or None."""
        return self._engine.medium

    def calibrate(self, *, timeout: float | None = None) -> Work:
        """Collective: measure the group's links and agree on the cost model's
        parameters (``docs/algorithms.md``, "Cost model"); calls issued after it
        choose with them (and wait for them if needed). ``connect()`` and the
        rank daemons call it when :func:`cost_model_enabled`;
        ``NETCOLL_COST_MODEL=0`` turns it into a no-op (the fixed table stays)."""
        e = self._engine
        if e.world_size < 2 or not cost_model_enabled(default=True):
            return Work.completed("calibrate", None)
        call = agreements.calibrate(e)
        work = self._engine.issue(call, timeout)
        work.add_done_callback(_log_model)
        e.tuner.add(e.seq, work)
        return work

    @property
    def model_stats(self) -> dict[str, Any]:
        """The cost model's parameters (None before calibration), per collective the
        last choice (algorithm, segment size) with its predicted and measured seconds,
        and what the table chooses for: the group's agreed links (``links``, :attr:`medium`),
        the most rank processes per core on its hosts (``ranks_per_core``) and how many
        hosts it spans (``hosts``; the model chooses by default over more than one)."""
        e = self._engine
        return {**e.tuner.stats(), "links": e.medium, "ranks_per_core": e.ranks_per_core, "hosts": e.hosts}

    # -- groups -----------------------------------------------------------------------
    def split(self, color: int | None, key: int = 0, *, timeout: float | None = None) -> Work[Communicator | None]:
        """Collective: ranks passing the same ``color`` form a sub-group over the
        same links, ordered by (``key``, rank); the Work's result is the new
        Communicator (``None`` for ``color=None``, which joins none)."""
        for what, v in (("color", color), ("key", key)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0):
                raise ValueError(f"{what} must be a non-negative int{' or None' if what == 'color' else ''}, got {v!r}")
        row = np.array([-1 if color is None else color, key, self.rank], np.int64)
        index = self._splits
        self._splits += 1
        # a fixed algorithm: the sub-group is made from the result, whatever the model's state
        plan = moving.all_gather(self._engine, row, False, None, "doubling")
        version = self._engine.tuner.version_at(self._engine.seq)  # the split's, kept: the list moves on
        if isinstance(plan, Done):
            return Work.completed("split", self._sub(plan.value, color, index, version))
        gathered = plan.post
        assert gathered is not None

        def finish(value: Any) -> Communicator | None:
            return self._sub(gathered(value), color, index, version)

        plan.name, plan.post = "split", finish
        return self._engine.issue(plan, timeout)

    def _sub(self, table: Array, color: int | None, index: int, version: Version | None) -> Communicator | None:
        if color is None:
            return None
        mine = sorted((int(k), int(r)) for c, k, r in table if c == color)
        sub = Communicator(
            self._engine.mesh,
            group=f"{self.group}/split{index}:{color}",
            members=tuple(self.members[r] for _, r in mine),
            timeout=self.timeout,
            segment_bytes=self.segment_bytes if self._engine.fixed_segment else None,
        )
        sub._engine.tuner.inherit(self._engine.tuner, version)  # the parent's parameters at the split
        return sub

    def link_stats(self) -> dict[int, dict[str, Any]]:
        """This rank's link to each other member, by group rank: its kind
        (``"tcp"``, ``"memory"``, ...), traffic, bytes held for receives not yet
        posted, and flow-control credit (:class:`netcoll.links.base.LinkStats`), and
        ``stale_frames``: frames from it of another epoch of the group (an old one,
        before a :meth:`regroup`), dropped unread."""
        mesh = self._engine.mesh
        stats, stale = mesh.link_stats(), mesh.mailbox.stale
        return {
            r: {**stats[w].as_dict(), "stale_frames": stale.get(w, 0)} for r, w in enumerate(self.members) if w in stats
        }

    async def close(self) -> None:
        """Close the communicator (and, for the one :func:`connect` made, its links)."""
        if self._engine.closed:
            return
        self._engine.closed = True
        if not self._engine.deadlines.active:  # (running operations keep their deadlines)
            self._engine.deadlines.close()
        resultpool.RESULTS.clear()  # done with collectives: no result memory kept for reuse
        for hook in reversed(self._on_close):
            await hook()


def _torch_out(plan: Plan, io: TorchIO | None) -> None:
    """torch tensors in: torch tensors out."""
    if io is None:
        return
    if isinstance(plan, Done):
        plan.value = io.result(plan.value)
    else:
        post = plan.post
        plan.post = io.result if post is None else lambda value: io.result(post(value))


async def _never(ch: Any) -> None:
    raise AssertionError("a deferred call ran before it was planned")


def _log_model(work: Work) -> None:
    """A model operation ended: its new parameters, or why the old ones stay."""
    if work.cancelled():
        return
    exc = work.exception()
    if exc is not None:
        log.warning("%s #%s failed; the previous cost-model parameters stay: %s", work.name, work.seq, exc)
    elif work.result() is not None:
        log.info("%s #%s: cost-model parameters %s", work.name, work.seq, work.result())


__all__ = [
    "COST_MODEL_ENV",
    "DEFAULT_TIMEOUT",
    "Communicator",
    "as_bytes",
    "calibrate_if_enabled",
    "cost_model_enabled",
    "form_group",
]
