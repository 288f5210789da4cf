"""The heartbeat thread of a :class:`~netcoll.rendezvous.client.RendezvousClient`
(the *process* half of its liveness, see :mod:`netcoll.rendezvous.client`): an event
loop of its own in a daemon thread, a second connection to the coordinator, a
PING at the interval the coordinator grants."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import threads
from ..errors import NetcollError, RendezvousError
from ..escape import escape
from ..mesh.certs import TlsConfig
from ..rpc import RpcClient
from ..wire import Kind

log = logging.getLogger("netcoll.rendezvous")

LEASE_JOIN_TIMEOUT = 5.0  # close() waits this long at most for the heartbeat thread to end
LEASE_ATTEMPTS = 5  # connects of the heartbeat thread, the first retry after LEASE_RETRY (doubling)
LEASE_RETRY = 0.2


class Lease:
    """The heartbeat thread of one :class:`RendezvousClient`.

    It runs an event loop of its own in a daemon thread, opens a second
    authenticated connection to the coordinator, claims the main connection's
    lease (``lease`` RPC; the coordinator answers with the interval to beat
    at) and then PINGs at that interval until told to stop, until the main
    connection is lost, or until the main event loop is closed. A busy or
    blocked user event loop therefore does not stop the heartbeats; the
    process dying or being stopped (SIGSTOP) does. It holds no reference to
    the client, so a client dropped without ``close()`` is still freed.
    """

    def __init__(
        self,
        address: str,
        lease_id: str,
        *,
        token: str | None,
        local_host: str | None,
        timeout: float,
        main_loop: asyncio.AbstractEventLoop,
        tls: TlsConfig | None = None,
    ) -> None:
        self.address, self.lease_id = address, lease_id
        self.tls = tls
        self.token, self.local_host, self.timeout = token, local_host, timeout
        self.main_loop = main_loop
        self.stop = threading.Event()
        self.interval: float | None = None  # granted by the coordinator
        self.beats = 0
        #: what each beat carries (the operations this process is in: the arrival board), or None
        self.report: Callable[[], dict[str, Any] | None] | None = None
        #: called (in this thread) with what a beat's answer says of the ranks this process
        #: waits for (``board.chain_answer``: their stuck waits, what the others do), or None
        self.view: Callable[[Any], None] | None = None
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._main, name="netcoll-heartbeat", daemon=True)

    def start(self) -> None:
        threads.start(self.thread)  # signals stay with the main thread

    def request_stop(self) -> None:
        """Ask the thread to stop (from any thread; does not wait)."""
        self.stop.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed
                loop.call_soon_threadsafe(wake.set)

    async def join(self, timeout: float = LEASE_JOIN_TIMEOUT) -> None:
        """Stop the thread and wait for it to end (without blocking the event loop)."""
        self.request_stop()
        end = time.monotonic() + timeout
        while self.thread.is_alive() and time.monotonic() < end:  # noqa: ASYNC110 - a thread, not a task
            await asyncio.sleep(0.005)
        if self.thread.is_alive():
            log.warning("the rendezvous heartbeat thread did not stop within %gs", timeout)

    # -- the thread -------------------------------------------------------------------
    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._run())
        except Exception as exc:  # noqa: BLE001 - reported, never raised out of a thread
            self.error = exc
        finally:
            try:
                rest = asyncio.all_tasks(loop)
                for task in rest:
                    task.cancel()
                if rest:
                    loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            finally:
                self._loop = None
                loop.close()

    def _done(self) -> bool:
        return self.stop.is_set() or self.main_loop.is_closed()

    async def _stoppable(self, aw: Awaitable[Any]) -> Any:
        """``await aw``, unless a stop is requested first (then None)."""
        assert self._wake is not None
        task = asyncio.ensure_future(aw)
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({task, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waker.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None

    async def _connect(self) -> RpcClient | None:
        """The heartbeat connection (None when stopped first). A refused or broken
        connect is retried a few times: many ranks starting at once on one host
        may briefly exceed the coordinator's handshakes per source."""
        assert self._wake is not None
        delay = LEASE_RETRY
        for attempt in range(LEASE_ATTEMPTS):
            try:
                rpc: RpcClient | None = await self._stoppable(
                    RpcClient.connect(
                        self.address,
                        token=self.token,
                        role="rendezvous",
                        timeout=self.timeout,
                        local_host=self.local_host,
                        tls=self.tls,
                    )
                )
                return rpc
            except OSError:  # refused, reset, aborted by the server
                if attempt == LEASE_ATTEMPTS - 1 or self._done():
                    raise
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass
            delay *= 2
        return None

    def _beat(self) -> dict[str, Any]:
        """A PING's body: the in-flight operations when a reporter is set (read here, in
        this thread; the reporter reads thread-safe copies)."""
        report = self.report
        if report is None:
            return {}
        try:
            ops = report()
        except Exception:  # a beat must go out whatever the report does (logged, so not blind)
            log.debug("in-flight report failed", exc_info=True)
            return {}
        return {} if ops is None else {"ops": ops}

    def _on_pong(self, body: dict[str, Any]) -> None:
        view = self.view
        if view is None or "waits" not in body:
            return
        try:
            view(body)
        except Exception:  # a beat's answer never stops the beats (logged, so not blind)
            log.debug("the coordinator's view of the waits was not taken", exc_info=True)

    async def _run(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._done():
            return
        rpc: RpcClient | None = None
        try:
            rpc = await self._connect()
            if rpc is None:
                return
            rpc.on_pong = self._on_pong
            granted = await self._stoppable(rpc.call("lease", {"lease": self.lease_id}, timeout=self.timeout))
            if granted is None:
                return
            interval = float(granted["interval"])
            if not interval > 0:
                raise RendezvousError(f"the coordinator granted a heartbeat interval of {interval!r}")
            self.interval = interval
            while not self._done() and rpc.proto.lost is None:
                self._wake.clear()
                try:
                    async with asyncio.timeout(interval):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                if self._done():
                    break
                await rpc.proto.send(Kind.PING, self._beat())
                self.beats += 1
        except (OSError, NetcollError, TimeoutError, KeyError, TypeError, ValueError) as exc:
            self.error = exc
            if not self._done():
                log.warning(
                    "rendezvous heartbeat thread to %s stopped: %s (heartbeats now come from the event loop only)",
                    escape(self.address),
                    escape(exc),
                )
        finally:
            if rpc is not None:
                await rpc.close()


__all__ = ["Lease"]
