"""Elastic groups on a rank: the epochs of one :func:`netcoll.connect`.

An *epoch* is one membership of the group: the coordinator starts a group at
epoch 0, and each ``regroup`` round that changes who is in (members gone,
newcomers admitted) starts the next (:mod:`netcoll.rendezvous.elastic`). For each
epoch this rank has one :class:`~netcoll.mesh.tcpmesh.TcpMesh` (its own
peer-link session id on the process's one peer port, so no link or frame of an
old epoch reaches it) and one :class:`~netcoll.comm.Communicator` whose group id
names the epoch (``"<name>/e<epoch>"``: a frame of another epoch that reached its
mailbox would be dropped and counted, ``link_stats()["stale_frames"]``).

:class:`Epochs` holds the coordinator connection and the peer port for the
session's whole life, and the current epoch's mesh and Communicator;
``Communicator.regroup`` calls :meth:`Epochs.regroup`: one ``regroup`` RPC (the
round), then, if the membership changed, the old Communicator and mesh closed and
the new ones linked and formed (:func:`~netcoll.comm.form_group`). A rank whose
links broke under an unchanged membership (a link lost between two live ranks),
or whose last epoch failed to form, asks the round to *renew* the epoch, so every
member links anew.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from .comm import Communicator, form_group
from .errors import CommunicatorClosed, NetcollError, RegroupTimeout, RendezvousError
from .groupids import epoch_group
from .links.factory import LinkConfig
from .mesh.tcpmesh import Listener, TcpMesh
from .rendezvous import RendezvousClient

log = logging.getLogger("netcoll.session")

REPLY_MARGIN = 5.0  # the RPC waits this much longer than the round, so the coordinator's timeout error wins


class Epochs:
    """The current epoch's mesh and Communicator of one connect() session."""

    def __init__(
        self,
        rdv: RendezvousClient,
        listener: Listener,
        *,
        group: str,
        token: str | None,
        links: LinkConfig,
        collective_timeout: float,
        segment_bytes: int | None,
    ) -> None:
        self.rdv, self.listener, self.group = rdv, listener, group
        self.token, self.links = token, links
        self.collective_timeout, self.segment_bytes = collective_timeout, segment_bytes
        self.epoch = 0
        self.mesh: TcpMesh | None = None
        self.comm: Communicator | None = None

    async def open(self, result: dict[str, Any], timeout: float, *, joined: bool = False) -> Communicator:
        """Link to the peers of the epoch ``result`` describes (a join's or a round's
        answer: ``rank, world_size, session, peers``, ``epoch``) and form its group."""
        try:
            epoch, rank, size = int(result.get("epoch", 0)), int(result["rank"]), int(result["world_size"])
            peers = [(str(p["host"]), int(p["port"])) for p in result["peers"]]
            session = str(result["session"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RendezvousError(f"malformed epoch from the coordinator: {exc!r}") from None
        self.epoch = epoch
        mesh = TcpMesh(
            self.listener, rank=rank, size=size, session=session, peers=peers, token=self.token, links=self.links
        )
        mesh.mailbox.epoch = epoch
        mesh.decider = self.decide  # a partial all_reduce's contributors: the coordinator decides
        self.mesh = mesh
        try:
            await mesh.connect(timeout)
            # heartbeats carry what we are in (the arrival board); their answers, what those we wait for are in
            self.rdv.report_with(mesh.mailbox.snapshot, mesh.answers.seen)
            comm = Communicator(
                mesh,
                group=epoch_group(self.group, epoch),
                timeout=self.collective_timeout,
                segment_bytes=self.segment_bytes,
            )
            comm._regrouper, comm._joined = self.regroup, joined
            self.comm = comm
            await form_group(comm)  # link kinds agreed, the cost model calibrated if on (docs/algorithms.md)
        except BaseException:
            if self.comm is not None:
                self.comm._replaced = True  # (its regroup may be called again)
            await self.close()  # the next regroup renews the epoch
            raise
        return comm

    async def decide(self, group: str, seq: int, proposal: tuple[int, ...], timeout: float) -> tuple[int, ...]:
        """A partial all_reduce's contributors (:mod:`netcoll.algorithms.partial`): the
        first proposal for ``(group id, seq)`` the coordinator's store was given."""
        agreed = await self.rdv.kv_decide(f"partial/{group}", seq, list(proposal), group=self.group, timeout=timeout)
        return tuple(agreed) if isinstance(agreed, list) else agreed  # (checked by the algorithm)

    async def regroup(self, comm: Communicator, timeout: float) -> Communicator:
        """One regroup round from the current epoch (whichever of this session's
        Communicators it is called on): the current Communicator if nothing changed,
        else the next epoch's."""
        if self.rdv.closed:
            raise CommunicatorClosed("this session's coordinator connection is closed")
        mesh = self.mesh
        renew = self.comm is None or mesh is None or bool(mesh.mailbox.dead)
        params = {"group": self.group, "epoch": self.epoch, "timeout": timeout, "renew": renew}
        try:
            result = await self.rdv.rpc.call("regroup", params, timeout=timeout + REPLY_MARGIN)
        except ConnectionError as exc:
            raise RendezvousError(f"regroup: lost the coordinator at {self.rdv.address}: {exc}") from None
        except TimeoutError as exc:
            if isinstance(exc, NetcollError):  # the coordinator's own (RegroupTimeout)
                raise
            raise RegroupTimeout(f"regroup: the coordinator at {self.rdv.address} did not answer: {exc}") from None
        if not result.get("changed") and self.comm is not None:
            return self.comm
        if self.comm is not None:
            self.comm._replaced = True
        await self.close()
        new = await self.open(result, timeout)
        log.info("group %r: regrouped to epoch %d as rank %d of %d", self.group, self.epoch, new.rank, new.world_size)
        return new

    async def close(self) -> None:
        """Close the current epoch's Communicator and mesh (peers see an orderly BYE)."""
        comm, mesh = self.comm, self.mesh
        self.comm = self.mesh = None
        if comm is not None:
            with contextlib.suppress(Exception):
                await comm.close()
        if mesh is not None:
            await mesh.close()

    async def join_elastic(
        self, *, member_id: str | None, advertise_host: str | None, timeout: float
    ) -> dict[str, Any]:
        """Queue at the coordinator as an elastic newcomer of the group; the epoch a
        regroup admitted this process into."""
        member = member_id or self.rdv.member_id
        params = {
            "group": self.group,
            "elastic": True,
            "world_size": None,
            "rank": None,
            "member_id": member,
            "listen_port": self.listener.address[1],
            "advertise_host": advertise_host,
            "timeout": timeout,
        }
        result: dict[str, Any] = await self.rdv.rpc.call("join", params, timeout=timeout + REPLY_MARGIN)
        self.rdv.member_id, self.rdv.group = member, self.group  # (close() leaves the group)
        return result


__all__ = ["Epochs"]
