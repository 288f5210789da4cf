"""The ranks of ``netcoll run`` as processes: :class:`Supervisor` starts them, prefixes
their output, stops them all when one fails or a signal arrives, says which rank failed
first and why (:mod:`.runfail`, from the notes the ranks write: :mod:`netcoll.launched`),
and works out the exit status. Semantics: docs/training.md."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .lines import pump_until_shutdown

if TYPE_CHECKING:
    from ..launched import Note
    from .run import Plan
    from .runfail import Cause

SETTLE_S = 1.0  # at the first failure, how long the ranks it points at get to note their own errors


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
        self.own_exits: dict[int, str] = {}  # rank -> how it exited, for those that failed before any stop
        self.cause: Cause | None = None  # who failed first, as said when the first rank failed
        self.led = asyncio.Event()  # the first failure has been said (the others' lines come after it)
        self.errors = tempfile.mkdtemp(prefix="netcoll-run-")  # NETCOLL_ERROR_FILE of each rank
        self.failing = asyncio.Event()  # set when the first failure (not a signal) stops the ranks
        self.story = ""  # the failure in words: the lead line, then the cause (first_cause)

    def child_env(self, local: int) -> dict[str, str]:
        from ..launched import ERROR_FILE_ENV

        rank = self.plan.node * self.plan.nprocs + local
        env = {**os.environ, **self.env, "NETCOLL_RANK": str(rank), "RANK": str(rank), "LOCAL_RANK": str(local)}
        env[ERROR_FILE_ENV] = self.note_path(rank)  # see first_cause
        env.setdefault("PYTHONUNBUFFERED", "1")  # lines show up as they are printed
        return env

    def note_path(self, rank: int) -> str:
        return os.path.join(self.errors, f"rank{rank}.json")

    async def run(self) -> int:
        """Start the ranks, wait for them all, say why it failed; the exit status. Signals
        go to :meth:`on_signal` (the launcher dispatches them: :mod:`.attempts`)."""
        try:
            for local in range(self.plan.nprocs):
                if self.status is not None:  # a rank could not start, or a signal came
                    break
                await self.start(local)
            await self.wait_all()
            self.first_cause()
        finally:
            self.kill_all(signal.SIGKILL)  # none is left running, whatever happened
            if self._kill is not None:
                self._kill.cancel()
            self.output.shutdown(wait=False, cancel_futures=True)
            shutil.rmtree(self.errors, ignore_errors=True)
        return self.status or 0

    def notes(self) -> dict[int, Note]:
        """The error notes the ranks wrote so far (``NETCOLL_ERROR_FILE``: netcoll.launched)."""
        from ..launched import read_note

        found = {r.rank: read_note(self.note_path(r.rank)) for r in self.ranks}
        return {rank: note for rank, note in found.items() if note is not None}

    def find_cause(self) -> Cause | None:
        from .runfail import find_cause

        return find_cause(self.notes(), self.own_exits, list(self.failed))

    def first_cause(self) -> None:
        """The last line of a failed run: the cause (:mod:`.runfail`), and the exit status:
        the cause's own when it failed by itself, else the first failure's."""
        if self.signalled or not self.failed:
            return
        cause = self.find_cause()
        if cause is None:
            return
        notes = self.notes()
        own = [self.failed[r] for r in cause.ranks if r in self.failed and (r in self.own_exits or r in notes)]
        if len(cause.ranks) == 1 and own:
            self.status = own[0]
        self.story = cause.text
        say(f"{cause.text}; exit status {self.status}")

    async def start(self, local: int) -> None:
        rank = self.plan.node * self.plan.nprocs + local
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
        if code != 0:
            await self.failed_here(r.rank, code)
        with contextlib.suppress(TimeoutError):  # a grandchild holding the pipe open: stop waiting
            await asyncio.wait_for(asyncio.gather(*r.pumps), max(self.plan.grace, 1.0))

    async def failed_here(self, rank: int, code: int) -> None:
        """Rank ``rank`` exited failing (``code``: its return code). The first failure leads
        with the cause, which may be another rank (:mod:`.runfail`), and stops the others;
        every rank that failed because of it gets one line, after that."""
        from .runfail import victim_line

        status = 128 - code if code < 0 else code
        self.failed[rank] = status
        if self.status is None:  # nothing stopped yet: it failed by itself, and leads
            self.own_exits[rank] = f"was killed by {_signame(-code)}" if code < 0 else f"exited with status {code}"
            self.status = status
            self.cause = await self.settled_cause()
            self.lead(self.cause.text if self.cause else f"rank {rank} {self.own_exits[rank]}")
        await self.led.wait()
        note = self.notes().get(rank)
        if note is not None and not self.signalled and (self.cause is None or rank not in self.cause.ranks):
            say(victim_line(rank, note))

    async def settled_cause(self) -> Cause | None:
        """The cause, once the ranks it names have had a moment to note theirs: a rank that
        failed at the same time may not have written its note yet, and would otherwise look
        like one that never arrived (at most :data:`SETTLE_S`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_S
        cause = self.find_cause()
        while cause is not None and loop.time() < deadline and self.unsettled(cause):
            await asyncio.sleep(0.05)
            cause = self.find_cause()
        return cause

    def unsettled(self, cause: Cause) -> bool:
        """Some rank ``cause`` names is running and has noted nothing (yet)."""
        notes = self.notes()
        return any(r.rank in cause.ranks and r.proc.returncode is None and r.rank not in notes for r in self.ranks)

    def lead(self, message: str) -> None:
        """Say what failed first, and stop the ranks still running (those that noted an
        error are leaving on their own: they get SIGKILL only after --grace)."""
        alive = sum(r.proc.returncode is None for r in self.ranks)
        say(message + (f"; stopping the other {alive} rank(s)" if alive else ""))
        self.stop_all(signal.SIGTERM, spare_noted=True)
        self.story = message
        self.led.set()
        if not self.signalled:
            self.failing.set()

    def fail(self, status: int, message: str) -> None:
        if self.status is not None:
            return
        self.status = status
        self.lead(message)

    def on_signal(self, sig: int) -> None:
        self.signalled += 1
        if self.signalled > 1:
            self.kill_all(signal.SIGKILL)
            return
        say(f"got {_signame(sig)}; passing it to the ranks")
        if self.status is None:
            self.status = 128 + sig
        self.led.set()  # nothing to lead with: the ranks end because of the signal
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


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def announce(address: str, client_token: str | None, directory: str) -> None:
    """Say where the coordinator is and how to watch the ranks (``netcoll status``: the
    members and what each waits for); ``client_token``: our coordinator's, which may
    read status only, handed over in a file only we can read (never in a process list)."""
    watch = f"netcoll status --coordinator {address}"
    if client_token is not None:
        fd, path = tempfile.mkstemp(prefix="client-token-", dir=directory)  # mode 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(client_token + "\n")
        watch += f" --client-token-file {path}"
    say(f"coordinator {address}; to see the ranks and what each waits for: {watch}")


def say(message: str) -> None:
    sys.stderr.write(f"netcoll run: {message}\n")
    sys.stderr.flush()


__all__ = ["SETTLE_S", "Rank", "Supervisor", "announce", "say"]
