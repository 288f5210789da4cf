"""netcoll: collective communication (all_reduce, broadcast, all_gather, ...)
for numpy arrays, as an asyncio service over plain TCP.

    async with netcoll.Coordinator() as coord:          # or a coordinator process
        ...
    async with netcoll.connect(coord.address, world_size=4) as comm:
        y = await comm.all_reduce(x, op="sum")

The names below are imported on first use, so that light entry points (the
``netcoll health`` healthcheck) do not pay for numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Coordinator": ".rendezvous",
    "connect": ".session",
    "Communicator": ".comm",
    "Client": ".service",
    "JobSpec": ".service",
    "ReduceOp": ".ops",
    "Work": ".operation",
    "Reason": ".operation",
    "TlsConfig": ".mesh.certs",
    "TlsConfigError": ".mesh.certs",
    **dict.fromkeys(
        (
            "NetcollError",
            "ProtocolError",
            "AuthenticationError",
            "InsecureListenerError",
            "RendezvousError",
            "RendezvousTimeout",
            "RegroupTimeout",
            "CommunicatorClosed",
            "CollectiveError",
            "CollectiveTimeout",
            "PeerLost",
            "MismatchError",
            "CollectiveAborted",
            "CollectiveCancelled",
            "CollectiveClosed",
            "PartialExcluded",
            "PartialMismatch",
            "LimitExceeded",
            "ConfigError",
        ),
        ".errors",
    ),
}

__all__ = [
    "AuthenticationError",
    "Client",
    "CollectiveAborted",
    "CollectiveCancelled",
    "CollectiveClosed",
    "CollectiveError",
    "CollectiveTimeout",
    "LimitExceeded",
    "Reason",
    "Work",
    "Communicator",
    "CommunicatorClosed",
    "ConfigError",
    "Coordinator",
    "InsecureListenerError",
    "JobSpec",
    "MismatchError",
    "NetcollError",
    "PartialExcluded",
    "PartialMismatch",
    "PeerLost",
    "ProtocolError",
    "ReduceOp",
    "RegroupTimeout",
    "RendezvousError",
    "RendezvousTimeout",
    "TlsConfig",
    "TlsConfigError",
    "__version__",
    "connect",
]

if TYPE_CHECKING:
    from .comm import Communicator
    from .errors import (
        AuthenticationError,
        CollectiveAborted,
        CollectiveCancelled,
        CollectiveClosed,
        CollectiveError,
        CollectiveTimeout,
        CommunicatorClosed,
        ConfigError,
        LimitExceeded,
        MismatchError,
        NetcollError,
        PartialExcluded,
        PartialMismatch,
        PeerLost,
        ProtocolError,
        RegroupTimeout,
        RendezvousError,
        RendezvousTimeout,
    )
    from .operation import Reason, Work
    from .ops import ReduceOp
    from .rendezvous import Coordinator
    from .service import Client, JobSpec
    from .session import connect


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):  # a submodule, as `import netcoll` used to load them all
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
