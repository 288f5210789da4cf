"""Per-peer links: each kind of link, the code that moves its bytes, and how a
pair's kind is chosen (see :mod:`.base` and :mod:`.factory`). The group's mesh
that holds one link per peer is :mod:`netcoll.mesh`.

* :mod:`.base` — the :class:`Link` interface and :class:`LinkStats`;
* :mod:`.flow` — credit window + RTS/CTS rendezvous bookkeeping (sans-IO);
* :mod:`.framed` — the peer protocol over any frame mover;
* :mod:`.tcp`, :mod:`.tls`, :mod:`.shm`, :mod:`.memory` — the link kinds
  (:mod:`.shmring`, :mod:`.lane`, :mod:`.shmlane`, :mod:`.cma`: the shared-memory
  segments, rings, lanes and single-copy reads of ``shm``; :mod:`.folding`: a
  payload reduced as a socket reads it);
* :mod:`.connection` — the framed connection every socket link runs over (and
  RPC too), on :mod:`.sockettransport`, netcoll's asyncio transport over one
  socket (:mod:`.delayline`: an emulated network delay under it, benchmarks only);
* :mod:`.factory` — capabilities in the handshake, the choice, the settings.

The names below are imported on first use, so that a module that needs only the
framed connection (RPC, the coordinator) does not load the link kinds (numpy).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Link": ".base",
    "LinkStats": ".base",
    "Flow": ".flow",
    "Capabilities": ".factory",
    "LinkConfig": ".factory",
    "LinkFactory": ".factory",
    "choose": ".factory",
}

__all__ = ["Link", "LinkStats", "Flow", "Capabilities", "LinkConfig", "LinkFactory", "choose"]

if TYPE_CHECKING:
    from .base import Link, LinkStats
    from .factory import Capabilities, LinkConfig, LinkFactory, choose
    from .flow import Flow


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
