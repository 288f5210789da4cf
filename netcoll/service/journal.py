"""The coordinator's job journal: jobs survive a coordinator restart.

``netcoll coordinator --state-dir DIR`` (or ``NETCOLL_STATE_DIR``) keeps, in
``DIR/jobs.sqlite3`` (SQLite, WAL mode, ``synchronous=FULL``):

- every job from its submission (its spec and, for inline data, the arrays the
  client sent: one file per array under ``DIR/inputs/<job id>/``, so no blob is
  bound by SQLite's 1 GB row limit and none sits in the database's page cache),
- each state change (``queued -> running -> succeeded | failed | cancelled``),
- the final record of each finished job (the last ``keep`` of them),
- the id sequence (``meta.next_id``): ids are never reused.

Schema version 1 (``PRAGMA user_version``)::

    meta(key TEXT PRIMARY KEY, value INTEGER)        -- next_id
    jobs(id INTEGER PRIMARY KEY, state TEXT, spec TEXT (JSON), inputs TEXT (JSON: mode +
         array metas, NULL without inline data), submitted_at REAL, started_at REAL,
         finished_at REAL, record TEXT (JSON, the final record; NULL until finished))

Durability: a submit is acknowledged to the client only after its row (and its
input files, fsynced) is committed; ``synchronous=FULL`` makes that commit
survive a power loss too, so an acknowledged job or id is never lost. State
changes after the submit are written in order by one writer thread (the event
loop never waits on a disk sync); a crash can lose the last of them, which
recovery treats as the job still running: it ends ``failed`` with a reason.

All database access after :meth:`Journal.open` / :meth:`Journal.load` (both at
startup, before the service runs) happens on the writer thread, in small
transactions. A directory that cannot be used (not a directory, not writable,
not a netcoll journal, a newer schema, locked by another coordinator) is a
:class:`JournalError` with one line for the operator.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger("netcoll.journal")

SCHEMA_VERSION = 1
DB_NAME = "jobs.sqlite3"
LOCK_NAME = "lock"
INPUTS_DIR = "inputs"
DONE_STATES = ("succeeded", "failed", "cancelled")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    state TEXT NOT NULL,
    spec TEXT NOT NULL,
    inputs TEXT,
    submitted_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    record TEXT
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, id);
INSERT OR IGNORE INTO meta (key, value) VALUES ('next_id', 1);
"""

T = TypeVar("T")


class JournalError(Exception):
    """The state directory cannot be used; ``str()`` is one line for the operator."""


@dataclass
class StoredJob:
    """A job row as read back at startup."""

    id: int
    state: str
    spec: dict[str, Any]
    submitted_at: float
    started_at: float | None = None
    inputs: dict[str, Any] | None = None
    blobs: list[bytes] | None = None
    record: dict[str, Any] | None = None
    #: why this job cannot be restored as it was (its input files are gone...), else None
    problem: str | None = None


@dataclass
class Recovered:
    """What the journal held at startup."""

    next_id: int
    jobs: list[StoredJob] = field(default_factory=list)


class Journal:
    """One coordinator's journal in ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path, conn: sqlite3.Connection, lock_fd: int) -> None:
        self.directory = directory
        self.inputs_dir = directory / INPUTS_DIR
        self._conn = conn
        self._lock_fd = lock_fd
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="netcoll-journal")
        self._closed = False
        self.write_errors = 0

    # -- startup (synchronous, before the service runs) ------------------------------------------
    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> Journal:
        """Open (creating or migrating) the journal in ``directory``; JournalError if unusable."""
        path = Path(directory).expanduser()
        where = f"state dir {str(path)!r}"
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)  # job inputs are the users' data
            (path / INPUTS_DIR).mkdir(mode=0o700, exist_ok=True)
            lock_fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise JournalError(f"{where} cannot be used: {exc.strerror or exc}") from None
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock_fd)
            raise JournalError(f"{where} is in use by another coordinator (one coordinator per state dir)") from None
        try:
            conn = _connect(path / DB_NAME, where)
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(path, conn, lock_fd)

    def load(self) -> Recovered:
        """Every job row (in id order) and the id sequence; input arrays of queued jobs read back."""
        try:
            (next_id,) = self._conn.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()
            rows = self._conn.execute(
                "SELECT id, state, spec, inputs, submitted_at, started_at, record FROM jobs ORDER BY id"
            ).fetchall()
        except (sqlite3.Error, TypeError) as exc:
            raise JournalError(f"state dir {str(self.directory)!r}: the journal cannot be read: {exc}") from None
        out = Recovered(next_id=int(next_id))
        for jid, state, spec, inputs, submitted_at, started_at, record in rows:
            job = StoredJob(int(jid), str(state), {}, float(submitted_at), started_at)
            try:
                job.spec = json.loads(spec)
                job.inputs = json.loads(inputs) if inputs else None
                job.record = json.loads(record) if record else None
            except (TypeError, ValueError) as exc:
                job.problem = f"its journal entry is damaged ({exc})"
            if job.state == "queued" and job.inputs is not None and job.problem is None:
                job.blobs, job.problem = self._read_inputs(job.id, job.inputs)
            out.jobs.append(job)
            out.next_id = max(out.next_id, job.id + 1)
        self._drop_orphan_inputs({j.id for j in out.jobs if j.state == "queued"})
        return out

    def _read_inputs(self, job_id: int, inputs: dict[str, Any]) -> tuple[list[bytes] | None, str | None]:
        blobs = []
        try:
            for i, meta in enumerate(inputs.get("arrays") or []):
                data = (self.inputs_dir / str(job_id) / str(i)).read_bytes()
                if len(data) != meta.get("nbytes"):
                    return None, f"its input array {i} in the state dir has {len(data)} bytes, not {meta.get('nbytes')}"
                blobs.append(data)
        except (OSError, AttributeError) as exc:
            return None, f"its input arrays could not be read back from the state dir ({exc})"
        return blobs, None

    def _drop_orphan_inputs(self, keep: set[int]) -> None:
        """Input files of jobs that are no longer queued (or were never acknowledged)."""
        for entry in self.inputs_dir.iterdir():
            if not (entry.name.isdigit() and int(entry.name) in keep):
                shutil.rmtree(entry, ignore_errors=True)

    # -- the writer thread ----------------------------------------------------------------------
    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the writer thread, after every write posted before; its result."""
        return await asyncio.wrap_future(self._writer.submit(fn, *args))

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` on the writer thread (in order); a failure is logged, not raised."""
        if self._closed:
            log.warning("journal closed: %s not written", getattr(fn, "__name__", fn))
            return
        self._writer.submit(self._logged, fn, *args)

    def _logged(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # the service runs on; the operator sees the log
            self.write_errors += 1
            log.exception("journal write failed (%s)", getattr(fn, "__name__", fn))

    async def flush(self) -> None:
        """Wait until every write posted so far is committed."""
        if not self._closed:
            await self.call(lambda: None)

    def close(self) -> None:
        """Finish the posted writes, then close the database and release the directory."""
        if self._closed:
            return
        self._closed = True
        self._writer.shutdown(wait=True)
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)

    # -- writes (each runs on the writer thread; one small transaction) ---------------------------
    def write_submit(
        self,
        job_id: int,
        spec: dict[str, Any],
        submitted_at: float,
        inputs: dict[str, Any] | None,
        blobs: list[bytes] | None,
    ) -> None:
        """A new queued job: its input files (fsynced), then its row and the id sequence."""
        if blobs:
            folder = self.inputs_dir / str(job_id)
            folder.mkdir(mode=0o700, exist_ok=True)
            for i, blob in enumerate(blobs):
                _write_synced(folder / str(i), blob)
            _sync_dir(folder)
            _sync_dir(self.inputs_dir)
        with self._conn:
            self._conn.execute(
                "INSERT OR REPLACE INTO jobs (id, state, spec, inputs, submitted_at) VALUES (?, 'queued', ?, ?, ?)",
                (job_id, json.dumps(spec), None if inputs is None else json.dumps(inputs), submitted_at),
            )
            self._conn.execute("UPDATE meta SET value = max(value, ?) WHERE key = 'next_id'", (job_id + 1,))

    def write_start(self, job_id: int, started_at: float) -> None:
        with self._conn:
            self._conn.execute("UPDATE jobs SET state = 'running', started_at = ? WHERE id = ?", (started_at, job_id))

    def write_finish(self, job_id: int, state: str, record: dict[str, Any], keep: int) -> None:
        """The final record; then the inputs go, and finished jobs beyond the last ``keep``."""
        with self._conn:
            self._conn.execute(
                "UPDATE jobs SET state = ?, finished_at = ?, record = ? WHERE id = ?",
                (state, record.get("finished_at"), json.dumps(record, default=str), job_id),
            )
            self._conn.execute(
                "DELETE FROM jobs WHERE state IN (?, ?, ?) AND id NOT IN "
                "(SELECT id FROM jobs WHERE state IN (?, ?, ?) ORDER BY id DESC LIMIT ?)",
                (*DONE_STATES, *DONE_STATES, max(keep, 0)),
            )
        shutil.rmtree(self.inputs_dir / str(job_id), ignore_errors=True)


def _connect(db: Path, where: str) -> sqlite3.Connection:
    """Open, check and migrate the database (JournalError with one line if it is unusable)."""
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False, timeout=5.0)
        conn.isolation_level = "DEFERRED"  # `with conn:` = one transaction
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise JournalError(
                f"{where}: {db.name} has schema version {version}, written by a newer netcoll "
                f"(this one reads version {SCHEMA_VERSION}); upgrade, or use another state dir"
            )
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(f"integrity check: {check}")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise JournalError(f"{where}: SQLite cannot use WAL mode there (got {mode}); use a local filesystem")
        conn.execute("PRAGMA synchronous=FULL")
        if version < SCHEMA_VERSION:
            _migrate(conn, version)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"meta", "jobs"} <= tables:
            raise sqlite3.DatabaseError("tables meta/jobs are missing")
        return conn
    except JournalError:
        if conn is not None:
            conn.close()
        raise
    except (sqlite3.Error, OSError) as exc:
        if conn is not None:
            conn.close()
        raise JournalError(
            f"{where}: {db.name} is not a readable netcoll journal ({exc}); "
            "restore it from a backup, or move the state dir aside to start with no jobs"
        ) from None


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    """From ``version`` (0 = a new database) to SCHEMA_VERSION, in one transaction."""
    if version == 0:
        conn.executescript("BEGIN;" + _SCHEMA + f"PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["SCHEMA_VERSION", "Journal", "JournalError", "Recovered", "StoredJob"]
