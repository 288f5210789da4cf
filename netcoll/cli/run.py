"""``netcoll run``: start N copies of a training script as the ranks of a group
(what ``torchrun`` does for torch.distributed). Usage: :data:`DESCRIPTION`;
semantics (coordinator, several nodes, output, failures, signals): docs/training.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .common import FORMATTER, CliError, run_client
from .ports import free_port
from .runcheck import check_module, check_script
from .supervisor import Supervisor, say

if TYPE_CHECKING:
    from ..rendezvous import RendezvousClient
    from .common import Subparsers

HELP = "start N copies of a training script as the ranks of a group (like torchrun)"
LAUNCH_GROUP = "netcoll-run"  # the launchers' own group at the coordinator (several nodes)
EXIT_TIMEOUT = 300.0  # several nodes: how long a node waits for the others to finish (as torchrun's)
DESCRIPTION = """\
Start N copies of a script as ranks 0..N-1 of one group, with NETCOLL_COORDINATOR,
NETCOLL_WORLD_SIZE, NETCOLL_RANK, NETCOLL_TOKEN and torchrun's RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT set (so
netcoll.sync.connect() and init_process_group(init_method="env://") need no arguments).
A coordinator runs inside the launcher (loopback, fresh token) unless --coordinator is given.
Output lines are prefixed "[rank R] ". The first line says where the coordinator is and the
`netcoll status` command that shows the ranks and what each waits for. When a rank fails the
launcher names the rank that failed first and its error (a rank that raised, died, or never
arrived), gives each other failed rank one line, stops the others (SIGTERM, SIGKILL after
--grace), and exits with the first failure's status (128+N for a death by signal N).
Several nodes: run on each with the same --nnodes and --coordinator (node 0 starts the
coordinator there) and its own --node-rank; set the same NETCOLL_TOKEN on every node.

examples:
  netcoll run -n 4 train.py --lr 0.1
  netcoll run -n 2 -m mypkg.train
  netcoll run -n 4 --nnodes 2 --node-rank 1 --coordinator 10.0.0.1:29400 train.py"""


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "run",
        formatter_class=FORMATTER,
        help=HELP,
        description=DESCRIPTION,
        usage="netcoll run -n N [options] (script.py | -m module | --no-python prog) [args ...]",
    )
    sp.add_argument("-n", "--nproc-per-node", dest="nprocs", type=int, required=True, metavar="N", help="ranks here")
    sp.add_argument("--nnodes", type=int, default=1, metavar="M", help="nodes (default 1)")
    sp.add_argument("--node-rank", type=int, default=0, metavar="K", help="this node, 0..M-1 (default 0)")
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


@dataclass
class Plan:
    """What to start: the validated flags."""

    nprocs: int
    nnodes: int
    node_rank: int
    command: list[str]
    coordinator: str | None
    local_addr: str | None
    master_port: int | None
    grace: float
    join_timeout: float

    @property
    def world_size(self) -> int:
        return self.nprocs * self.nnodes


def plan_of(ns: argparse.Namespace) -> Plan:
    """Check the flags (CliError, exit 2) and build the command."""
    from ..config import check_address
    from ..mesh.auth import MEMBER_TOKEN_ENV, token_from_env

    if ns.nprocs < 1 or ns.nnodes < 1:
        raise CliError("-n and --nnodes must be at least 1", 2)
    if not 0 <= ns.node_rank < ns.nnodes:
        raise CliError(f"--node-rank must be in 0..{ns.nnodes - 1}, got {ns.node_rank}", 2)
    if ns.nnodes > 1 and not ns.coordinator:
        raise CliError("several nodes need --coordinator HOST:PORT (node 0 starts the coordinator there)", 2)
    if ns.module and ns.no_python:
        raise CliError("choose one of -m and --no-python", 2)
    if ns.grace < 0 or ns.join_timeout <= 0:
        raise CliError("--grace must be >= 0 and --join-timeout > 0", 2)
    if ns.master_port is not None and not 0 < ns.master_port < 65536:
        raise CliError(f"--master-port must be in 1..65535, got {ns.master_port}", 2)
    if ns.nnodes > 1 and token_from_env(MEMBER_TOKEN_ENV) is None:
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
    fields = (ns.nprocs, ns.nnodes, ns.node_rank, command, coordinator, ns.local_addr, ns.master_port)
    return Plan(*fields, ns.grace, ns.join_timeout)


def run(ns: argparse.Namespace) -> int:
    return run_client(launch(plan_of(ns)))


async def launch(plan: Plan) -> int:
    """Run the whole launch: coordinator (if ours), node meeting, ranks; the exit status."""
    from ..errors import NetcollError
    from ..mesh.auth import MEMBER_TOKEN_ENV, token_from_env
    from ..rendezvous import Coordinator
    from ..rpc import split_address

    token = token_from_env(MEMBER_TOKEN_ENV)
    supervisor = Supervisor(plan)
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(_log_to_stderr(supervisor))
        address, watcher = plan.coordinator, None
        if address is None or (plan.nnodes > 1 and plan.node_rank == 0):
            token, watcher = token or secrets.token_urlsafe(24), secrets.token_urlsafe(24)
            host, _, port = (address or "127.0.0.1:0").rpartition(":")
            coord = Coordinator(host.strip("[]"), int(port), token=token, client_token=watcher)
            await stack.enter_async_context(coord)
            address = coord.address
        supervisor.announce(address, watcher)
        master_addr = split_address(address)[0] if plan.nnodes > 1 else (plan.local_addr or "127.0.0.1")
        master_port = plan.master_port
        if plan.nnodes > 1:
            rdv = await _meet(plan, address, token)
            stack.push_async_callback(rdv.close)
            if plan.node_rank == 0:
                master_port = master_port or free_port(master_addr)
                await rdv.kv_set("master_port", master_port)
            else:
                master_port = int(await rdv.kv_get("master_port", plan.join_timeout))
        supervisor.env = {
            "NETCOLL_COORDINATOR": address,
            "NETCOLL_WORLD_SIZE": str(plan.world_size),
            "WORLD_SIZE": str(plan.world_size),
            "LOCAL_WORLD_SIZE": str(plan.nprocs),
            "GROUP_RANK": str(plan.node_rank),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port or free_port(master_addr)),
            **({MEMBER_TOKEN_ENV: token} if token else {}),
            **({"NETCOLL_LOCAL_HOST": plan.local_addr} if plan.local_addr else {}),
        }
        status = await supervisor.run()
        if plan.nnodes > 1:  # node 0's coordinator stays up until every node's ranks are done
            try:
                await rdv.barrier("exit", EXIT_TIMEOUT)
            except (NetcollError, OSError, TimeoutError) as exc:
                say(f"not every node finished cleanly: {exc}")
        return status


async def _meet(plan: Plan, address: str, token: str | None) -> RendezvousClient:
    """Join the launchers' group (one member per node); waits for node 0's coordinator
    (:func:`netcoll.rendezvous.dial`) within --join-timeout."""
    from ..errors import RendezvousTimeout
    from ..rendezvous import dial

    loop = asyncio.get_running_loop()
    deadline = loop.time() + plan.join_timeout
    try:
        rdv = await dial(address, timeout=plan.join_timeout, token=token, local_host=plan.local_addr, heartbeat=None)
    except RendezvousTimeout as exc:
        raise CliError(str(exc)) from None
    try:
        await rdv.join(
            LAUNCH_GROUP, world_size=plan.nnodes, rank=plan.node_rank, timeout=max(1.0, deadline - loop.time())
        )
    except BaseException:
        await rdv.close()
        raise
    return rdv


@contextlib.contextmanager
def _log_to_stderr(supervisor: Supervisor) -> Iterator[None]:
    """The coordinator's warnings (a rank lost...) on stderr, until the launcher
    itself stops the ranks (their losses are then expected). The logger is as it
    was afterwards (``run`` also runs inside other programs and tests)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("netcoll run: %(message)s"))
    handler.addFilter(lambda _: supervisor.status is None)
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
