"""Jobs survive a coordinator restart (netcoll.service.journal): queued jobs, inline
inputs included, come back queued and run; a job running at a crash ends failed with
a reason; finished records stay queryable within the retention bound; ids are never
reused; an unusable state dir is a clear error (exit 2 from the CLI).

A crash is simulated by copying the state dir while the first coordinator still
runs (after its writes are flushed), as SIGKILL would leave it, and starting the
second coordinator from the copy. Loopback only; temp dirs from tmp_path."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from netcoll.ops import reduce_reference
from netcoll.service.journal import DB_NAME, SCHEMA_VERSION, Journal, JournalError
from tests.service.test_queue import service, until

pytestmark = pytest.mark.tcp


async def crash_copy(journal: Journal, dest: Path) -> Path:
    """The state dir as a crash at this moment leaves it (no orderly close)."""
    await journal.flush()
    shutil.copytree(journal.directory, dest, ignore=shutil.ignore_patterns("*-shm", "lock"))
    return dest


async def test_queued_jobs_with_inline_inputs_run_after_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    xs = [np.arange(12, dtype=np.float64).reshape(3, 4) * (r + 1) for r in range(2)]
    mat = np.arange(8, dtype=np.int32).reshape(2, 4)
    async with service(0, Journal.open(state)) as (_, client):  # no ranks: everything waits
        reduce_id = await client.submit("all_reduce", inputs=xs, reduce_op="max")
        bcast_id = await client.submit("broadcast", inputs=xs[1], root=1, world_size=2)
        scatter_id = await client.submit("scatter", inputs=mat, world_size=2)
        gen_id = await client.submit("all_gather", size="8KiB", dtype="int64", world_size=2)
        assert (await client.job(reduce_id))["state"] == "queued"
    assert any((state / "inputs").iterdir()), "inline arrays are kept in the state dir"
    async with service(2, Journal.open(state)) as (_, client):
        rec = await client.wait(reduce_id, timeout=30)
        assert rec["state"] == "succeeded", rec
        np.testing.assert_array_equal(rec["result"], reduce_reference("max", xs))
        rec = await client.wait(bcast_id, timeout=30)
        assert rec["state"] == "succeeded" and rec["spec"]["root"] == 1
        np.testing.assert_array_equal(rec["result"], xs[1])
        rec = await client.wait(scatter_id, timeout=30)
        for r in range(2):
            np.testing.assert_array_equal(rec["result"][r], mat[r])
        rec = await client.wait(gen_id, timeout=30)
        assert rec["state"] == "succeeded" and rec["verified"] is True
        assert await client.submit("barrier") == gen_id + 1  # ids continue
    assert not any((state / "inputs").iterdir()), "inputs are dropped once their job ends"


async def test_crash_running_job_fails_queued_runs_records_stay(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "state")
    async with service(2, journal) as (_, client):
        done = await client.run("all_reduce", size="4KiB", timeout=20)
        assert done["state"] == "succeeded"
        long = await client.submit("all_reduce", size="1MiB", iters=100_000)
        queued = await client.submit("all_reduce", inputs=[np.full(5, 2.0), np.full(5, 3.0)])
        await until(lambda: _state_is(client, long, "running"))
        snapshot = await crash_copy(journal, tmp_path / "crashed")
        await client.cancel(long)
    async with service(2, Journal.open(snapshot)) as (_, client):
        rec = await client.job(long)
        assert rec["state"] == "failed"
        assert "coordinator stopped while this job was running" in rec["error"], rec["error"]
        rec = await client.wait(queued, timeout=30)
        assert rec["state"] == "succeeded" and rec["result"].tolist() == [5.0] * 5
        old = await client.job(done["id"])
        assert old["state"] == "succeeded" and old["verified"] is True and old["busbw"] == done["busbw"]
        assert old["timings"] == done["timings"] and old["ranks"] == done["ranks"]
        waited = await client.wait(done["id"], timeout=5)  # the record; its arrays are not kept
        assert waited["state"] == "succeeded" and waited["result"] is None and waited["results_expired"]
        assert {j["id"] for j in (await client.status())["jobs"]} >= {done["id"], long, queued}
        assert await client.submit("barrier") == queued + 1


async def _state_is(client: object, jid: int, state: str) -> bool:
    return bool((await client.job(jid))["state"] == state)  # type: ignore[attr-defined]


async def test_graceful_stop_fails_the_running_job_and_keeps_the_queue(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with service(2, Journal.open(state)) as (c, client):
        long = await client.submit("all_reduce", size="1MiB", iters=100_000)
        await until(lambda: _state_is(client, long, "running"))
        behind = await client.submit("barrier", world_size=2)
        await c.svc.close()  # what SIGTERM does (serve_coordinator): the service, then the listener
        await c.coord.close()
    async with service(2, Journal.open(state)) as (_, client):
        rec = await client.job(long)
        assert rec["state"] == "failed" and "shut down" in rec["error"]
        assert (await client.wait(behind, timeout=30))["state"] == "succeeded"


async def test_retention_keeps_the_last_n_finished_and_ids_are_never_reused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with service(1, Journal.open(state), history=3) as (_, client):
        ids = [(await client.run("barrier", timeout=20))["id"] for _ in range(5)]
        assert ids == [1, 2, 3, 4, 5]
    with contextlib.closing(sqlite3.connect(state / DB_NAME)) as db:
        assert [r[0] for r in db.execute("SELECT id FROM jobs ORDER BY id")] == [3, 4, 5]
    async with service(1, Journal.open(state), history=3) as (_, client):
        for gone in ids[:2]:
            with pytest.raises(KeyError):
                await client.job(gone)
        assert [(await client.job(i))["state"] for i in ids[2:]] == ["succeeded"] * 3
        assert (await client.run("barrier", timeout=20))["id"] == 6
    async with service(1, Journal.open(state), history=0) as (_, client):  # keep no finished job ...
        assert (await client.status())["jobs"] == []
        assert (await client.run("barrier", timeout=20))["id"] == 7
    with contextlib.closing(sqlite3.connect(state / DB_NAME)) as db:
        assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    async with service(1, Journal.open(state)) as (_, client):
        assert await client.submit("barrier") == 8  # ... and still no id comes back


def test_corrupt_or_unusable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / DB_NAME).write_bytes(b"this is not an SQLite database " * 100)
    with pytest.raises(JournalError, match="is not a readable netcoll journal"):
        Journal.open(bad)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(JournalError, match="cannot be used"):
        Journal.open(afile)
    newer = tmp_path / "newer"
    Journal.open(newer).close()
    with contextlib.closing(sqlite3.connect(newer / DB_NAME)) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(JournalError, match="written by a newer netcoll"):
        Journal.open(newer)
    used = Journal.open(tmp_path / "used")
    try:
        with pytest.raises(JournalError, match="in use by another coordinator"):
            Journal.open(tmp_path / "used")
    finally:
        used.close()
    Journal.open(tmp_path / "used").close()  # released on close


def test_coordinator_cli_exits_2_on_a_corrupt_state_dir(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / DB_NAME).write_bytes(b"\x00garbage" * 1000)
    proc = subprocess.run(
        [sys.executable, "-m", "netcoll", "coordinator", "--port", "0", "--http-port", "off", "--state-dir", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "netcoll coordinator: state dir" in proc.stderr and "not a readable netcoll journal" in proc.stderr
    assert "Traceback" not in proc.stderr


async def test_state_dir_from_the_environment(tmp_path: Path) -> None:
    from netcoll.config import CoordinatorConfig

    cfg = CoordinatorConfig.load({}, {"NETCOLL_STATE_DIR": str(tmp_path), "NETCOLL_KEEP_JOBS": "7"})
    assert cfg.state_dir == str(tmp_path) and cfg.keep_jobs == 7
    assert CoordinatorConfig.load({}, {}).state_dir is None


async def test_journal_writes_do_not_run_on_the_event_loop(tmp_path: Path) -> None:
    """Every database write happens on the journal's writer thread."""
    import threading

    journal = Journal.open(tmp_path / "state")
    seen: list[str] = []
    real = journal.write_submit

    def spy(*args: object) -> None:
        seen.append(threading.current_thread().name)
        real(*args)  # type: ignore[arg-type]

    journal.write_submit = spy  # type: ignore[method-assign]
    async with service(1, journal) as (_, client):
        assert (await client.run("barrier", timeout=20))["state"] == "succeeded"
    assert seen and all(name.startswith("netcoll-journal") for name in seen), seen
