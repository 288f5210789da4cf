"""The attempts of ``netcoll run --max-restarts K``: run the ranks (:class:`.supervisor.Supervisor`);
after a failure, start them all again, up to K times, each attempt with
``NETCOLL_RESTART_COUNT`` / ``TORCHELASTIC_RESTART_COUNT`` = its number (0 first) and a ranks'
coordinator of its own (attempt 0: the launcher's; later ones: a fresh one on the same host), so
the ranks never meet the previous attempt's leftovers. A signal to the launcher never restarts.

Several nodes restart together (:mod:`.runnodes`): a node whose ranks fail tells the others, which
stop theirs; every node waits until all nodes' ranks ended, then all start the next attempt (or
all stop). Semantics: docs/training.md, "Restarts".
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from .common import CliError
from .ports import free_port
from .supervisor import Supervisor, announce, say

if TYPE_CHECKING:
    from ..rendezvous import Coordinator
    from .run import Plan
    from .runnodes import Nodes

T = TypeVar("T")
RESTART_ENV = ("NETCOLL_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")  # the attempt's number, 0 first
EXIT_TIMEOUT = 300.0  # several nodes: how long a node waits for the others to finish (as torchrun's)


def address_of(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Attempts:
    """The launch's attempts: which supervisor runs now, where each attempt's ranks meet,
    and the launcher's signals (to the running ranks; between attempts: stop)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.current: Supervisor | None = None
        self.interrupt = 0  # the signal the launcher got (0: none)
        self.stop = asyncio.Event()  # set with interrupt
        self.files = tempfile.mkdtemp(prefix="netcoll-run-")  # the status client token, for the whole launch
        self.fresh: Coordinator | None = None  # this attempt's ranks' coordinator, when not the first's
        self.remote = False  # this attempt's ranks were stopped because another node's failed
        self.running = False  # an attempt's ranks are running (else a signal just stops the launch)

    # -- signals and logs --------------------------------------------------------------
    @contextlib.contextmanager
    def signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM go to :meth:`on_signal` while the launch runs."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.on_signal, sig)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            shutil.rmtree(self.files, ignore_errors=True)

    def on_signal(self, sig: int) -> None:
        self.interrupt = self.interrupt or sig
        self.stop.set()
        if self.current is not None and self.running:
            self.current.on_signal(sig)
        else:
            say(f"got {signal.Signals(sig).name}; stopping")

    def news(self) -> bool:
        """Whether the coordinators' warnings are news (not once the launcher stops ranks)."""
        return self.current is None or self.current.status is None

    async def interruptible(self, aw: Awaitable[T]) -> T:
        """``aw``, unless a signal comes first (CliError with the signal's status)."""
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not task.done():
            task.cancel()
            raise CliError("interrupted", 128 + self.interrupt)
        return task.result()

    # -- where each attempt's ranks meet ----------------------------------------------------
    async def fresh_coordinator(self, host: str, token: str | None, watcher: str | None) -> int:
        """Close the previous attempt's own coordinator, start a new one on ``host``: its port."""
        from ..rendezvous import Coordinator

        await self.close()
        self.fresh = await Coordinator(host, 0, token=token, client_token=watcher).start()
        return int(self.fresh.address.rpartition(":")[2])

    async def close(self) -> None:
        if self.fresh is not None:
            fresh, self.fresh = self.fresh, None
            await fresh.close()

    async def settings(
        self, attempt: int, main: str, token: str | None, watcher: str | None, nodes: Nodes | None
    ) -> dict[str, str]:
        """The environment of ``attempt``'s ranks (besides their own rank variables)."""
        from ..mesh.auth import MEMBER_TOKEN_ENV
        from ..rpc import split_address

        plan = self.plan
        main_host = split_address(main)[0]
        master_addr = main_host if plan.max_nodes > 1 else (plan.local_addr or "127.0.0.1")
        chosen: dict[str, Any] | None = None
        if nodes is None or plan.node_rank == 0:  # we choose
            port = None
            if attempt:
                host = main_host if plan.hosting else (plan.local_addr or "127.0.0.1")
                port = await self.fresh_coordinator(host, token, watcher)
            chosen = {"port": port, "master_port": plan.master_port or free_port(master_addr)}
        if nodes is not None:
            chosen = await self.interruptible(nodes.attempt_info(attempt, chosen))
        assert chosen is not None
        port = chosen.get("port")
        if self.fresh is not None:
            address = self.fresh.address
        else:
            address = main if port is None else address_of(main_host, int(port))
        if attempt:
            announce(address, watcher, self.files)
        return {
            "NETCOLL_COORDINATOR": address,
            "NETCOLL_WORLD_SIZE": str(plan.world_size),
            "WORLD_SIZE": str(plan.world_size),
            "LOCAL_WORLD_SIZE": str(plan.nprocs),
            "GROUP_RANK": str(plan.node_rank),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(chosen["master_port"]),
            **{name: str(attempt) for name in RESTART_ENV},
            "TORCHELASTIC_MAX_RESTARTS": str(plan.max_restarts),
            **({MEMBER_TOKEN_ENV: token} if token else {}),
            **({"NETCOLL_LOCAL_HOST": plan.local_addr} if plan.local_addr else {}),
        }

    # -- the attempts ------------------------------------------------------------------
    async def run(self, main: str, token: str | None, watcher: str | None, nodes: Nodes | None) -> int:
        """Every attempt, until one succeeds, the restarts are spent, or a signal; the exit status."""
        plan = self.plan
        if plan.max_restarts and token is None:  # one node, another's coordinator without a token
            token = secrets.token_urlsafe(24)  # (ours, from the second attempt on, has one)
        try:
            for attempt in range(plan.max_restarts + 1):
                if self.interrupt:
                    return 128 + self.interrupt
                env = await self.settings(attempt, main, token, watcher, nodes)
                status, story = await self.one(attempt, env, nodes)
                if status == 0 or self.interrupt:
                    return status
                if attempt == plan.max_restarts:
                    if attempt:
                        say(f"no restart left ({attempt} of {attempt} done); exit status {status}")
                    return status
                if story is None:
                    return status
                say(f"restart {attempt + 1} of {plan.max_restarts} after {story}")
            raise AssertionError("unreachable")
        finally:
            await self.close()

    async def one(self, attempt: int, env: dict[str, str], nodes: Nodes | None) -> tuple[int, str | None]:
        """Run ``attempt``'s ranks; its status here (0: it succeeded everywhere) and its story
        (None: no restart, whatever is left: the nodes cannot go on together)."""
        if self.interrupt:
            return 128 + self.interrupt, None
        sup = Supervisor(self.plan)
        sup.env = env
        self.current, self.remote = sup, False
        watch = None
        if nodes is not None and self.plan.max_restarts:
            watch = asyncio.create_task(self.watch(attempt, sup, nodes))
        self.running = True
        try:
            status = await sup.run()
        finally:
            self.running = False
        if nodes is None:
            return status, sup.story or f"exit status {status}"
        if watch is not None and not (sup.failing.is_set() and not self.remote):
            watch.cancel()
        if watch is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        return await self.together(attempt, status, sup, nodes)

    async def watch(self, attempt: int, sup: Supervisor, nodes: Nodes) -> None:
        """Tell the other nodes when our ranks fail; stop ours when theirs do."""
        from ..errors import NetcollError

        local = asyncio.create_task(sup.failing.wait())
        remote = asyncio.create_task(nodes.failure(attempt))
        try:
            await asyncio.wait({local, remote}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (local, remote):
                task.cancel()
        if local.done() and not local.cancelled():
            try:
                await nodes.report(attempt, sup.status or 1, sup.story)
            except (NetcollError, OSError) as exc:
                say(f"could not tell the other nodes: {exc}")
        elif remote.done() and not remote.cancelled() and remote.exception() is None:
            failure = remote.result()
            self.remote = True
            sup.fail(failure.status, f"node {failure.node} failed ({failure.text})")

    async def together(self, attempt: int, status: int, sup: Supervisor, nodes: Nodes) -> tuple[int, str | None]:
        """Several nodes: wait for every node's ranks of ``attempt``; all restart, or all stop."""
        from ..errors import NetcollError

        plan = self.plan
        last = attempt == plan.max_restarts
        if not plan.max_restarts:
            try:
                await nodes.rdv.barrier("exit", EXIT_TIMEOUT)  # node 0's coordinator stays up until all are done
            except (NetcollError, OSError, TimeoutError) as exc:
                say(f"not every node finished cleanly: {exc}")
            return status, None
        try:
            if self.interrupt:  # no node restarts; this one leaves at once
                await nodes.interrupted(attempt, status)
                return status, None
            failure, interrupted = await self.interruptible(nodes.ended(attempt))
            status = status or (failure.status if failure is not None else 0)
            if failure is None or interrupted or last:
                await self.interruptible(nodes.rdv.barrier("exit", EXIT_TIMEOUT))
                return status, None
        except (NetcollError, OSError, TimeoutError) as exc:
            say(f"not every node finished cleanly, so none restarts: {exc}")
            return status or 1, None
        story = failure.text if failure.node == plan.node_rank else f"{failure.text} (on node {failure.node})"
        return status, story


__all__ = ["EXIT_TIMEOUT", "RESTART_ENV", "Attempts", "address_of"]
