"""The readers: every ``NETCOLL_*`` value netcoll takes from the environment, typed.

Each function reads at call time (tests and ``netcoll run`` set variables after
import), from ``environ`` when given, else ``os.environ``, and only variables of
the registry (:func:`raw` refuses any other name). A bad value is an error that
names the variable, the value and what is expected: a :class:`~netcoll.errors.ConfigError`
(exit 2 on the command line) or, for the variables read where links and loops are
made, the ``ValueError`` those layers have always raised. An empty variable counts
as unset.

Where the accepted values belong to a higher layer (the link kinds, the event
loops, the algorithms, the log formats), the reader returns the text and that
layer checks it, with the same words for a flag, an argument or the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final, NamedTuple

from ..errors import ConfigError
from ..sizes import parse_size
from . import registry as r

Environ = Mapping[str, str] | None

#: NETCOLL_SPIN_US above this is refused (a typo, not a setting: 0.1 s per wake-up)
MAX_SPIN_US: Final = 100_000
#: NETCOLL_EMULATE_DELAY_US above this is refused (one second per read)
MAX_DELAY_US: Final = 1_000_000
_TRUE: Final = ("1", "true", "yes", "on")


def raw(name: str, environ: Environ = None) -> str | None:
    """The text of the registered variable ``name`` as set (None: unset); KeyError for
    a name the registry does not declare."""
    r.lookup(name)
    return (os.environ if environ is None else environ).get(name)


def text(name: str, environ: Environ = None) -> str:
    """``name``'s text without surrounding spaces ("" when unset)."""
    return (raw(name, environ) or "").strip()


def given(name: str, environ: Environ = None) -> str | None:
    """``name``'s text without surrounding spaces, None when unset or blank."""
    return text(name, environ) or None


def _at_least(var: r.Variable, low: int, environ: Environ) -> int | None:
    value_text = text(var.name, environ)
    if not value_text:
        return None
    try:
        value = int(value_text, 10)
    except ValueError:
        value = low - 1
    if value < low:
        raise ConfigError(f"{var.name} must be an integer >= {low}, got {value_text!r}")
    return value


def _size(var: r.Variable, environ: Environ, *, blank_is_unset: bool = False) -> int | None:
    """``var`` parsed as a size; None when unset or empty (or only spaces, with ``blank_is_unset``)."""
    value_text = raw(var.name, environ) or ""
    if not (value_text.strip() if blank_is_unset else value_text):
        return None
    try:
        return parse_size(value_text)
    except ValueError as exc:
        raise ValueError(f"{var.name}: {exc}") from None


# -- where to meet, and who may ---------------------------------------------------------
def coordinator(environ: Environ = None) -> str | None:
    """``NETCOLL_COORDINATOR`` (``HOST:PORT``, checked by its users), None when unset."""
    return given(r.COORDINATOR.name, environ)


def token_texts(name: str, environ: Environ = None) -> tuple[str | None, str | None]:
    """A token variable (``NETCOLL_TOKEN`` or ``NETCOLL_CLIENT_TOKEN``) and its ``_FILE``
    variant, as set (:func:`netcoll.mesh.auth.read_token` decides between them)."""
    if name not in (r.TOKEN.name, r.CLIENT_TOKEN.name):
        raise KeyError(f"{name} is not a token variable")
    return raw(name, environ), raw(name + "_FILE", environ)


class TlsFiles(NamedTuple):
    """``NETCOLL_TLS_CERT`` / ``_KEY`` / ``_CA`` as set, and ``NETCOLL_TLS_CHECK_HOSTNAME``."""

    cert: str | None
    key: str | None
    ca: str | None
    check_hostname: bool


def tls_files(environ: Environ = None) -> TlsFiles:
    """The TLS variables (:meth:`netcoll.TlsConfig.from_paths` checks the files)."""
    check = text(r.TLS_CHECK_HOSTNAME.name, environ).lower() in _TRUE
    cert, key, ca = (raw(v.name, environ) for v in (r.TLS_CERT, r.TLS_KEY, r.TLS_CA))
    return TlsFiles(cert, key, ca, check)


# -- an embedded rank ---------------------------------------------------------------------
def world_size(environ: Environ = None) -> int | None:
    """``NETCOLL_WORLD_SIZE`` (an integer >= 1), None when unset; ConfigError otherwise."""
    return _at_least(r.WORLD_SIZE, 1, environ)


def rank(environ: Environ = None) -> int | None:
    """``NETCOLL_RANK`` (an integer >= 0), None when unset; ConfigError otherwise."""
    return _at_least(r.RANK, 0, environ)


def local_host(environ: Environ = None) -> str | None:
    """``NETCOLL_LOCAL_HOST``, None when unset."""
    return given(r.LOCAL_HOST.name, environ)


def restart_count(environ: Environ = None) -> int:
    """``NETCOLL_RESTART_COUNT`` (an integer >= 0; 0 when unset); ConfigError otherwise."""
    return _at_least(r.RESTART_COUNT, 0, environ) or 0


def loop(environ: Environ = None) -> str | None:
    """``NETCOLL_LOOP`` as set, None when unset or empty (:func:`netcoll.loop.loop_kind` checks it)."""
    return raw(r.LOOP.name, environ) or None


def spin_us(environ: Environ = None) -> int | None:
    """``NETCOLL_SPIN_US`` (whole microseconds, 0 to :data:`MAX_SPIN_US`), None when unset;
    ValueError otherwise."""
    value_text = text(r.SPIN_US.name, environ)
    if not value_text:
        return None
    if not (value_text.isascii() and value_text.isdigit()) or int(value_text) > MAX_SPIN_US:
        raise ValueError(
            f"NETCOLL_SPIN_US must be a whole number of microseconds from 0 to {MAX_SPIN_US}, got {value_text!r}"
        )
    return int(value_text)


# -- links --------------------------------------------------------------------------------
def transport(environ: Environ = None) -> str:
    """``NETCOLL_TRANSPORT`` lower-cased, ``"auto"`` when unset (the links check the kind)."""
    return (raw(r.TRANSPORT.name, environ) or "auto").strip().lower()


def recv_window(environ: Environ = None) -> int | None:
    """``NETCOLL_RECV_WINDOW`` in bytes (a size: ``64MiB``), None when unset or empty; ValueError
    otherwise (only spaces too: not a size)."""
    return _size(r.RECV_WINDOW, environ)


def shm_bytes(environ: Environ = None) -> int | None:
    """``NETCOLL_SHM_BYTES`` in bytes, None when unset (the links check the ring's bounds)."""
    return _size(r.SHM_BYTES, environ)


def shm_lane(environ: Environ = None) -> bool:
    """``NETCOLL_SHM_LANE``: False for ``0``, True for ``1`` or unset; ValueError otherwise."""
    value = text(r.SHM_LANE.name, environ)
    if value not in ("", "0", "1"):
        raise ValueError(f"NETCOLL_SHM_LANE must be 0 or 1, got {value!r}")
    return value != "0"


def shm_cma(environ: Environ = None) -> str:
    """``NETCOLL_SHM_CMA``: ``"0"``, ``"1"`` or ``"auto"`` (unset); ValueError otherwise."""
    value = text(r.SHM_CMA.name, environ).lower() or "auto"
    if value not in r.SHM_CMA.choices:
        raise ValueError(f"NETCOLL_SHM_CMA must be 0, 1 or auto, got {value!r}")
    return value


def emulate_delay_us(environ: Environ = None) -> int:
    """``NETCOLL_EMULATE_DELAY_US`` (0 to :data:`MAX_DELAY_US`; 0 when unset); ConfigError otherwise."""
    value_text = text(r.EMULATE_DELAY_US.name, environ)
    if not value_text:
        return 0
    try:
        us = int(value_text, 10)
    except ValueError:
        us = -1
    if not 0 <= us <= MAX_DELAY_US:
        raise ConfigError(
            f"{r.EMULATE_DELAY_US.name} must be an integer number of microseconds, 0 to {MAX_DELAY_US}; "
            f"got {value_text!r}"
        )
    return us


# -- what ranks choose ----------------------------------------------------------------------
def cost_model(environ: Environ = None) -> bool | None:
    """``NETCOLL_COST_MODEL``: True for 1/on/true/yes, False for anything else set, None unset."""
    value = text(r.COST_MODEL.name, environ).lower()
    return None if not value else value in _TRUE


def algo(environ: Environ = None) -> str:
    """``NETCOLL_ALGO`` as set ("" when unset; :func:`netcoll.selection.parse_overrides` checks it)."""
    return raw(r.ALGO.name, environ) or ""


def compression(environ: Environ = None) -> str:
    """``NETCOLL_COMPRESSION``: one of none, fp16, bf16, int8 (``none`` when unset); ConfigError otherwise."""
    value = text(r.COMPRESSION.name, environ).lower() or r.COMPRESSION.default
    if value not in r.COMPRESSION.choices:
        raise ConfigError(f"NETCOLL_COMPRESSION must be one of {', '.join(r.COMPRESSION.choices)}, got {value!r}")
    return value


def torch_casts(environ: Environ = None) -> bool:
    """``NETCOLL_TORCH_CASTS``: False for ``0``, True for ``1`` or unset; ConfigError otherwise."""
    value = text(r.TORCH_CASTS.name, environ)
    if value not in ("", "0", "1"):
        raise ConfigError(f"NETCOLL_TORCH_CASTS must be 0 or 1, got {value!r}")
    return value != "0"


def numba_kernels(environ: Environ = None) -> bool:
    """``NETCOLL_NUMBA_KERNELS``: False for ``0``, True for ``1`` or unset; ConfigError otherwise."""
    value = text(r.NUMBA_KERNELS.name, environ)
    if value not in ("", "0", "1"):
        raise ConfigError(f"NETCOLL_NUMBA_KERNELS must be 0 or 1, got {value!r}")
    return value != "0"


def result_pool(environ: Environ = None) -> int | None:
    """``NETCOLL_RESULT_POOL`` in bytes, None when unset or blank; ValueError otherwise."""
    return _size(r.RESULT_POOL, environ, blank_is_unset=True)


def slow_op_s(environ: Environ = None) -> float | None:
    """``NETCOLL_SLOW_OP_S`` in seconds; None when unset or not a number (the default applies)."""
    try:
        return float(raw(r.SLOW_OP_S.name, environ) or "")
    except ValueError:
        return None


def limit(name: str, environ: Environ = None) -> str | None:
    """``NETCOLL_LIMIT_<NAME>`` of limit ``name`` as set, None when unset or empty
    (:meth:`netcoll.limits.Limits.load` parses it)."""
    return raw(limit_variable(name), environ) or None


def limit_variable(name: str) -> str:
    """The variable of limit ``name``: ``max_job_bytes`` -> ``NETCOLL_LIMIT_MAX_JOB_BYTES``."""
    return r.LIMIT.name.split("<", 1)[0] + name.upper()


# -- netcoll run, logs, failures ----------------------------------------------------------
def error_file(environ: Environ = None) -> str | None:
    """``NETCOLL_ERROR_FILE`` (set by ``netcoll run`` for each rank), None when unset."""
    return raw(r.ERROR_FILE.name, environ) or None


def traceback_full(environ: Environ = None) -> bool:
    """``NETCOLL_TRACEBACK=full``: whole tracebacks under ``netcoll run``."""
    return text(r.TRACEBACK.name, environ).lower() == "full"


def log_format(environ: Environ = None) -> str:
    """``NETCOLL_LOG_FORMAT`` as set ("" when unset; :func:`netcoll.logs.log_format` checks it)."""
    return raw(r.LOG_FORMAT.name, environ) or ""


def log_level(environ: Environ = None) -> str:
    """``NETCOLL_LOG_LEVEL`` stripped ("" when unset; its readers check it)."""
    return text(r.LOG_LEVEL.name, environ)


def debug(environ: Environ = None) -> bool:
    """``NETCOLL_DEBUG`` set (to anything but empty): tracebacks of internal errors."""
    return bool(raw(r.DEBUG.name, environ))
