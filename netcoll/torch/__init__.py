"""``import netcoll.torch`` registers the torch.distributed backend ``"netcoll"``.

A torch script changes two lines to run on netcoll::

    import netcoll.torch
    torch.distributed.init_process_group("netcoll")

and is started with ``netcoll run -n 4 train.py`` (which sets torch's
``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` and netcoll's
``NETCOLL_*`` variables). CPU tensors only; see docs/torch.md for what is and
is not supported. This package imports torch (``pip install netcoll[torch]``);
the rest of netcoll never does.
"""

from __future__ import annotations

import torch.distributed as dist

from .backend import ProcessGroupNetcoll
from .hooks import CompressionState, compressed_allreduce_hook, compression_hook
from .world import GROUP, create, rebuild, world

#: the backend's name for ``init_process_group`` / ``new_group``
BACKEND = "netcoll"

if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu"])

__all__ = [
    "BACKEND",
    "GROUP",
    "CompressionState",
    "ProcessGroupNetcoll",
    "compressed_allreduce_hook",
    "compression_hook",
    "create",
    "rebuild",
    "world",
]
