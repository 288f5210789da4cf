"""What every ``netcoll`` command shares: the parser class, the flag groups that
several commands take, running a coroutine, and printing JSON.

Nothing here imports numpy or pydantic: ``netcoll health`` runs every few
seconds in healthchecks and must stay light.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

PROG = "netcoll"
#: Every command shows its help text as written (examples, aligned tables).
FORMATTER = argparse.RawDescriptionHelpFormatter

T = TypeVar("T")


class CliError(Exception):
    """An error for the user: one line, and the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (plus a pointer to --help), and no
    abbreviated options: ``--token`` is an error, never a prefix of ``--token-file``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


if TYPE_CHECKING:
    #: What each command module's ``add_parser`` adds its subparser to.
    Subparsers = argparse._SubParsersAction[Parser]


def add_server_arguments(sp: argparse.ArgumentParser) -> None:
    """Flags of the long-running servers (coordinator, rank)."""
    sp.add_argument(
        "--log-level", metavar="LEVEL", help="debug, info, warning, error (env NETCOLL_LOG_LEVEL; default info)"
    )
    sp.add_argument(
        "--ready-file", metavar="PATH", help="once serving, write the bound addresses there as JSON (for supervisors)"
    )
    add_tls_arguments(sp)


def add_tls_arguments(sp: argparse.ArgumentParser) -> None:
    """Mutual TLS: certificate, key and CA files (all three, or none)."""
    g = sp.add_argument_group("mutual TLS (all three files, or none; docs/reliability.md)")
    g.add_argument("--tls-cert", metavar="PEM", help="this process's certificate (env NETCOLL_TLS_CERT)")
    g.add_argument("--tls-key", metavar="PEM", help="its private key, unencrypted (env NETCOLL_TLS_KEY)")
    g.add_argument("--tls-ca", metavar="PEM", help="the CA every peer's certificate must chain to (env NETCOLL_TLS_CA)")


def add_log_format_argument(sp: argparse.ArgumentParser) -> None:
    """``--log-format json|text`` (every command; env NETCOLL_LOG_FORMAT)."""
    sp.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="log lines as text (UTC times) or one JSON object a line (env NETCOLL_LOG_FORMAT; default text)",
    )


def use_log_format(ns: argparse.Namespace, command: str) -> None:
    """Take ``--log-format`` off ``ns`` into ``NETCOLL_LOG_FORMAT`` (so the processes a
    command starts log the same way) and check it; client commands (which do not set
    up logging themselves) log warnings and errors to stderr in that format."""
    import os

    from .. import logs, settings

    chosen = getattr(ns, "log_format", None)
    if hasattr(ns, "log_format"):
        del ns.log_format
    if chosen is not None:
        os.environ[logs.ENV_FORMAT] = chosen
    try:
        logs.log_format()
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    if command not in SERVER_COMMANDS:
        level = settings.log_level().upper()
        logs.setup(level if level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "WARNING", command)


#: the commands that set up logging themselves (their --log-level)
SERVER_COMMANDS = ("coordinator", "rank")


def add_token_arguments(sp: argparse.ArgumentParser, *, client: bool, member_file: bool = True) -> None:
    """Credential flags. The member token itself is taken from the environment only
    (NETCOLL_TOKEN), so it never shows in a process list."""
    if member_file:
        sp.add_argument(
            "--token-file", metavar="PATH", help="read the member token from this file (env NETCOLL_TOKEN_FILE)"
        )
    if client:
        sp.add_argument(
            "--client-token",
            metavar="TOKEN",
            help="the client token: may submit, watch, get and cancel jobs and read status "
            "(env NETCOLL_CLIENT_TOKEN; prefer the variable or --client-token-file)",
        )
        sp.add_argument(
            "--client-token-file",
            metavar="PATH",
            help="read the client token from this file (env NETCOLL_CLIENT_TOKEN_FILE)",
        )


def add_insecure_argument(sp: argparse.ArgumentParser) -> None:
    """``--insecure``: listen off loopback without any token or TLS."""
    sp.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow listening on a non-loopback address without a token or TLS: anyone who can reach the "
        "port is trusted (env NETCOLL_INSECURE=1)",
    )


def add_client_arguments(sp: argparse.ArgumentParser) -> None:
    """Flags of the commands that talk to a coordinator (submit, status)."""
    sp.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="coordinator to talk to (env NETCOLL_COORDINATOR; default 127.0.0.1:29400)",
    )
    sp.add_argument(
        "--json", dest="json_output", action="store_true", default=None, help="print one JSON object instead of text"
    )
    sp.add_argument("--connect-timeout", type=float, metavar="SECONDS", help="default 10")
    add_token_arguments(sp, client=True)
    add_tls_arguments(sp)


def flags(ns: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags of a command, as the config models load them."""
    return {k: v for k, v in vars(ns).items() if k not in ("command", "handler")}


def run_server(coro: Coroutine[Any, Any, int]) -> int:
    """Run a server's main coroutine on netcoll's event loop (``netcoll.loop``:
    asyncio with a briefly spinning selector; ``NETCOLL_LOOP=asyncio|uvloop``)."""
    from ..loop import new_event_loop, run

    try:
        new_event_loop().close()  # a bad NETCOLL_LOOP is a clear error, before anything starts
    except ValueError:
        coro.close()
        raise
    return int(run(coro))


def run_client(coro: Coroutine[Any, Any, T]) -> T:
    """Run a client command's coroutine on a plain asyncio loop."""
    import asyncio

    return asyncio.run(coro)


def print_json(doc: Any) -> None:
    """One JSON object on one line of stdout."""
    sys.stdout.write(json.dumps(doc, default=str) + "\n")
    sys.stdout.flush()


class JsonDoc:
    """``with JsonDoc(enabled, coordinator=...) as doc:`` -- with ``--json``, stdout gets one
    JSON object whatever happens: the command prints its own on success; when it fails
    (cannot connect, a job that cannot be waited for, Ctrl-C...), this prints
    ``{..., "state": "error" | "interrupted", "error": message, "exit_code": n}`` with the
    fields noted in ``doc`` so far (a job's ``id``...), and the error still goes its way
    (one line on stderr, the exit code)."""

    def __init__(self, enabled: bool, **fields: Any) -> None:
        self.enabled, self.fields = enabled, dict(fields)

    def __enter__(self) -> dict[str, Any]:
        return self.fields

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        from .errors import json_failure

        failure = None if exc is None or not self.enabled else json_failure(exc)
        if failure is not None:
            message, code = failure
            state = "interrupted" if code == 130 else "error"
            print_json({**self.fields, "state": state, "error": message, "exit_code": code})


def mean(values: list[float]) -> float | None:
    """The mean of ``values`` (None for none)."""
    return sum(values) / len(values) if values else None
