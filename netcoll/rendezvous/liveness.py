"""Liveness: leases, heartbeats and the judgement of silent sessions; no sockets.

Liveness tells two things apart. A client's heartbeat thread holds a *lease*
on its main connection (the ``lease`` RPC, over a second connection of its
own) and PINGs every ``liveness_timeout_s / 4``: when those heartbeats stop for
``liveness_timeout_s`` the member **is gone** (its process died, was stopped or
was cut off) and is dropped like a closed connection. The client's event loop
PINGs on the main connection: when that is silent for ``progress_timeout_s``
while the heartbeats still arrive, the member **is unresponsive** (a long
training step, a checkpoint write): that is logged and shown by ``status``
(``liveness``), and the member stays in its group. A session that declares a
``heartbeat`` but holds no lease (an older client) is dropped after
``3 x heartbeat`` of silence.

Heartbeats also carry the rank's in-flight report (:mod:`.board`): the latest is
kept per main connection, and a rank that has waited a while is answered with the
stuck waits of the ranks it waits for. Dropping a session is the coordinator's
(``drop(session, reason, verdict)``); this module only decides.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..errors import RendezvousError
from ..limits import DEFAULT, Limits
from ..rpc import Session
from . import board as arrivals
from .groups import Member, show
from .membership import SESSION_KEY, names

log = logging.getLogger("netcoll.rendezvous")

#: a session is dropped when silent for this many of its declared heartbeat intervals
LIVENESS_FACTOR = 3.0
#: a lease holder PINGs this many times per ``liveness_timeout_s``
LEASE_BEATS = 4
#: a heartbeat whose rank has waited this long without data is answered with the stuck waits
#: of the ranks it waits for; the index of reports that answer reads is rebuilt this often
CHAIN_AFTER = 1.0
CHAIN_INDEX_AGE = 0.5
MIN_LIVENESS = 0.05  # seconds: the shortest liveness timeout honoured
LEASE_KEY = "lease.holder"  # main Session.data[...] -> the heartbeat thread's Session
LEASE_OF = "lease.of"  # heartbeat Session.data[...] -> the main Session
UNRESPONSIVE = "liveness.unresponsive"  # Session.data[...] -> loop time its event loop went quiet
REPORT = "board.report"  # main Session.data[...] -> its latest in-flight report (arrivals.Report)

Drop = Callable[[Session, str, str], None]


class Liveness:
    """The leases of the sessions ``sessions()`` returns, and the verdicts on them."""

    def __init__(self, sessions: Callable[[], set[Session]], drop: Drop, limits: Limits = DEFAULT) -> None:
        self.sessions = sessions
        self.drop = drop
        self.limits = limits
        self.leases: dict[str, Session] = {}  # lease id -> the main session that declared it
        #: (when built, the reports by (group family, world rank)) for heartbeats' answers
        self._chain_index: tuple[float, dict[tuple[str, int], arrivals.Report]] | None = None
        self.wake: asyncio.Event | None = None  # set when the reaper should look sooner

    def timeout(self) -> float:
        return max(float(self.limits.liveness_timeout_s), MIN_LIVENESS)

    # -- leases ------------------------------------------------------------------------
    def opened(self, session: Session) -> None:
        """A connection opened: note the lease its HELLO declares (ValueError refuses it)."""
        lease = session.hello.get("lease")
        if lease is not None:
            if not isinstance(lease, str) or not 0 < len(lease) <= 64:
                raise ValueError(f"lease must be a string of at most 64 characters, got {show(lease)}")
            if lease in self.leases:
                raise ValueError("this lease id is already in use by another connection")
            self.leases[lease] = session
        if "heartbeat" in session.hello and self.wake is not None:
            self.wake.set()  # it may need to check more often now

    def claim(self, session: Session, params: dict[str, Any]) -> dict[str, Any]:
        """A heartbeat connection claims the lease its main connection declared."""
        lease = params.get("lease")
        if not isinstance(lease, str) or not 0 < len(lease) <= 64:
            raise TypeError(f"lease must be a string of at most 64 characters, got {show(lease)}")
        main = self.leases.get(lease)
        if main is None or main is session or main.proto.lost is not None or "drop_reason" in main.data:
            raise RendezvousError("no open connection declared this lease (it closed, or never declared one)")
        held: Session | None = main.data.get(LEASE_KEY)
        if held is not None and held is not session and held.proto.lost is None:
            raise RendezvousError("this lease is already held by another connection")
        if LEASE_OF in session.data or LEASE_KEY in session.data or SESSION_KEY in session.data:
            raise RendezvousError("a connection holding a lease (or a group membership) cannot hold another lease")
        main.data[LEASE_KEY], session.data[LEASE_OF] = session, main
        if self.wake is not None:
            self.wake.set()
        ttl = self.timeout()
        return {"interval": ttl / LEASE_BEATS, "timeout": ttl}

    def release(self, session: Session) -> None:
        """Unlink a closing session from its lease: a main session's heartbeat
        connection is closed with it; when a heartbeat connection closes first
        (its thread failed, or one connection was cut), its main session is judged
        by its event loop's PINGs again, as a client without a lease is."""
        lease = session.hello.get("lease")
        if isinstance(lease, str) and self.leases.get(lease) is session:
            del self.leases[lease]
        holder: Session | None = session.data.pop(LEASE_KEY, None)
        if holder is not None:
            holder.data.pop(LEASE_OF, None)
            holder.proto.close()
        main: Session | None = session.data.pop(LEASE_OF, None)
        if main is not None and main.data.get(LEASE_KEY) is session:
            del main.data[LEASE_KEY]
            main.data.pop(UNRESPONSIVE, None)
            log.info(
                "the heartbeat connection of %s:%s closed; its event loop's PINGs are all we have now", *main.peer[:2]
            )

    # -- verdicts ----------------------------------------------------------------------
    async def reap(self) -> None:
        """Judge the heartbeating sessions whenever the next one may be due (runs until cancelled)."""
        loop = asyncio.get_running_loop()
        self.wake = wake = asyncio.Event()
        while True:
            pause = self.check(loop.time())  # (no session stays referenced while we wait)
            due = loop.time() + pause
            try:
                async with asyncio.timeout(pause):
                    await wake.wait()
            except TimeoutError:
                pass
            wake.clear()
            if loop.time() - due > 0.1:
                # Our own loop stalled: let the frames that arrived meanwhile be read before
                # judging anyone by them (a stall here is not their silence).
                for _ in range(4):
                    await asyncio.sleep(0)

    def check(self, now: float) -> float:
        """Drop the gone sessions, report the unresponsive ones; return how long to wait
        before checking again."""
        pause = 1.0
        ttl = self.timeout()
        for session in list(self.sessions()):
            if "drop_reason" in session.data or LEASE_OF in session.data:
                continue  # being dropped; or a heartbeat connection (judged with its main session)
            beat = declared_beat(session.hello.get("heartbeat"))
            holder: Session | None = session.data.get(LEASE_KEY)
            if holder is not None:
                silent = now - holder.last_seen
                if silent > ttl:
                    why = f"its process died, was stopped or is cut off; liveness_timeout_s={ttl:g}"
                    self.drop(session, f"no heartbeat for {silent:.1f}s ({why})", "is gone")
                    continue
                pause = min(pause, ttl - silent + 0.01)
                pause = min(pause, self._check_progress(session, now, beat))
            elif beat is not None:  # no lease (yet): its event loop's PINGs are all we have
                silent = now - session.last_seen
                if silent > LIVENESS_FACTOR * beat:
                    limit = f"limit {LIVENESS_FACTOR:g} x {beat:g}s"
                    self.drop(session, f"no heartbeat for {silent:.2f}s ({limit})", "was lost")
                    continue
                pause = min(pause, beat / 2)
        return max(pause, 0.01)

    def _check_progress(self, session: Session, now: float, beat: float | None) -> float:
        """Report (once per episode) a session whose process heartbeats while its event
        loop has been silent for ``progress_timeout_s``; return when to look again."""
        limit = float(self.limits.progress_timeout_s)
        if not limit or beat is None:
            return 1.0  # disabled, or a loop that never PINGs: nothing to judge by
        limit = max(limit, LIVENESS_FACTOR * beat)
        quiet = now - session.last_seen
        since = session.data.get(UNRESPONSIVE)
        if quiet > limit:
            if since is None:
                session.data[UNRESPONSIVE] = session.last_seen
                for name in names(session):
                    log.warning(
                        "%s is unresponsive: its process heartbeats but its event loop has not answered for %.0fs "
                        "(progress_timeout_s=%g); it stays a member",
                        name,
                        quiet,
                        limit,
                    )
            return 1.0
        if since is not None:
            del session.data[UNRESPONSIVE]
            for name in names(session):
                log.info("%s is responsive again: its event loop was silent for %.1fs", name, session.last_seen - since)
        return limit - quiet + 0.01

    def row(self, member: Member) -> dict[str, Any]:
        """``liveness`` ("ok", "unresponsive", "disconnected") and for how long its loop is quiet."""
        session = member.session
        if not member.connected or session is None:
            return {"liveness": "disconnected"}
        since = session.data.get(UNRESPONSIVE)
        if since is None:
            return {"liveness": "ok"}
        quiet = asyncio.get_running_loop().time() - since
        return {"liveness": "unresponsive", "unresponsive_s": round(quiet, 1)}

    def unresponsive(self, session: Session) -> str | None:
        """Why ``session`` counts as alive but not progressing, or None."""
        since = session.data.get(UNRESPONSIVE)
        if since is None:
            return None
        quiet = asyncio.get_running_loop().time() - since
        return f"is unresponsive: its process heartbeats but its event loop has not answered for {quiet:.0f}s"

    # -- in-flight reports ---------------------------------------------------------------
    def on_ping(self, session: Session, body: dict[str, Any]) -> dict[str, Any] | None:
        """A heartbeat thread's PING: keep the in-flight report it carries for its main
        connection; when the rank has waited a while, answer with the stuck waits of the
        ranks it waits for (what its slow-operation warnings and timeouts can name)."""
        main = session.data.get(LEASE_OF)
        if main is None or "ops" not in body:
            return None
        now = asyncio.get_running_loop().time()
        report = arrivals.parse(body["ops"], now)
        if report is None:
            return None
        main.data[REPORT] = arrivals.follow(main.data.get(REPORT), report)
        if not any(row.waiting_world and (row.idle or 0.0) >= CHAIN_AFTER for row in report.ops):
            return None
        if self._chain_index is None or now - self._chain_index[0] > CHAIN_INDEX_AGE:
            self._chain_index = (now, arrivals.index(self.reports()))
        stale = 2 * self.timeout() / LEASE_BEATS
        return arrivals.chain_answer(self._chain_index[1], report, self.limits.stuck_after_s, now, stale)

    def reports(self) -> list[arrivals.Report]:
        """Every connected rank's latest in-flight report (its ``seen`` brought up to date)."""
        reports = []
        for session in self.sessions():
            report: arrivals.Report | None = session.data.get(REPORT)
            if report is None:
                continue
            holder: Session | None = session.data.get(LEASE_KEY)
            report.seen = report.at if holder is None else holder.last_seen
            reports.append(report)
        return reports

    def board(self) -> list[dict[str, Any]]:
        """The arrival board of every operation some connected rank is in (hang explainer)."""
        stale = 2 * self.timeout() / LEASE_BEATS
        now = asyncio.get_running_loop().time()
        return arrivals.build(self.reports(), now, stale, self.limits.stuck_after_s)


def declared_beat(beat: Any) -> float | None:
    """A session's declared heartbeat interval in seconds, or None (it does not heartbeat)."""
    if not isinstance(beat, (int, float)) or isinstance(beat, bool) or not beat > 0:
        return None  # plain RPC clients that do not heartbeat are never reaped
    if isinstance(beat, int) and beat.bit_length() > 64:
        return 1e18  # (float() of a huge int overflows) effectively never
    return max(float(beat), 0.02)
