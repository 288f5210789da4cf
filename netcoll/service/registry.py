"""The daemon registry: which rank daemons are registered, which are ready, and the
epoch they run under; no sockets.

Rank daemons register (``daemon_register``) over their rendezvous connection; the
address a daemon is *seen* from is what its peers dial, unless it advertises another
(never a loopback address seen from elsewhere, and a cluster never mixes loopback and
routable addresses). A draining daemon takes no new job.

Before each job the service takes the current membership; if it differs from the
last job's (a daemon joined, left, died, or the last job failed: :meth:`Registry.relink`),
a new *epoch* starts under a new session id, and the daemons link up afresh.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from ..escape import escape
from ..rendezvous.groups import is_loopback
from ..rpc import Session
from .records import Daemon, Job

log = logging.getLogger("netcoll.service")

DAEMON_KEY = "daemon"  # Session.data[...] -> the member id the connection registered


def is_port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536


class Registry:
    """The registered rank daemons by member id, and the current epoch."""

    def __init__(self) -> None:
        self.members: dict[str, Daemon] = {}
        self.epoch = 0
        self.session = ""  # the current epoch's session id
        self.epoch_members: tuple[str, ...] | None = None  # by rank, in the current epoch

    def ready(self) -> list[Daemon]:
        """The members that take jobs: connected and not draining."""
        return [m for m in self.members.values() if not m.draining and m.session.proto.lost is None]

    def register(self, session: Session, params: dict[str, Any]) -> Daemon:
        """Register the daemon ``params`` describe on ``session`` (ValueError when it cannot be)."""
        member_id, port, http_port = params.get("member_id"), params.get("listen_port"), params.get("http_port")
        hint, advertise = params.get("rank_hint"), params.get("advertise_host")
        if not isinstance(member_id, str) or not member_id or len(member_id) > 200:
            raise ValueError("member_id must be a non-empty string")
        if not isinstance(port, int) or not is_port(port):
            raise ValueError(f"listen_port must be a TCP port, got {port!r}")
        if http_port is not None and not is_port(http_port):
            raise ValueError(f"http_port must be a TCP port or None, got {http_port!r}")
        if hint is not None and (not isinstance(hint, int) or isinstance(hint, bool) or hint < 0):
            raise ValueError(f"rank_hint must be a non-negative int, got {hint!r}")
        seen = session.peer[0]
        host = advertise if isinstance(advertise, str) and advertise else seen
        if is_loopback(host) and not is_loopback(seen):
            raise ValueError(
                f"daemon {member_id} advertises {host}, but it connects from {seen}: peers on "
                "other hosts cannot reach a loopback address (drop --advertise-host)"
            )
        others = [m for m in self.members.values() if m.member_id != member_id]
        if others and is_loopback(host) != is_loopback(others[0].host):
            raise ValueError(
                f"daemon {member_id} at {host} cannot join daemons at {others[0].host}: "
                "a cluster cannot mix loopback and routable addresses (in a container, "
                "127.0.0.1 is the container itself)"
            )
        old = self.members.get(member_id)
        if old is not None and old.session is not session and old.session.proto.lost is None:
            raise ValueError(f"member id {member_id!r} is already registered from {old.host}:{old.port}")
        member = self.members[member_id] = Daemon(member_id, session, host, port, hint, http_port=http_port)
        session.data[DAEMON_KEY] = member_id
        log.info(
            "daemon %s registered at %s:%d (HTTP port %s, hint %s)",
            escape(member_id),
            escape(host),
            port,
            http_port or "off",
            escape(hint),
        )
        return member

    def drain(self, session: Session) -> bool:
        """The daemon on ``session`` takes no new job; whether there is one."""
        member = self.members.get(session.data.get(DAEMON_KEY, ""))
        if member is not None:
            member.draining = True
        return member is not None

    def remove(self, session: Session) -> Daemon | None:
        """``session`` closed: unregister its daemon (returned), if it is the registered one."""
        member_id = session.data.get(DAEMON_KEY)
        member = self.members.get(member_id) if isinstance(member_id, str) else None
        if member is None or member.session is not session:
            return None
        del self.members[member.member_id]
        reason = session.data.get("drop_reason", "connection closed")
        log.log(
            logging.INFO if member.draining else logging.WARNING,
            "daemon %s left: %s",
            member.describe(),
            "drained" if member.draining else escape(reason),
        )
        return member

    def daemon(self, session: Session) -> str | None:
        """The member id ``session`` registered, if any."""
        member_id = session.data.get(DAEMON_KEY)
        return member_id if isinstance(member_id, str) else None

    def unresponsive(self, job: Job, ranks: list[int], why: Callable[[Session], str | None]) -> list[str]:
        """Those of ``ranks`` of ``job`` seen alive but not progressing (``why(session)``), named."""
        out = []
        for r in ranks:
            member = self.members.get(job.members.get(r, ""))
            reason = None if member is None else why(member.session)
            if member is not None and reason:
                out.append(f"rank {r} ({member.describe()}) {reason}")
        return out

    # -- epochs ----------------------------------------------------------------------------
    def begin(self, members: list[Daemon]) -> None:
        """A job runs on ``members`` (by rank): a new epoch unless they are the last job's."""
        ids = tuple(m.member_id for m in members)
        if ids != self.epoch_members:
            self.epoch += 1
            self.session = secrets.token_hex(8)
            self.epoch_members = ids
            log.info("epoch %d: %d ranks: %s", self.epoch, len(ids), ", ".join(m.describe() for m in members))

    def relink(self) -> None:
        """The next job starts a new epoch even on the same members (links may be broken)."""
        self.epoch_members = None

    def rows(self, job: Job | None) -> list[dict[str, Any]]:
        """The members as ``members`` and ``status`` show them (``job``: the running one)."""
        ranks = {mid: r for r, mid in enumerate(self.epoch_members or ())}
        rows = []
        for m in sorted(self.members.values(), key=lambda m: (ranks.get(m.member_id, 1 << 30), m.member_id)):
            busy_job = job if job is not None and m.member_id in job.rank_of else None
            rows.append(
                {
                    "member_id": m.member_id,
                    "rank": ranks.get(m.member_id),
                    "address": f"{m.host}:{m.port}",
                    "host": m.host,
                    "port": m.port,
                    "http_port": m.http_port,
                    "rank_hint": m.rank_hint,
                    "epoch": self.epoch,
                    "state": "draining" if m.draining else ("busy" if busy_job else "ready"),
                    "current_job": busy_job.id if busy_job else None,
                    "registered_for_s": round(time.time() - m.since, 1),
                }
            )
        return rows
