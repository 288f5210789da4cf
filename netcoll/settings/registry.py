"""The registry: every ``NETCOLL_*`` environment variable netcoll reads, declared once.

A :class:`Variable` says what a variable is (its name, the kind of value, the
default, the choices when there is a fixed set), who reads it and what it means;
:data:`VARIABLES` lists them all. The readers (:mod:`.readers`) take values
through this registry only, the README's table of settings is generated from it
(``python3 -m netcoll.settings --markdown``), and a test fails on any module that
reads a ``NETCOLL_*`` variable without it. A secret (a token) is never logged or
printed: only whether it is set.

Standard library only: this sits below every other netcoll module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Kind = Literal["text", "int", "float", "bool", "size", "choice", "path", "address", "host", "port", "secret", "list"]

#: the readers, by entry point or layer (the table's "read by" column)
COORD: Final = "coordinator"  # netcoll coordinator (netcoll.config.CoordinatorConfig)
DAEMON: Final = "rank"  # netcoll rank, the rank daemon (RankConfig)
UP: Final = "up"  # netcoll up (UpConfig)
CLIENTS: Final = "clients"  # submit, status, watch, get, cancel, bench --coordinator (ClientConfig)
CLI: Final = "cli"  # every netcoll command
EMBEDDED: Final = "connect()"  # netcoll.connect, netcoll.sync.connect, the torch backend
LINKS: Final = "links"  # where links are made: rank daemons and embedded ranks alike
RANKS: Final = "ranks"  # every rank process (daemon or embedded)


@dataclass(frozen=True, slots=True)
class Variable:
    """One environment variable.

    ``default`` is the value in effect when it is unset or empty, as shown to people;
    ``readers`` the entry points or layers that read it; ``choices`` the accepted
    values when they are a fixed set; ``secret``: never shown (a token); ``prefix``:
    a family of variables (``NETCOLL_LIMIT_<NAME>``), matched by the start of a name."""

    name: str
    kind: Kind
    default: str
    readers: tuple[str, ...]
    doc: str
    choices: tuple[str, ...] = ()
    secret: bool = False
    prefix: bool = False

    def shown(self, value: str | None) -> str:
        """``value`` as it may be printed: a secret only as set / unset."""
        if self.secret:
            return "(set)" if value else "(unset)"
        return repr(value)


def _v(
    name: str,
    kind: Kind,
    default: str,
    readers: tuple[str, ...],
    doc: str,
    *,
    choices: tuple[str, ...] = (),
    secret: bool = False,
    prefix: bool = False,
) -> Variable:
    return Variable(f"NETCOLL_{name}", kind, default, readers, doc, choices, secret, prefix)


# -- where to meet, and who may ---------------------------------------------------------
COORDINATOR = _v(
    "COORDINATOR", "address", "127.0.0.1:29400", (DAEMON, CLIENTS, EMBEDDED), "HOST:PORT of the coordinator"
)
TOKEN = _v(
    "TOKEN",
    "secret",
    "",
    (COORD, DAEMON, UP, CLIENTS, EMBEDDED),
    "the member token: rank daemons and embedded ranks prove it",
    secret=True,
)
CLIENT_TOKEN = _v(
    "CLIENT_TOKEN",
    "secret",
    "",
    (COORD, CLIENTS),
    "the client token: job submitters prove it (submit, status ...)",
    secret=True,
)
TOKEN_FILE = _v(
    "TOKEN_FILE",
    "path",
    "",
    (COORD, DAEMON, UP, CLIENTS, EMBEDDED),
    "read the member token from this file (NETCOLL_TOKEN wins)",
)
CLIENT_TOKEN_FILE = _v(
    "CLIENT_TOKEN_FILE",
    "path",
    "",
    (COORD, CLIENTS),
    "read the client token from this file (NETCOLL_CLIENT_TOKEN wins)",
)
INSECURE = _v(
    "INSECURE", "bool", "0", (COORD, DAEMON), "1: listen off loopback with neither token nor TLS (anyone is trusted)"
)
TLS_CERT = _v(
    "TLS_CERT", "path", "", (CLI, EMBEDDED), "mutual TLS: this process's certificate (PEM; with _KEY and _CA)"
)
TLS_KEY = _v("TLS_KEY", "path", "", (CLI, EMBEDDED), "mutual TLS: its private key, unencrypted (PEM)")
TLS_CA = _v("TLS_CA", "path", "", (CLI, EMBEDDED), "mutual TLS: the CA every peer's certificate must chain to (PEM)")
TLS_CHECK_HOSTNAME = _v(
    "TLS_CHECK_HOSTNAME",
    "bool",
    "0",
    (CLI, EMBEDDED),
    "1: clients also check the server's name/IP against its certificate",
)
# -- the commands' listeners (netcoll.config) -------------------------------------------
HOST = _v("HOST", "host", "127.0.0.1 (rank: 0.0.0.0)", (COORD, DAEMON, UP), "address to listen on")
PORT = _v("PORT", "port", "29400 (rank: 0, any free)", (COORD, DAEMON, UP), "port to listen on: RPC or peer traffic")
HTTP_PORT = _v(
    "HTTP_PORT", "port", "the port + 1 (rank: 0)", (COORD, DAEMON), "HTTP /livez /readyz /metrics port; off disables it"
)
HTTP_HOST = _v("HTTP_HOST", "host", "the listener's host", (COORD, DAEMON), "address of the HTTP port")
RANK_HINT = _v("RANK_HINT", "int", "", (DAEMON,), "a rank daemon's preferred rank (a pod index), honoured when free")
ADVERTISE_HOST = _v("ADVERTISE_HOST", "host", "as the coordinator sees it", (DAEMON,), "the address peers dial")
LOG_LEVEL = _v(
    "LOG_LEVEL",
    "choice",
    "info (clients: warning)",
    (CLI,),
    "log level",
    choices=("debug", "info", "warning", "error", "critical"),
)
STATE_DIR = _v("STATE_DIR", "path", "", (COORD,), "the job journal's directory (unset: jobs in memory only)")
KEEP_JOBS = _v("KEEP_JOBS", "int", "1000", (COORD,), "finished jobs kept queryable")
# -- an embedded rank (netcoll.connect, netcoll.sync, torch; netcoll run sets them) ------
WORLD_SIZE = _v("WORLD_SIZE", "int", "", (EMBEDDED,), "ranks in the group, when world_size is not passed")
RANK = _v("RANK", "int", "", (EMBEDDED,), "this rank when no address is passed (unset: the coordinator assigns one)")
LOCAL_HOST = _v(
    "LOCAL_HOST", "host", "", (EMBEDDED,), "an embedded rank's source and listen address (run --local-addr)"
)
LOOP = _v(
    "LOOP",
    "choice",
    "spin (netcoll.sync: asyncio)",
    (EMBEDDED, CLI),
    "the event loop",
    choices=("spin", "asyncio", "uvloop", "auto"),
)
SPIN_US = _v("SPIN_US", "int", "300", (RANKS,), "microseconds the spin loop polls before it sleeps (0-100000)")
# -- links ---------------------------------------------------------------------------------
TRANSPORT = _v(
    "TRANSPORT",
    "choice",
    "auto",
    (LINKS,),
    "the link kind to force (auto: by what both ends can do)",
    choices=("auto", "tcp", "tls", "shm", "memory"),
)
RECV_WINDOW = _v("RECV_WINDOW", "size", "64MiB", (LINKS,), "bytes a peer may send ahead of posted receives")
SHM_BYTES = _v("SHM_BYTES", "size", "by the number of peers", (LINKS,), "each direction's ring of a shared-memory link")
SHM_LANE = _v(
    "SHM_LANE", "choice", "1", (LINKS,), "0: shared-memory links send no frames through lanes", choices=("0", "1")
)
SHM_CMA = _v(
    "SHM_CMA",
    "choice",
    "auto",
    (LINKS,),
    "direct DATA between ranks of a host: never, always, or while they outnumber the cores",
    choices=("0", "1", "auto"),
)
EMULATE_DELAY_US = _v(
    "EMULATE_DELAY_US", "int", "0", (LINKS,), "delay every socket read by this many microseconds (benchmarks)"
)
# -- what ranks choose --------------------------------------------------------------------
COST_MODEL = _v(
    "COST_MODEL", "bool", "on across hosts", (RANKS,), "1: calibrate and choose by the cost model; 0: the fixed table"
)
ALGO = _v("ALGO", "list", "", (RANKS,), "algorithm overrides: ring, or all_reduce=ring,broadcast=tree")
COMPRESSION = _v(
    "COMPRESSION",
    "choice",
    "none",
    (RANKS,),
    "the default wire compression of the float collectives",
    choices=("none", "fp16", "bf16", "int8"),
)
TORCH_CASTS = _v(
    "TORCH_CASTS",
    "choice",
    "1",
    (RANKS,),
    "0: the codecs cast with numpy only (1: through torch's kernels when torch is loaded)",
    choices=("0", "1"),
)
NUMBA_KERNELS = _v(
    "NUMBA_KERNELS",
    "choice",
    "1",
    (RANKS,),
    "0: the int8 codec runs numpy's or torch's kernels (1: numba's fused ones when numba is installed)",
    choices=("0", "1"),
)
RESULT_POOL = _v("RESULT_POOL", "size", "256MiB", (RANKS,), "free memory kept for large results (0: none)")
SLOW_OP_S = _v("SLOW_OP_S", "float", "5", (RANKS,), "an operation running longer is logged at WARNING (0: never)")
LIMIT = _v(
    "LIMIT_<NAME>",
    "text",
    "see docs/reliability.md",
    (COORD, RANKS),
    "a limit of netcoll.limits (sizes in units)",
    prefix=True,
)
# -- netcoll run, logs, failures ----------------------------------------------------------
RESTART_COUNT = _v(
    "RESTART_COUNT",
    "int",
    "0",
    (EMBEDDED,),
    "times `netcoll run --max-restarts` has restarted the ranks it started (it sets it; 0: the first start)",
)
ERROR_FILE = _v(
    "ERROR_FILE", "path", "", (EMBEDDED,), "where a rank notes the error that ended it (netcoll run sets it)"
)
TRACEBACK = _v(
    "TRACEBACK", "choice", "", (EMBEDDED,), "full: a rank under netcoll run prints whole tracebacks", choices=("full",)
)
LOG_FORMAT = _v(
    "LOG_FORMAT",
    "choice",
    "text",
    (CLI, RANKS),
    "log lines as text or one JSON object a line",
    choices=("text", "json"),
)
DEBUG = _v("DEBUG", "bool", "", (CLI,), "set: an internal error of a command prints its traceback")

VARIABLES: Final[tuple[Variable, ...]] = (
    COORDINATOR, TOKEN, CLIENT_TOKEN, TOKEN_FILE, CLIENT_TOKEN_FILE, INSECURE,
    TLS_CERT, TLS_KEY, TLS_CA, TLS_CHECK_HOSTNAME,
    HOST, PORT, HTTP_PORT, HTTP_HOST, RANK_HINT, ADVERTISE_HOST, LOG_LEVEL, STATE_DIR, KEEP_JOBS,
    WORLD_SIZE, RANK, LOCAL_HOST, LOOP, SPIN_US,
    TRANSPORT, RECV_WINDOW, SHM_BYTES, SHM_LANE, SHM_CMA, EMULATE_DELAY_US,
    COST_MODEL, ALGO, COMPRESSION, TORCH_CASTS, NUMBA_KERNELS, RESULT_POOL, SLOW_OP_S, LIMIT,
    RESTART_COUNT, ERROR_FILE, TRACEBACK, LOG_FORMAT, DEBUG,
)  # fmt: skip

_BY_NAME: Final = {v.name: v for v in VARIABLES if not v.prefix}
_FAMILIES: Final = tuple((v.name.split("<", 1)[0], v) for v in VARIABLES if v.prefix)


def lookup(name: str) -> Variable:
    """The registered variable ``name`` (or the family it belongs to); KeyError for a
    name not in the registry (a reader must declare what it reads)."""
    found = _BY_NAME.get(name)
    if found is not None:
        return found
    for start, family in _FAMILIES:
        if name.startswith(start) and len(name) > len(start):
            return family
    raise KeyError(f"{name} is not a registered netcoll setting (declare it in netcoll/settings/registry.py)")


__all__ = ["VARIABLES", "Kind", "Variable", "lookup"]
