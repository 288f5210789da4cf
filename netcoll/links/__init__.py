"""Per-peer links and how they are chosen (see :mod:`.base` and :mod:`.factory`).

* :mod:`.base` — the :class:`Link` interface and :class:`LinkStats`;
* :mod:`.flow` — credit window + RTS/CTS rendezvous bookkeeping (sans-IO);
* :mod:`.framed` — the peer protocol over any frame mover;
* :mod:`.tcp`, :mod:`.tls`, :mod:`.shm`, :mod:`.memory` — the link kinds
  (:mod:`.shmring`: the shared-memory segments and rings of ``shm``);
* :mod:`.factory` — capabilities in the handshake, the choice, the settings.
"""

from __future__ import annotations

from .base import Link, LinkStats
from .factory import Capabilities, LinkConfig, LinkFactory, choose
from .flow import Flow

__all__ = ["Link", "LinkStats", "Flow", "Capabilities", "LinkConfig", "LinkFactory", "choose"]
