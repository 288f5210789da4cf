"""``netcoll coordinator``: rendezvous + job service + HTTP health/metrics."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import (
    FORMATTER,
    CliError,
    add_insecure_argument,
    add_server_arguments,
    add_token_arguments,
    flags,
    run_server,
)

if TYPE_CHECKING:
    from .common import Subparsers

HELP = "run the coordinator (rendezvous + job service)"


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "coordinator",
        formatter_class=FORMATTER,
        help=HELP,
        description="Run the coordinator: rank daemons register here, clients submit jobs here.\n"
        "HTTP /livez /readyz /metrics on --http-port. Member token: env NETCOLL_TOKEN (rank daemons);\n"
        "client token: env NETCOLL_CLIENT_TOKEN (job submitters). Off loopback a token is required\n"
        "unless --insecure.\n"
        "With --state-dir, queued jobs, finished records and job ids survive a restart;\n"
        "an unusable state dir (corrupt, locked, not writable) exits 2.",
    )
    sp.add_argument(
        "--host", help="address to listen on (env NETCOLL_HOST; default 127.0.0.1, 0.0.0.0 for every interface)"
    )
    sp.add_argument("--port", help="RPC port (env NETCOLL_PORT; default 29400; 0 = any free port)")
    sp.add_argument(
        "--http-port",
        help="HTTP health/metrics port (env NETCOLL_HTTP_PORT; default: --port + 1, so 29401; 'off' disables it)",
    )
    sp.add_argument("--http-host", help="address of the HTTP port (env NETCOLL_HTTP_HOST; default: --host)")
    sp.add_argument(
        "--state-dir",
        metavar="DIR",
        help="keep the job journal there, so jobs survive a restart (env NETCOLL_STATE_DIR; default: in memory)",
    )
    sp.add_argument(
        "--keep-jobs", type=int, metavar="N", help="finished jobs kept queryable (env NETCOLL_KEEP_JOBS; default 1000)"
    )
    add_token_arguments(sp, client=True)
    add_insecure_argument(sp)
    add_server_arguments(sp)
    sp.set_defaults(handler=run)
    return sp


def run(ns: argparse.Namespace) -> int:
    from ..config import CoordinatorConfig
    from ..service.journal import JournalError
    from ..service.serve import serve_coordinator, setup_logging

    cfg = CoordinatorConfig.load(flags(ns))
    cfg.require_credentials("coordinator")  # secure by default: exit 2, one line
    setup_logging(cfg.level, "coordinator")
    try:
        return run_server(serve_coordinator(cfg))
    except JournalError as exc:  # a configuration problem: exit 2, one line
        raise CliError(str(exc), 2) from None
