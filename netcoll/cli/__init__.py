"""The ``netcoll`` command line (also ``python -m netcoll``).

Servers (what the containers run)::

    netcoll coordinator [--host H] [--port 29400] [--http-port PORT+1]
    netcoll rank [--coordinator HOST:PORT] [--host H] [--port 0] [--http-port 0]
                 [--rank-hint I] [--advertise-host A]
    netcoll up --ranks N [--host H] [--port P] [--demo]      # coordinator + N daemons, locally

Training scripts (like torchrun)::

    netcoll run -n N [--nnodes M --node-rank K] [--coordinator HOST:PORT] script.py [args ...]

Clients::

    netcoll submit OP [--size 64MiB] [--dtype float32] [--op sum] [--root R] [--algorithm auto]
                      [--iters K] [--warmup W] [--world-size N] [--deadline S] [--json]
    netcoll status [--json]
    netcoll health URL                # exit 0 iff GET URL answers 200 (container healthchecks)
    netcoll bench ...                 # nccl-tests-style sweep (see netcoll bench --help)

Client commands take ``--coordinator HOST:PORT`` (default ``$NETCOLL_COORDINATOR``,
else ``127.0.0.1:29400``); every command reads ``NETCOLL_*`` variables (see
:mod:`netcoll.config`), and a flag wins over its variable. Sizes (``--size``,
``bench -b/-e``) take ``4096``, ``4KiB``, ``64MiB``, ``1.5M``, ``1G``, ``12MB``:
KiB/MiB/GiB and a bare K/M/G are powers of 1024, KB/MB/GB of 1000
(:mod:`netcoll.sizes`). Collectives and their algorithms come from
:mod:`netcoll.collectives`.

Exit codes: 0 success; 1 failure (a job that did not succeed, an unreachable
coordinator...); 2 bad arguments or configuration; 130 interrupted. Every
error is one line on stderr, never a traceback.

One module per command (``netcoll.cli.<command>``: ``add_parser`` and ``run``);
:mod:`.common` and :mod:`.errors` hold what they share. Imports are lazy and
only the command being run gets its full parser, so ``netcoll health`` (run
every few seconds by healthchecks) loads neither numpy nor pydantic.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from ..choices import REDUCE_OPS
from ..collectives import NAMES as COLLECTIVES
from .common import FORMATTER, PROG, CliError, Parser, add_log_format_argument, flags, use_log_format
from .errors import fail, guarded
from .health import http_get

__all__ = ["COLLECTIVES", "COMMANDS", "PROG", "REDUCE_OPS", "CliError", "build_parser", "http_get", "main"]

#: Every command, in ``--help`` order; each is the module ``netcoll.cli.<command>``.
COMMANDS = ("coordinator", "rank", "up", "run", "submit", "status", "health", "bench")

_flags = flags  # the name tests/deploy/test_deploy_static.py uses


def _command_module(name: str) -> ModuleType:
    return importlib.import_module(f".{name}", __name__)


def _version() -> str:
    from .. import __version__

    return str(__version__)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``netcoll`` parser. ``only``: give just that command its flags (the others
    are listed, with their help line); None builds every command in full."""
    p = Parser(
        prog=PROG,
        formatter_class=FORMATTER,
        description="Collective communication over TCP: a coordinator, rank daemons, and jobs.",
        epilog="Quick start:  netcoll up --ranks 4 --demo\n"
        "Then, with `netcoll up --ranks 4` running:  netcoll submit all_reduce --size 64MiB",
    )
    p.add_argument("--version", action="version", version=f"netcoll {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        module = _command_module(name)
        if only is None or only == name:
            add_log_format_argument(module.add_parser(sub))
        else:
            sub.add_parser(name, help=module.HELP, add_help=False)
    return p


def _command_in(args: list[str]) -> str:
    """The command named in ``args`` (the first word that is not an option), or ""."""
    return next((a for a in args if not a.startswith("-")), "")


class _Invocation:
    """One run of the command line: its arguments, and the name its errors carry
    (``netcoll``, then ``netcoll <command>`` once the command is known)."""

    def __init__(self, args: list[str]) -> None:
        self.args, self.prog = args, PROG

    def dispatch(self) -> int:
        """Parse the arguments and run the command; its exit code."""
        if self.args[:1] == ["bench"]:  # its flags are netcoll.bench's: no second parse
            self.prog = f"{PROG} bench"
            return int(_command_module("bench").run(self.args[1:]))
        parser = build_parser(only=_command_in(self.args))
        ns = parser.parse_args(self.args)
        if ns.command is None:
            parser.print_usage(sys.stderr)
            return fail(PROG, "choose a command: " + ", ".join(COMMANDS) + " (see netcoll --help)", 2)
        self.prog = f"{PROG} {ns.command}"
        use_log_format(ns, ns.command)
        return int(ns.handler(ns))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``netcoll`` command line; return the exit code."""
    run = _Invocation(list(sys.argv[1:] if argv is None else argv))
    return guarded(lambda: run.prog, run.dispatch)
