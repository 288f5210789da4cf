"""``netcoll run``: start N copies of a training script as the ranks of a group
(what ``torchrun`` does for torch.distributed). Usage: :data:`DESCRIPTION`;
semantics (coordinator, several nodes, output, failures, signals): docs/training.md.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import secrets
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .common import FORMATTER, CliError, run_client
from .ports import free_port
from .runcheck import check_module, check_script
from .supervisor import Supervisor, announce

if TYPE_CHECKING:
    from .common import Subparsers
    from .runnodes import Lobby

LAST_CALL = 5.0  # --nnodes MIN:MAX: how long the group waits for more nodes once MIN have arrived

HELP = "start N copies of a training script as the ranks of a group (like torchrun)"
DESCRIPTION = """\
Start N copies of a script as ranks 0..N-1 of one group, with NETCOLL_COORDINATOR,
NETCOLL_WORLD_SIZE, NETCOLL_RANK, NETCOLL_TOKEN, NETCOLL_RESTART_COUNT and torchrun's RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RESTART_COUNT set (so netcoll.sync.connect() and init_process_group(init_method=
"env://") need no arguments). A coordinator runs inside the launcher (loopback, fresh token)
unless --coordinator is given. Output lines are prefixed "[rank R] ". The first line says where
the coordinator is and the `netcoll status` command that shows the ranks and what each waits
for. When a rank fails the launcher names the rank that failed first and its error (a rank that
raised, died, or never arrived), gives each other failed rank one line, stops the others
(SIGTERM, SIGKILL after --grace), and exits with the first failure's status (128+N for a death
by signal N) -- or, with --max-restarts K, starts all the ranks again (up to K times; each
attempt meets at a coordinator of its own) and exits 0 once an attempt succeeds.
A signal to the launcher never restarts.
Several nodes: run on each with the same --nnodes and --coordinator and set the same
NETCOLL_TOKEN on every node; node 0 starts the coordinator there. With --node-rank each node
has its rank; without (or with --nnodes MIN:MAX) the node that can start the coordinator is
node 0 and the others are ranked as they arrive; the group forms with every node that arrived
once MIN have and --last-call seconds passed. The nodes restart together.

examples:
  netcoll run -n 4 train.py --lr 0.1
  netcoll run -n 2 -m mypkg.train
  netcoll run -n 4 --max-restarts 3 train.py
  netcoll run -n 4 --nnodes 2 --node-rank 1 --coordinator 10.0.0.1:29400 train.py
  netcoll run -n 4 --nnodes 1:4 --coordinator 10.0.0.1:29400 train.py   (the same on every node)"""


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "run",
        formatter_class=FORMATTER,
        help=HELP,
        description=DESCRIPTION,
        usage="netcoll run -n N [options] (script.py | -m module | --no-python prog) [args ...]",
    )
    sp.add_argument("-n", "--nproc-per-node", dest="nprocs", type=int, required=True, metavar="N", help="ranks here")
    sp.add_argument("--nnodes", default="1", metavar="M|MIN:MAX", help="nodes (default 1)")
    sp.add_argument(
        "--node-rank", type=int, metavar="K", help="this node, 0..M-1 (default: 0 on one node; else by arrival)"
    )
    sp.add_argument(
        "--max-restarts", type=int, default=0, metavar="K", help="start all ranks again after a failure, K times"
    )
    sp.add_argument(
        "--last-call",
        type=float,
        default=LAST_CALL,
        metavar="S",
        help=f"MIN:MAX nodes: wait after MIN (default {LAST_CALL:g})",
    )
    sp.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="one node: use this running coordinator instead of starting one; several nodes: "
        "node 0 starts the coordinator here and the others join it",
    )
    sp.add_argument(
        "--local-addr", metavar="ADDR", help="this node's address for rank traffic (sets NETCOLL_LOCAL_HOST)"
    )
    sp.add_argument("--master-port", type=int, metavar="PORT", help="MASTER_PORT (default: a free port on node 0)")
    sp.add_argument("--grace", type=float, default=5.0, metavar="S", help="SIGTERM to SIGKILL (default 5)")
    sp.add_argument("--join-timeout", type=float, default=300.0, metavar="S", help="nodes meeting (default 300)")
    sp.add_argument("-m", "--module", action="store_true", help="run the target as a module (python -m)")
    sp.add_argument("--no-python", action="store_true", help="run the target as a program, not with python")
    sp.add_argument("target", metavar="script.py", help="the script (module with -m, program with --no-python)")
    sp.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    sp.set_defaults(handler=run)
    return sp


@dataclass(frozen=True)
class Plan:
    """What to start: the validated flags. ``nnodes`` and ``node_rank`` are known once the
    nodes met when given by arrival (``node_rank`` None until then)."""

    nprocs: int
    nnodes: int
    node_rank: int | None
    command: list[str]
    coordinator: str | None
    local_addr: str | None
    master_port: int | None
    grace: float
    join_timeout: float
    min_nodes: int = 1
    max_nodes: int = 1
    max_restarts: int = 0
    last_call: float = LAST_CALL
    hosting: bool = True  # this launcher runs the coordinator (one node without --coordinator; node 0)

    @property
    def world_size(self) -> int:
        return self.nprocs * self.nnodes

    @property
    def node(self) -> int:
        """This node's rank (once known)."""
        if self.node_rank is None:
            raise RuntimeError("the node rank is given when the nodes meet")
        return self.node_rank

    @property
    def nnodes_flag(self) -> str:
        return str(self.min_nodes) if self.min_nodes == self.max_nodes else f"{self.min_nodes}:{self.max_nodes}"


def nodes_of(text: str) -> tuple[int, int]:
    """``--nnodes M`` or ``MIN:MAX`` -> (MIN, MAX) (CliError, exit 2)."""
    low, _, high = str(text).partition(":")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise CliError(f"--nnodes must be M or MIN:MAX, got {text!r:.40}", 2) from None
    if not 1 <= lo <= hi:
        raise CliError(f"--nnodes must be at least 1 (and MIN <= MAX), got {text!r:.40}", 2)
    return lo, hi


def plan_of(ns: argparse.Namespace) -> Plan:
    """Check the flags (CliError, exit 2) and build the command."""
    from ..config import check_address
    from ..mesh.auth import MEMBER_TOKEN_ENV, token_from_env

    low, high = nodes_of(ns.nnodes)
    if ns.nprocs < 1:
        raise CliError("-n and --nnodes must be at least 1", 2)
    if ns.node_rank is not None and low != high:
        raise CliError("--node-rank goes with --nnodes M; with MIN:MAX the nodes are ranked as they arrive", 2)
    if ns.node_rank is not None and not 0 <= ns.node_rank < high:
        raise CliError(f"--node-rank must be in 0..{high - 1}, got {ns.node_rank}", 2)
    if ns.max_restarts < 0 or ns.last_call < 0:
        raise CliError("--max-restarts and --last-call must be >= 0", 2)
    if high > 1 and not ns.coordinator:
        raise CliError("several nodes need --coordinator HOST:PORT (node 0 starts the coordinator there)", 2)
    if ns.module and ns.no_python:
        raise CliError("choose one of -m and --no-python", 2)
    if ns.grace < 0 or ns.join_timeout <= 0:
        raise CliError("--grace must be >= 0 and --join-timeout > 0", 2)
    if ns.master_port is not None and not 0 < ns.master_port < 65536:
        raise CliError(f"--master-port must be in 1..65535, got {ns.master_port}", 2)
    if high > 1 and token_from_env(MEMBER_TOKEN_ENV) is None:
        raise CliError(f"several nodes need a shared member token: set {MEMBER_TOKEN_ENV} on every node", 2)
    try:
        coordinator = check_address(ns.coordinator) if ns.coordinator else None
    except ValueError as exc:
        raise CliError(f"--coordinator: {exc}", 2) from None
    if ns.no_python:
        command = [ns.target, *ns.args]
    else:
        check_module(ns.target) if ns.module else check_script(ns.target)  # once, not once per rank
        command = [sys.executable, *(["-m"] if ns.module else []), ns.target, *ns.args]
    node_rank = 0 if high == 1 else ns.node_rank
    fields = (ns.nprocs, low, node_rank, command, coordinator, ns.local_addr, ns.master_port)
    hosting = coordinator is None or (high > 1 and node_rank in (0, None))
    return Plan(*fields, ns.grace, ns.join_timeout, low, high, ns.max_restarts, ns.last_call, hosting)


def run(ns: argparse.Namespace) -> int:
    return run_client(launch(plan_of(ns)))


async def launch(plan: Plan) -> int:
    """Run the whole launch: coordinator (if ours), node meeting, attempts; the exit status."""
    from ..mesh.auth import MEMBER_TOKEN_ENV, token_from_env
    from .attempts import Attempts
    from .runnodes import meet

    token = token_from_env(MEMBER_TOKEN_ENV)
    attempts = Attempts(plan)
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(_log_to_stderr(attempts.news))
        stack.enter_context(attempts.signals())
        address, watcher, lobby = plan.coordinator, None, None
        if plan.hosting:
            plan, address, token, watcher, lobby = await _host(plan, token, stack)
            attempts.plan = plan
        assert address is not None
        announce(address, watcher, attempts.files)
        nodes = None
        if plan.max_nodes > 1:
            plan, nodes = await attempts.interruptible(meet(plan, address, token, lobby))
            stack.push_async_callback(nodes.rdv.close)
            attempts.plan = plan
        return await attempts.run(address, token, watcher, nodes)


async def _host(
    plan: Plan, token: str | None, stack: contextlib.AsyncExitStack
) -> tuple[Plan, str | None, str | None, str | None, Lobby | None]:
    """Start the coordinator (at --coordinator on node 0): (plan, address, member token,
    client token, lobby). Nodes ranked by arrival: when --coordinator is another's (taken, or
    not an address of this host), this node joins it instead (``plan.hosting`` False)."""
    from ..rendezvous import Coordinator
    from .runnodes import ARRIVE, Lobby

    member, watcher = token or secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    host, _, port = (plan.coordinator or "127.0.0.1:0").rpartition(":")
    coord = Coordinator(host.strip("[]"), int(port), token=member, client_token=watcher)
    try:
        await coord.start()
    except OSError as exc:
        if plan.node_rank is not None or exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            raise
        return replace(plan, hosting=False), plan.coordinator, token, None, None
    stack.push_async_callback(coord.close)
    lobby = None
    if plan.node_rank is None:
        lobby = Lobby(plan)
        stack.callback(lobby.close)
        coord.register(ARRIVE, lobby.arrive)
    return plan, coord.address, member, watcher, lobby


@contextlib.contextmanager
def _log_to_stderr(news: Callable[[], bool]) -> Iterator[None]:
    """The coordinator's warnings (a rank lost...) on stderr, until the launcher
    itself stops the ranks (their losses are then expected). The logger is as it
    was afterwards (``run`` also runs inside other programs and tests)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("netcoll run: %(message)s"))
    handler.addFilter(lambda _: news())
    logger = logging.getLogger("netcoll")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


__all__ = ["HELP", "Plan", "Supervisor", "add_parser", "free_port", "launch", "plan_of", "run"]
