"""``netcoll rank``: a rank daemon that joins a coordinator and runs its jobs."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import FORMATTER, add_insecure_argument, add_server_arguments, add_token_arguments, flags, run_server

if TYPE_CHECKING:
    from .common import Subparsers

HELP = "run a rank daemon that joins a coordinator"


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "rank",
        formatter_class=FORMATTER,
        help=HELP,
        description="Run a rank daemon: it registers with the coordinator, which assigns its rank,\n"
        "and runs the jobs it is sent. SIGTERM drains and leaves. "
        "Member token: env NETCOLL_TOKEN (or NETCOLL_TOKEN_FILE); off loopback a token is required\n"
        "unless --insecure.",
    )
    sp.add_argument(
        "--coordinator", metavar="HOST:PORT", help="the coordinator (env NETCOLL_COORDINATOR; default 127.0.0.1:29400)"
    )
    sp.add_argument(
        "--host",
        help="address to listen on for peers, and to dial the coordinator from when "
        "specific (env NETCOLL_HOST; default 0.0.0.0)",
    )
    sp.add_argument(
        "--port",
        help="the one port for all peer traffic (env NETCOLL_PORT; default 0: any free port, "
        "told to the coordinator, so several daemons can share a host)",
    )
    sp.add_argument(
        "--http-port",
        help="HTTP health/metrics port (env NETCOLL_HTTP_PORT; default 0: any free port, logged "
        "and shown by netcoll status; 'off')",
    )
    sp.add_argument("--http-host", help="address of the HTTP port (env NETCOLL_HTTP_HOST; default: --host)")
    sp.add_argument(
        "--rank-hint",
        metavar="RANK",
        help="preferred rank, e.g. the pod index; honoured when free (env NETCOLL_RANK_HINT)",
    )
    sp.add_argument(
        "--advertise-host",
        metavar="HOST",
        help="address peers dial (env NETCOLL_ADVERTISE_HOST; default: the address the "
        "coordinator sees this daemon connect from)",
    )
    sp.add_argument("--member-id", help="member id (default: HOSTNAME-PID-RANDOM)")
    sp.add_argument("--heartbeat", type=float, metavar="SECONDS", help=argparse.SUPPRESS)
    add_token_arguments(sp, client=False)
    add_insecure_argument(sp)
    add_server_arguments(sp)
    sp.set_defaults(handler=run)
    return sp


def run(ns: argparse.Namespace) -> int:
    from ..config import RankConfig
    from ..service.serve import serve_rank, setup_logging

    cfg = RankConfig.load(flags(ns))
    cfg.require_credentials("rank daemon")  # secure by default: exit 2, one line
    tag = setup_logging(cfg.level, "rank")
    return run_server(serve_rank(cfg, tag))
