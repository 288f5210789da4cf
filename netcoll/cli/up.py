"""``netcoll up``: a coordinator and N rank daemons as local processes."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..sizes import size_arg
from .common import FORMATTER, add_tls_arguments, flags, run_server

if TYPE_CHECKING:
    from .common import Subparsers

HELP = "run a coordinator and N rank daemons locally"


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "up",
        formatter_class=FORMATTER,
        help=HELP,
        description="Start a coordinator and N rank daemons as local processes (the same entry\n"
        "points the containers use) and keep them running until Ctrl-C.",
    )
    sp.add_argument("--ranks", "-n", type=int, default=None, metavar="N", help="rank daemons (default 4)")
    sp.add_argument("--host", help="address for every process (env NETCOLL_HOST; default 127.0.0.1)")
    sp.add_argument("--port", help="coordinator port (env NETCOLL_PORT; default 29400; 0 = any free port)")
    sp.add_argument("--http-port", help="coordinator HTTP port (default: --port + 1; 'off')")
    sp.add_argument("--log-level", metavar="LEVEL", help="log level of the processes (default warning)")
    sp.add_argument(
        "--demo",
        action="store_true",
        default=None,
        help="when ready, run every collective once, print the results, stop (exit 0 if all passed)",
    )
    sp.add_argument(
        "--size",
        type=size_arg,
        metavar="SIZE",
        help="--demo: bytes per rank, e.g. 64KiB, 1.5M (K/M and KiB/MiB: powers of 1024, KB/MB: 1000; default 1MiB)",
    )
    sp.add_argument("--iters", type=int, metavar="K", help="--demo: iterations per collective (default 3)")
    sp.add_argument("--ready-timeout", type=float, metavar="SECONDS", help="default 60")
    add_tls_arguments(sp)  # passed to every child (NETCOLL_TLS_*)
    sp.set_defaults(handler=run)
    return sp


def run(ns: argparse.Namespace) -> int:
    from ..config import UpConfig
    from ..service.local import serve_local

    cfg = UpConfig.load(flags(ns))
    return run_server(serve_local(cfg))
