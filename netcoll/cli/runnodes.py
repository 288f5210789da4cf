"""Several nodes under ``netcoll run``: how the launchers meet and keep in step, through
node 0's coordinator (semantics: docs/training.md, "Several nodes" and "Restarts").

The launchers are the members of the group :data:`LAUNCH_GROUP` there, one per node, ranked
by node; its key-value store carries what they share:

* ``attempt/<n>``: what node 0 chose for attempt ``n`` (the ranks' coordinator port, None
  for node 0's own coordinator; ``MASTER_PORT``);
* ``failures/<n>`` (a counter) and ``failed/<n>`` (set by the first to count): a node whose
  ranks failed in attempt ``n``, with its status and cause; every launcher watches it to stop
  its own ranks;
* ``interrupts/<n>``: a launcher got a signal: nobody restarts;
* barrier ``end/<n>``: every node's ranks of attempt ``n`` have ended.

With fixed node ranks (``--node-rank``) the launchers join the group at once. Else (``--nnodes
MIN:MAX``, or M without ``--node-rank``) node 0 -- the launcher that runs the coordinator --
serves :data:`ARRIVE` (:class:`Lobby`): each launcher arrives; once MIN have (node 0
included), the group forms after ``--last-call`` seconds with every node that arrived (at
most MAX), node ranks in order of arrival; a node arriving later is told so and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .common import CliError
from .supervisor import say

if TYPE_CHECKING:
    from ..rendezvous import RendezvousClient
    from ..rpc import Session
    from .run import Plan

LAUNCH_GROUP = "netcoll-run"  # the launchers' own group at the coordinator
ARRIVE = "netcoll_run.arrive"  # the RPC method node 0 serves with --nnodes MIN:MAX


class Lobby:
    """Node 0's side of forming a group of MIN..MAX nodes: who arrived, in order (node 0
    first), and the number of nodes once formed."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.arrived: list[object] = [self]  # node 0 arrived first
        self.formed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._last_call: asyncio.TimerHandle | None = None
        self._check()

    def _check(self) -> None:
        n = len(self.arrived)
        if n >= self.plan.max_nodes:
            self._form()
        elif n >= self.plan.min_nodes and self._last_call is None:
            self._last_call = asyncio.get_running_loop().call_later(self.plan.last_call, self._form)

    def _form(self) -> None:
        self._last_call = None
        if self.formed.done():
            return
        if len(self.arrived) < self.plan.min_nodes:  # one left during the last call
            return
        self.formed.set_result(len(self.arrived))

    def close(self) -> None:
        if self._last_call is not None:
            self._last_call.cancel()
        if not self.formed.done():
            self.formed.cancel()

    async def arrive(self, session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        """A node's launcher arrives (the RPC :data:`ARRIVE`): its node rank and the number
        of nodes, once the group forms."""
        from ..errors import RendezvousError

        plan = self.plan
        theirs = (params.get("nprocs"), params.get("max_restarts"), params.get("nnodes"))
        mine = (plan.nprocs, plan.max_restarts, plan.nnodes_flag)
        if theirs != mine:
            raise RendezvousError(
                "every node must run with the same -n, --max-restarts and --nnodes: node 0 has "
                f"{_flags(mine)}, this node {_flags(theirs)}"
            )
        if self.formed.done() or len(self.arrived) >= plan.max_nodes:
            raise RendezvousError(
                f"the group already formed with {len(self.arrived)} node(s) (--nnodes {plan.nnodes_flag}): "
                "a node must arrive before node 0's last call ends (--last-call)"
            )
        me = object()
        self.arrived.append(me)
        self._check()
        try:
            nnodes = await asyncio.shield(self.formed)
        except asyncio.CancelledError:
            if not self.formed.done():
                self.arrived.remove(me)  # it went away before the group formed
            raise
        return {"nnodes": nnodes, "node_rank": self.arrived.index(me)}


def _flags(values: tuple[Any, ...]) -> str:
    n, k, nodes = (str(v)[:40] for v in values)
    return f"-n {n} --max-restarts {k} --nnodes {nodes}"


@dataclass
class Failure:
    """A node's ranks failed in an attempt: its ``status`` and ``text`` (the cause)."""

    node: int
    status: int
    text: str


class Nodes:
    """One launcher's seat in :data:`LAUNCH_GROUP` (``rdv``): the attempts in step."""

    def __init__(self, plan: Plan, rdv: RendezvousClient) -> None:
        self.plan = plan
        self.rdv = rdv

    async def attempt_info(self, attempt: int, chosen: dict[str, Any] | None) -> dict[str, Any]:
        """Node 0 publishes what it ``chosen`` for ``attempt``; the others read it."""
        key = f"attempt/{attempt}"
        if chosen is not None:
            await self.rdv.kv_set(key, chosen)
            return chosen
        got = await self.rdv.kv_get(key, self.plan.join_timeout)
        if not isinstance(got, dict):
            raise CliError(f"node 0 published no settings for attempt {attempt}: {got!r:.80}")
        return got

    async def report(self, attempt: int, status: int, text: str) -> None:
        """This node's ranks failed in ``attempt``: tell the others (the first to tell is the cause)."""
        if await self.rdv.kv_add(f"failures/{attempt}") == 1:
            await self.rdv.kv_set(f"failed/{attempt}", {"node": self.plan.node_rank, "status": status, "text": text})

    async def interrupted(self, attempt: int, status: int) -> None:
        """A signal here: no node restarts after ``attempt``."""
        await self.rdv.kv_add(f"interrupts/{attempt}")
        await self.report(attempt, status, "its launcher got a signal")

    async def failure(self, attempt: int, timeout: float | None = None) -> Failure:
        """Wait until some node reports that its ranks failed in ``attempt``."""
        got = await self.rdv.kv_get(f"failed/{attempt}", timeout)
        if not isinstance(got, dict):
            raise CliError(f"a node reported a failure of attempt {attempt} that is not one: {got!r:.80}")
        return Failure(int(got.get("node", -1)), int(got.get("status", 1)), str(got.get("text", ""))[:1000])

    async def ended(self, attempt: int) -> tuple[Failure | None, bool]:
        """Wait until every node's ranks of ``attempt`` ended: the failure (None: the attempt
        succeeded everywhere) and whether a launcher was interrupted."""
        await self.rdv.barrier(f"end/{attempt}", None)
        if await self.rdv.kv_add(f"failures/{attempt}", 0) == 0:
            return None, False
        interrupted = await self.rdv.kv_add(f"interrupts/{attempt}", 0) > 0
        return await self.failure(attempt, self.plan.join_timeout), interrupted


async def arrive(plan: Plan, rdv: RendezvousClient, lobby: Lobby | None) -> tuple[int, int]:
    """Arrive at node 0's lobby (``lobby``: ours, on node 0): (nodes, this node's rank)."""
    from ..errors import NetcollError

    if lobby is not None:
        try:
            nnodes = await asyncio.wait_for(asyncio.shield(lobby.formed), plan.join_timeout)
        except TimeoutError:
            raise CliError(
                f"only {len(lobby.arrived)} of at least {plan.min_nodes} nodes arrived within "
                f"--join-timeout {plan.join_timeout:g}s"
            ) from None
        return nnodes, 0
    params = {"nprocs": plan.nprocs, "max_restarts": plan.max_restarts, "nnodes": plan.nnodes_flag}
    try:
        got = await rdv.rpc.call(ARRIVE, params, timeout=plan.join_timeout)
    except TimeoutError:
        raise CliError(f"the group did not form within --join-timeout {plan.join_timeout:g}s") from None
    except NetcollError as exc:
        raise CliError(f"node 0 at {rdv.address} did not take this node: {exc}") from None
    return int(got["nnodes"]), int(got["node_rank"])


async def meet(plan: Plan, address: str, token: str | None, lobby: Lobby | None) -> tuple[Plan, Nodes]:
    """Join the launchers' group (one member per node), arriving first when node ranks
    are given by arrival; waits for node 0's coordinator (:func:`netcoll.rendezvous.dial`)
    within --join-timeout. The plan with the number of nodes and this node's rank."""
    from dataclasses import replace

    from ..errors import RendezvousTimeout
    from ..rendezvous import dial

    loop = asyncio.get_running_loop()
    deadline = loop.time() + plan.join_timeout
    try:
        rdv = await dial(address, timeout=plan.join_timeout, token=token, local_host=plan.local_addr, heartbeat=None)
    except RendezvousTimeout as exc:
        raise CliError(str(exc)) from None
    try:
        if plan.node_rank is None:
            nnodes, node_rank = await arrive(plan, rdv, lobby)
            plan = replace(plan, nnodes=nnodes, node_rank=node_rank)
            say(f"the group formed with {nnodes} node(s); this is node {node_rank}")
        await rdv.join(
            LAUNCH_GROUP, world_size=plan.nnodes, rank=plan.node_rank, timeout=max(1.0, deadline - loop.time())
        )
    except BaseException:
        with contextlib.suppress(Exception):
            await rdv.close()
        raise
    return plan, Nodes(plan, rdv)


__all__ = ["ARRIVE", "LAUNCH_GROUP", "Failure", "Lobby", "Nodes", "arrive", "meet"]
