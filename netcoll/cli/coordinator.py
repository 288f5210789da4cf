"""``netcoll coordinator``: rendezvous + job service + HTTP health/metrics."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import FORMATTER, add_server_arguments, flags, run_server

if TYPE_CHECKING:
    from .common import Subparsers

HELP = "run the coordinator (rendezvous + job service)"


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "coordinator",
        formatter_class=FORMATTER,
        help=HELP,
        description="Run the coordinator: rank daemons register here, clients submit jobs here.\n"
        "HTTP /livez /readyz /metrics on --http-port. Token: env NETCOLL_TOKEN.",
    )
    sp.add_argument(
        "--host", help="address to listen on (env NETCOLL_HOST; default 127.0.0.1, 0.0.0.0 for every interface)"
    )
    sp.add_argument("--port", help="RPC port (env NETCOLL_PORT; default 29400; 0 = any free port)")
    sp.add_argument(
        "--http-port", help="HTTP health/metrics port (env NETCOLL_HTTP_PORT; default 29401; 'off' disables it)"
    )
    sp.add_argument("--http-host", help="address of the HTTP port (default: --host)")
    add_server_arguments(sp)
    sp.set_defaults(handler=run)
    return sp


def run(ns: argparse.Namespace) -> int:
    from ..config import CoordinatorConfig
    from ..service.serve import serve_coordinator, setup_logging

    cfg = CoordinatorConfig.load(flags(ns))
    setup_logging(cfg.level, "coordinator")
    return run_server(serve_coordinator(cfg))
