"""Rendezvous: how ranks find each other.

A :class:`Coordinator` (one per deployment, usually ``coordinator:29400``)
keeps named *groups*. Members connect with a :class:`RendezvousClient` and
``join`` a group; when ``world_size`` members are in, each gets a
:class:`JoinResult` with its rank and the peer table (one :class:`Peer` per
rank: the host the coordinator saw it connect from, or the one it advertised,
and the port it listens on for peer traffic).

Ranks are assigned the way torch's dynamic rendezvous does it: members need
no orchestrator ordinal (docker compose gives replicas none); each makes its
own ``member_id`` and, after honouring explicit ranks (a pod index, a
``RANK=``), the coordinator hands the remaining ranks out in order of the
sorted member ids, so they are stable and contiguous ``0..n-1``.

A running group also offers a key-value store and named barriers scoped to
that group instance, and tells its members when one of them is lost. See
:mod:`.coordinator` for the RPC methods; the rules are in :mod:`.membership`,
:mod:`.store`, :mod:`.liveness`, :mod:`.roles` and :mod:`.groups`.
"""

from .client import JoinResult, Peer, RendezvousClient
from .coordinator import Coordinator
from .dialing import dial

__all__ = ["Coordinator", "RendezvousClient", "JoinResult", "Peer", "dial"]
