"""Settings in one place: every ``NETCOLL_*`` environment variable netcoll reads.

:mod:`.registry` declares each variable once (name, kind, default, who reads it,
what it means, whether it is a secret); :mod:`.readers` reads them, typed, at call
time; :mod:`.table` makes the README's table (``python3 -m netcoll.settings
--markdown``). No other netcoll module reads a ``NETCOLL_*`` variable from the
environment (``tests/util/test_settings.py`` walks them all); the commands'
configuration (:mod:`netcoll.config`) reads its variables through :func:`raw`.
Writing variables for child processes (``netcoll run``, test harnesses) is not
reading: those name them through the registry's :class:`Variable` constants or
literally.

Standard library, :mod:`netcoll.errors` and :mod:`netcoll.sizes` only: every
layer may read settings.
"""

from __future__ import annotations

from . import registry
from .readers import (
    MAX_DELAY_US,
    MAX_SPIN_US,
    TlsFiles,
    algo,
    compression,
    coordinator,
    cost_model,
    debug,
    emulate_delay_us,
    error_file,
    given,
    limit,
    limit_variable,
    local_host,
    log_format,
    log_level,
    loop,
    numba_kernels,
    rank,
    raw,
    recv_window,
    restart_count,
    result_pool,
    shm_bytes,
    shm_cma,
    shm_lane,
    slow_op_s,
    spin_us,
    text,
    tls_files,
    token_texts,
    torch_casts,
    traceback_full,
    transport,
    world_size,
)
from .registry import VARIABLES, Variable, lookup

__all__ = [
    "MAX_DELAY_US",
    "MAX_SPIN_US",
    "VARIABLES",
    "TlsFiles",
    "Variable",
    "algo",
    "compression",
    "coordinator",
    "cost_model",
    "debug",
    "emulate_delay_us",
    "error_file",
    "given",
    "limit",
    "limit_variable",
    "local_host",
    "log_format",
    "log_level",
    "lookup",
    "loop",
    "numba_kernels",
    "rank",
    "raw",
    "recv_window",
    "registry",
    "restart_count",
    "result_pool",
    "shm_bytes",
    "shm_cma",
    "shm_lane",
    "slow_op_s",
    "spin_us",
    "text",
    "tls_files",
    "token_texts",
    "torch_casts",
    "traceback_full",
    "transport",
    "world_size",
]
