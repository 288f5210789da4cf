"""Configuration of the ``netcoll`` commands: one pydantic model per command
(:mod:`.commands`), each a :class:`~netcoll.config.base.Settings` (:mod:`.base`).

Each model merges, in increasing priority: its defaults, ``NETCOLL_*``
environment variables, then command-line flags (a flag always wins)::

    cfg = RankConfig.load({"port": "29500"}, os.environ)

The variables (``NETCOLL_COORDINATOR``, ``NETCOLL_TOKEN``, ``NETCOLL_HOST``, ...) are
declared in :mod:`netcoll.settings` (name, default, meaning, which command reads them:
the README's "Settings" table is generated from it) and read through
:func:`netcoll.settings.raw`; each model's :attr:`Settings.ENV` maps its fields to them.
``NETCOLL_TRANSPORT`` and ``NETCOLL_RECV_WINDOW`` are read where links are made
(:class:`netcoll.links.factory.LinkConfig`), so they apply to rank daemons and embedded
ranks alike.

An empty variable counts as unset (compose passes ``NETCOLL_TOKEN:`` through
empty when the caller has none).

Secure by default: a coordinator or rank daemon asked to listen on an address
other than loopback with neither a token nor TLS refuses to start
(:meth:`Settings.require_credentials`, exit 2) unless ``--insecure``. :meth:`Settings.load` raises
:class:`ConfigError` with one line naming the flag or variable at fault.

This package does not import numpy (``netcoll health`` stays cheap).
"""

from ..errors import ConfigError
from ..mesh.auth import is_loopback
from .base import (
    COORDINATOR_HTTP_PORT,
    COORDINATOR_PORT,
    DEFAULT_COORDINATOR,
    LOG_LEVELS,
    RANK_HTTP_PORT,
    RANK_PORT,
    TLS_ENV,
    LogLevel,
    Settings,
    check_address,
    http_port_after,
)
from .commands import ClientConfig, CoordinatorConfig, RankConfig, StatusConfig, SubmitConfig, UpConfig

__all__ = [
    "COORDINATOR_HTTP_PORT",
    "COORDINATOR_PORT",
    "DEFAULT_COORDINATOR",
    "LOG_LEVELS",
    "RANK_HTTP_PORT",
    "RANK_PORT",
    "TLS_ENV",
    "ClientConfig",
    "ConfigError",
    "CoordinatorConfig",
    "LogLevel",
    "RankConfig",
    "Settings",
    "StatusConfig",
    "SubmitConfig",
    "UpConfig",
    "check_address",
    "http_port_after",
    "is_loopback",
]
