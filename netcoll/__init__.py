"""netcoll: collective communication (all_reduce, broadcast, all_gather, ...)
for numpy arrays, as an asyncio service over plain TCP.

    async with netcoll.Coordinator() as coord:          # or a coordinator process
        ...
    async with netcoll.connect(coord.address, world_size=4) as comm:
        y = await comm.all_reduce(x, op="sum")
"""

from __future__ import annotations

from .comm import Communicator
from .errors import (AuthenticationError, CollectiveAborted, CollectiveError, CollectiveTimeout,
                     CommunicatorClosed, MismatchError, NetcollError, PeerLost, ProtocolError,
                     RendezvousError, RendezvousTimeout)
from .ops import ReduceOp
from .rendezvous import Coordinator
from .service import Client, JobSpec
from .session import connect

__version__ = "0.1.0"

__all__ = [
    "Coordinator", "connect", "Communicator", "Client", "JobSpec", "ReduceOp", "NetcollError", "ProtocolError",
    "AuthenticationError", "RendezvousError", "RendezvousTimeout", "CommunicatorClosed",
    "CollectiveError", "CollectiveTimeout", "PeerLost", "MismatchError", "CollectiveAborted",
    "__version__",
]
