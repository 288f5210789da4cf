"""``netcoll bench``: the nccl-tests-style sweep of :mod:`netcoll.bench`, whose
flags it takes as they are (``netcoll bench --help``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import FORMATTER, PROG, CliError, Parser, add_tls_arguments, add_token_arguments
from .errors import one_line

if TYPE_CHECKING:
    from .common import Subparsers

HELP = "nccl-tests-style benchmark sweep (netcoll bench --help)"


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """A placeholder that takes every argument: :func:`run` parses them with the bench's parser."""
    sp = sub.add_parser("bench", add_help=False, help=HELP)
    sp.add_argument("bench_args", nargs=argparse.REMAINDER)
    sp.set_defaults(handler=lambda ns: run(list(ns.bench_args)))
    return sp


def bench_parser() -> argparse.ArgumentParser:
    """The parser of ``netcoll bench``: :func:`netcoll.bench.add_arguments` plus the
    credential and TLS flags of the other client commands."""
    import importlib

    try:
        bench = importlib.import_module("..bench", __package__)
        add_arguments = bench.add_arguments
    except ImportError as exc:
        raise CliError(f"netcoll bench is not available in this installation ({one_line(exc)})") from None
    except AttributeError:
        raise CliError(
            "netcoll bench is not available in this installation (netcoll.bench has no add_arguments/run)"
        ) from None
    parser = Parser(
        prog=f"{PROG} bench", description=(bench.__doc__ or "").strip().split("\n\n")[0], formatter_class=FORMATTER
    )
    add_arguments(parser)
    # --coordinator: the credential flags of the other client commands (env NETCOLL_TOKEN,
    # NETCOLL_CLIENT_TOKEN, their _FILE variants and NETCOLL_TLS_* otherwise)
    add_token_arguments(parser, client=True)
    add_tls_arguments(parser)
    return parser


def run(argv: list[str]) -> int:
    """Parse ``argv`` with :func:`bench_parser` and run the sweep."""
    import asyncio

    from .. import bench

    args = bench_parser().parse_args(argv)
    return int(asyncio.run(bench.run(args)))
