"""``netcoll run``: start N copies of a training script as the ranks of a group
(what ``torchrun`` does for torch.distributed). Usage: :data:`DESCRIPTION`;
semantics (coordinator, several nodes, output, failures, signals): docs/training.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..escape import escape
from .common import FORMATTER, CliError, run_client
from .lines import pump_until_shutdown
from .ports import free_port

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
Output lines are prefixed "[rank R] ". When a rank fails the others get SIGTERM (SIGKILL after
--grace) and the exit status is the first failure's (128+N for a death by signal N).
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
    try:
        coordinator = check_address(ns.coordinator) if ns.coordinator else None
    except ValueError as exc:
        raise CliError(f"--coordinator: {exc}", 2) from None
    if ns.no_python:
        command = [ns.target, *ns.args]
    else:
        command = [sys.executable, *(["-m"] if ns.module else []), ns.target, *ns.args]
    fields = (ns.nprocs, ns.nnodes, ns.node_rank, command, coordinator, ns.local_addr, ns.master_port)
    return Plan(*fields, ns.grace, ns.join_timeout)


def run(ns: argparse.Namespace) -> int:
    return run_client(launch(plan_of(ns)))


async def launch(plan: Plan) -> int:
    """Run the whole launch: coordinator (if ours), node meeting, ranks; the exit status."""
    from ..errors import NetcollError
    from ..rendezvous import Coordinator
    from ..rpc import split_address
    from ..transport.auth import MEMBER_TOKEN_ENV, token_from_env

    token = token_from_env(MEMBER_TOKEN_ENV)
    supervisor = Supervisor(plan)
    _log_to_stderr(supervisor)
    if plan.nnodes > 1 and token is None:
        raise CliError(f"several nodes need a shared member token: set {MEMBER_TOKEN_ENV} on every node", 2)
    async with contextlib.AsyncExitStack() as stack:
        address = plan.coordinator
        if address is None or (plan.nnodes > 1 and plan.node_rank == 0):
            token = token or secrets.token_urlsafe(24)
            host, _, port = (address or "127.0.0.1:0").rpartition(":")
            coord = Coordinator(host.strip("[]"), int(port), token=token)
            await stack.enter_async_context(coord)
            address = coord.address
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
                _say(f"not every node finished cleanly: {exc}")
        return status


async def _meet(plan: Plan, address: str, token: str | None) -> RendezvousClient:
    """Join the launchers' group (one member per node); retries until node 0 is up."""
    from ..rendezvous import RendezvousClient

    loop = asyncio.get_running_loop()
    deadline = loop.time() + plan.join_timeout
    while True:
        try:
            rdv = await RendezvousClient.connect(address, token=token, local_host=plan.local_addr, heartbeat=None)
            break
        except OSError as exc:
            if loop.time() > deadline:
                raise CliError(f"no coordinator at {address} within {plan.join_timeout:g}s: {exc}") from None
            await asyncio.sleep(0.2)
    try:
        await rdv.join(
            LAUNCH_GROUP, world_size=plan.nnodes, rank=plan.node_rank, timeout=max(1.0, deadline - loop.time())
        )
    except BaseException:
        await rdv.close()
        raise
    return rdv


@dataclass
class Rank:
    """One started copy of the script."""

    rank: int
    proc: asyncio.subprocess.Process
    pumps: list[asyncio.Task[None]] = field(default_factory=list)


class Supervisor:
    """Starts the ranks, prefixes their output, stops them all when one fails
    or a signal arrives, and works out the exit status."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.env: dict[str, str] = {}  # what every rank gets besides its own rank variables
        self.ranks: list[Rank] = []
        self.status: int | None = None  # the first failure's (or the signal's) exit status
        self.signalled = 0
        self._kill: asyncio.TimerHandle | None = None
        self.output = ThreadPoolExecutor(1, thread_name_prefix="netcoll-run-output")
        self.failed: dict[int, int] = {}  # rank -> exit status, in the order they exited
        self.errors = tempfile.mkdtemp(prefix="netcoll-run-")  # NETCOLL_ERROR_FILE of each rank

    def child_env(self, local: int) -> dict[str, str]:
        from ..session import ERROR_FILE_ENV

        rank = self.plan.node_rank * self.plan.nprocs + local
        env = {**os.environ, **self.env, "NETCOLL_RANK": str(rank), "RANK": str(rank), "LOCAL_RANK": str(local)}
        env[ERROR_FILE_ENV] = self.note_path(rank)  # see first_cause
        env.setdefault("PYTHONUNBUFFERED", "1")  # lines show up as they are printed
        return env

    def note_path(self, rank: int) -> str:
        return os.path.join(self.errors, f"rank{rank}.json")

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.on_signal, sig)
        try:
            for local in range(self.plan.nprocs):
                if self.status is not None:  # a rank could not start, or a signal came
                    break
                await self.start(local)
            await self.wait_all()
            self.first_cause()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            self.kill_all(signal.SIGKILL)  # none is left running, whatever happened
            if self._kill is not None:
                self._kill.cancel()
            self.output.shutdown(wait=False, cancel_futures=True)
            shutil.rmtree(self.errors, ignore_errors=True)
        return self.status or 0

    def first_cause(self) -> None:
        """The first rank to *exit* failing may have failed because another one did
        (PeerLost): if both noted their errors (``NETCOLL_ERROR_FILE``), the earlier
        note is the cause, and its status is the exit status."""
        notes = {r: _note(self.note_path(r)) for r in self.failed}
        first = next(iter(self.failed), None)
        if self.signalled or first is None or notes[first] is None:
            return  # no failure, a signal, or a rank that died without a word: that one it is
        cause = min((note[0], r) for r, note in notes.items() if note is not None)[1]
        if cause != first:
            self.status = self.failed[cause]
            _say(f"rank {cause} failed first ({escape(notes[cause][1])}); exit status {self.status}")  # type: ignore[index]

    async def start(self, local: int) -> None:
        rank = self.plan.node_rank * self.plan.nprocs + local
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.plan.command,
                env=self.child_env(local),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                process_group=0,  # its own group: the terminal's Ctrl-C reaches it once, through us
            )
        except OSError as exc:
            self.fail(127, f"cannot start rank {rank}: {exc}")
            return
        prefix = f"[rank {rank}] ".encode()
        started = Rank(rank, proc)
        assert proc.stdout is not None and proc.stderr is not None
        for stream, out in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
            started.pumps.append(asyncio.create_task(pump_until_shutdown(stream, out, prefix, self.output)))
        self.ranks.append(started)

    async def wait_all(self) -> None:
        waits = {asyncio.create_task(self.reap(r)) for r in self.ranks}
        if waits:
            await asyncio.wait(waits)

    async def reap(self, r: Rank) -> None:
        code = await r.proc.wait()
        if code != 0:  # the first rank to exit with a failure is "the" failure (see first_cause)
            status = 128 - code if code < 0 else code
            self.failed[r.rank] = status
            how = f"was killed by {_signame(-code)}" if code < 0 else f"exited with status {code}"
            self.fail(status, f"rank {r.rank} {how}")
        with contextlib.suppress(TimeoutError):  # a grandchild holding the pipe open: stop waiting
            await asyncio.wait_for(asyncio.gather(*r.pumps), max(self.plan.grace, 1.0))

    def fail(self, status: int, message: str) -> None:
        if self.status is not None:
            return
        self.status = status
        alive = sum(r.proc.returncode is None for r in self.ranks)
        _say(message + (f"; stopping the other {alive} rank(s)" if alive else ""))
        self.stop_all(signal.SIGTERM, spare_noted=True)

    def on_signal(self, sig: int) -> None:
        self.signalled += 1
        if self.signalled > 1:
            self.kill_all(signal.SIGKILL)
            return
        _say(f"got {_signame(sig)}; passing it to the ranks")
        if self.status is None:
            self.status = 128 + sig
        self.stop_all(sig)

    def stop_all(self, sig: int, spare_noted: bool = False) -> None:
        self.kill_all(sig, spare_noted)
        if self._kill is None:
            self._kill = asyncio.get_running_loop().call_later(self.plan.grace, self.kill_all, signal.SIGKILL)

    def kill_all(self, sig: int, spare_noted: bool = False) -> None:
        """``sig`` to every running rank (``spare_noted``: not to those that noted a
        failure, so leaving on their own with their own status; SIGKILL comes later)."""
        for r in self.ranks:
            if spare_noted and os.path.exists(self.note_path(r.rank)):
                continue
            if r.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(r.proc.pid, sig)


def _note(path: str) -> tuple[float, str] | None:
    """(time, error) from a rank's error file, or None."""
    try:
        with open(path, encoding="utf-8") as f:
            note = json.load(f)
        return float(note["time"]), str(note["error"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _log_to_stderr(supervisor: Supervisor) -> None:
    """The coordinator's warnings (a rank lost...) on stderr, until the launcher
    itself stops the ranks (their losses are then expected)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("netcoll run: %(message)s"))
    handler.addFilter(lambda _: supervisor.status is None)
    logger = logging.getLogger("netcoll")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False


def _say(message: str) -> None:
    sys.stderr.write(f"netcoll run: {message}\n")
    sys.stderr.flush()


__all__ = ["HELP", "Plan", "Supervisor", "add_parser", "free_port", "launch", "plan_of", "run"]
