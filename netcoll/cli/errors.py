"""How the ``netcoll`` commands fail: every error is one line on stderr and an
exit code, never a traceback (unless ``NETCOLL_DEBUG`` asks for one).

Exit codes: 0 success; 1 failure (a job that did not succeed, an unreachable
coordinator...); 2 bad arguments or configuration; 130 interrupted; 141
stdout closed early (``netcoll status | head``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from .. import settings
from ..escape import escape
from .common import CliError


def one_line(exc: BaseException) -> str:
    """An exception as one line (pydantic's multi-line ValidationError included)."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":
        try:
            parts = []
            for err in errors(include_url=False):
                loc = ".".join(str(x) for x in err.get("loc", ()) if x != "__root__")
                msg = str(err.get("msg", "")).removeprefix("Value error, ")
                parts.append(f"{loc}: {msg}" if loc else msg)
            return "; ".join(parts)
        except Exception:  # noqa: BLE001 - fall back to str() below
            pass
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else (str(exc) or type(exc).__name__)
    return escape(" ".join(text.split()), 1000)  # a peer's message: no terminal escapes, bounded


def fail(prog: str, message: str, code: int) -> int:
    """Print ``prog: message`` on stderr; return ``code``."""
    sys.stderr.write(f"{prog}: {message}\n")
    sys.stderr.flush()
    return code


def exit_code(exc: SystemExit) -> int:
    """The exit code argparse (--help, --version, a usage error) asked for."""
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


def classify(exc: BaseException) -> tuple[str, int]:
    """An unexpected exception as (one-line message, exit code)."""
    from ..config import ConfigError
    from ..errors import NetcollError
    from ..service.serve import StartupError

    if isinstance(exc, ConfigError):
        return str(exc), 2
    if isinstance(exc, StartupError):
        return str(exc), 1
    if isinstance(exc, (NetcollError, OSError, ValueError, TypeError, KeyError, TimeoutError)):
        return one_line(exc), 1
    if settings.debug():
        import traceback

        traceback.print_exception(exc)
    return f"internal error: {type(exc).__name__}: {one_line(exc)} (NETCOLL_DEBUG=1 for a traceback)", 1


def json_failure(exc: BaseException) -> tuple[str, int] | None:
    """How a ``--json`` command's failure reads in its JSON object: (message, exit code);
    None for what is not a failure (``--help``, a clean exit)."""
    if isinstance(exc, SystemExit):
        code = exit_code(exc)
        return None if code == 0 else (f"exit status {code}", code)
    if isinstance(exc, CliError):
        return str(exc), exc.code
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", 130
    if isinstance(exc, Exception):
        return classify(exc)
    return None


def _quiet_stdout() -> None:
    """stdout was closed by the reader: point it at /dev/null so the exit is quiet."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass


def guarded(prog: Callable[[], str], body: Callable[[], int]) -> int:
    """Run ``body``; turn every way it can fail into one line and an exit code.
    ``prog()`` names the command for the message (it is known only once parsed)."""
    try:
        return body()
    except SystemExit as exc:
        return exit_code(exc)
    except CliError as exc:
        return fail(prog(), str(exc), exc.code)
    except KeyboardInterrupt:
        return fail(prog(), "interrupted", 130)
    except BrokenPipeError:  # stdout closed early (`netcoll status | head`): stop quietly
        _quiet_stdout()
        return 141
    except Exception as exc:  # noqa: BLE001 - sorted by classify(); never a traceback
        return fail(prog(), *classify(exc))
