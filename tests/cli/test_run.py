"""``netcoll run``: the launcher (normal run, a crashing rank, signals, two "nodes"
on 127.0.0.x loopback addresses, the environment the ranks get)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from netcoll.cli.run import free_port
from tests.support import REPO

pytestmark = [
    pytest.mark.tcp,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="127.0.0.x addresses (Linux loopback)"),
]

ENV_NAMES = (
    "NETCOLL_COORDINATOR",
    "NETCOLL_WORLD_SIZE",
    "NETCOLL_RANK",
    "NETCOLL_TOKEN",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)

# Each rank reports its environment and an all_reduce as one JSON line.
REPORT = textwrap.dedent(
    f"""
    import json, os, sys
    import numpy as np
    import netcoll.sync

    with netcoll.sync.connect() as comm:
        total = comm.all_reduce(np.array([comm.rank + 1]))
        env = {{k: os.environ.get(k) for k in {ENV_NAMES!r}}}
        host = comm.communicator.transport.listener.address[0]
        print(json.dumps({{"rank": comm.rank, "total": int(total[0]), "env": env, "host": host, "argv": sys.argv[1:]}}))
    """
)


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
    out["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    out.update(extra)
    return out


def launcher(*args: str, cwd: Path | None = None, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "netcoll", "run", *args],
        env=env(**extra),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def reports(out: str) -> dict[int, dict[str, object]]:
    found = {}
    for line in out.splitlines():
        m = re.fullmatch(r"\[rank (\d+)\] (\{.*\})", line)
        assert m, f"unprefixed or broken line: {line!r}"
        doc = json.loads(m.group(2))
        assert doc["rank"] == int(m.group(1))
        found[doc["rank"]] = doc
    return found


def test_run_sets_the_environment_and_prefixes_output(tmp_path: Path) -> None:
    (tmp_path / "report_mod.py").write_text(REPORT)
    proc = launcher("-n", "3", "-m", "report_mod", "--flag", "x", cwd=tmp_path)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    got = reports(out)
    assert sorted(got) == [0, 1, 2]
    ports = set()
    for r, doc in got.items():
        e = doc["env"]
        assert isinstance(e, dict)
        assert doc["total"] == 6 and doc["argv"] == ["--flag", "x"]
        assert (e["NETCOLL_RANK"], e["RANK"], e["LOCAL_RANK"]) == (str(r),) * 3
        assert (e["NETCOLL_WORLD_SIZE"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) == (
            "3",
            "3",
            "3",
            "0",
        )
        assert re.fullmatch(r"127\.0\.0\.1:\d+", str(e["NETCOLL_COORDINATOR"]))
        assert e["MASTER_ADDR"] == "127.0.0.1" and int(str(e["MASTER_PORT"])) > 0
        assert e["NETCOLL_TOKEN"] and len(str(e["NETCOLL_TOKEN"])) >= 24  # a fresh member token
        ports.add(e["MASTER_PORT"])
    assert len(ports) == 1


CRASH = textwrap.dedent(
    """
    import os, signal, sys, time
    import numpy as np
    import netcoll
    import netcoll.sync

    with netcoll.sync.connect() as comm:
        comm.barrier()
        print("ready", flush=True)
        try:  # once rank 1 leaves this, every rank has printed (a barrier's end is not simultaneous)
            comm.barrier()
        except netcoll.CollectiveError:  # rank 1 died while we were still in it: fine
            pass
        if comm.rank == 1:
            if sys.argv[1] == "raise":
                raise RuntimeError("rank 1 breaks")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)  # until the launcher stops us
    """
)


@pytest.mark.parametrize(
    ("how", "status", "says"),
    [("raise", 1, "rank 1 failed: RuntimeError: rank 1 breaks"), ("kill", 137, "rank 1 was killed by SIGKILL")],
)
def test_a_failing_rank_stops_the_others(tmp_path: Path, how: str, status: int, says: str) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    proc = launcher("-n", "3", "--grace", "20", str(script), how)
    out, err = finish(proc)
    assert proc.returncode == status, err
    assert f"netcoll run: {says}; stopping the other 2 rank(s)" in err
    assert err.rstrip().endswith(f"netcoll run: {says}; exit status {status}"), err
    assert sorted(out.splitlines()) == ["[rank 0] ready", "[rank 1] ready", "[rank 2] ready"]
    if how == "raise":
        assert "[rank 1] Traceback (most recent call last):" in err
        assert "[rank 1] RuntimeError: rank 1 breaks" in err
    assert all(line.startswith(("[rank ", "netcoll run: ")) for line in err.splitlines()), err


WAIT = textwrap.dedent(
    """
    import signal, sys, time
    import netcoll.sync

    if sys.argv[1] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with netcoll.sync.connect() as comm:
        comm.barrier()
        try:
            print("ready", flush=True)
            time.sleep(120)  # (not in a collective: a peer that leaves first cannot end it; see tests/sync)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise
    """
)


@pytest.mark.parametrize(
    ("sig", "mode", "status"),
    [(signal.SIGINT, "polite", 130), (signal.SIGTERM, "polite", 143), (signal.SIGTERM, "stubborn", 143)],
)
def test_signals_to_the_launcher_reach_every_rank(tmp_path: Path, sig: int, mode: str, status: int) -> None:
    script = tmp_path / "wait.py"
    script.write_text(WAIT)
    proc = launcher("-n", "2", "--grace", "1" if mode == "stubborn" else "20", str(script), mode)
    assert proc.stdout is not None
    assert sorted(proc.stdout.readline().strip() for _ in range(2)) == ["[rank 0] ready", "[rank 1] ready"]
    proc.send_signal(sig)
    out, err = finish(proc)
    assert proc.returncode == status, err
    assert f"netcoll run: got {signal.Signals(sig).name}; passing it to the ranks" in err
    if sig == signal.SIGINT:  # Ctrl-C reaches every rank as a KeyboardInterrupt
        assert sorted(out.splitlines()) == ["[rank 0] interrupted", "[rank 1] interrupted"]


def test_two_nodes_on_loopback_addresses(tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    coordinator = f"127.0.0.2:{free_port('127.0.0.2')}"
    token = "run-test-token-0123456789abcdef"
    common = ("-n", "2", "--nnodes", "2", "--coordinator", coordinator)
    node1 = launcher(*common, "--node-rank", "1", "--local-addr", "127.0.0.3", str(script), NETCOLL_TOKEN=token)
    node0 = launcher(*common, "--node-rank", "0", "--local-addr", "127.0.0.2", str(script), NETCOLL_TOKEN=token)
    out0, err0 = finish(node0)
    out1, err1 = finish(node1)
    assert node0.returncode == 0 and node1.returncode == 0, err0 + err1
    got = {**reports(out0), **reports(out1)}
    assert sorted(reports(out0)) == [0, 1] and sorted(reports(out1)) == [2, 3]
    for r, doc in got.items():
        e = doc["env"]
        assert isinstance(e, dict)
        assert doc["total"] == 10
        assert doc["host"] == ("127.0.0.2" if r < 2 else "127.0.0.3")
        assert (e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) == (str(r), str(r % 2), str(r // 2))
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) == ("4", "2")
        assert (e["NETCOLL_COORDINATOR"], e["NETCOLL_TOKEN"], e["MASTER_ADDR"]) == (coordinator, token, "127.0.0.2")
    assert len({doc["env"]["MASTER_PORT"] for doc in got.values()}) == 1  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("-n", "0", "x.py"), "at least 1"),
        (("-n", "2", "--nnodes", "2", "x.py"), "--coordinator"),
        (("-n", "2", "--nnodes", "2", "--node-rank", "2", "--coordinator", "127.0.0.1:1", "x.py"), "--node-rank"),
        (("-n", "1", "--nnodes", "2", "--coordinator", "127.0.0.1:1", "x.py"), "NETCOLL_TOKEN"),
        (("-n", "1", "-m", "--no-python", "x"), "-m and --no-python"),
    ],
)
def test_bad_flags_exit_2(args: tuple[str, ...], says: str) -> None:
    proc = launcher(*args)
    out, err = finish(proc)
    assert proc.returncode == 2 and says in err and out == "", err


def test_no_python_programs_and_a_program_that_cannot_start() -> None:
    script = 'echo "rank $RANK of $WORLD_SIZE"; [ "$RANK" = 1 ] && exit 3; sleep 120'
    proc = launcher("-n", "2", "--no-python", "sh", "-c", script)
    out, err = finish(proc)
    assert proc.returncode == 3, err
    assert sorted(out.splitlines()) == ["[rank 0] rank 0 of 2", "[rank 1] rank 1 of 2"]
    assert "netcoll run: rank 1 exited with status 3; stopping the other 1 rank(s)" in err
    proc = launcher("-n", "2", "--no-python", "/nonexistent/program")
    out, err = finish(proc)
    assert proc.returncode == 127 and out == ""
    assert err.splitlines()[0].startswith("netcoll run: coordinator 127.0.0.1:")  # where it was, then why it stopped
    assert err.splitlines()[1].startswith("netcoll run: cannot start rank 0: ") and "/nonexistent/program" in err


NODE_CRASH = textwrap.dedent(
    """
    import numpy as np
    import netcoll.sync

    with netcoll.sync.connect() as comm:
        comm.barrier()
        if comm.rank == 3:
            raise RuntimeError("rank 3 breaks")
        comm.all_reduce(np.ones(3))  # never completes: rank 3 is gone
    """
)


def test_a_failing_rank_on_one_node_stops_both_nodes(tmp_path: Path) -> None:
    script = tmp_path / "node_crash.py"
    script.write_text(NODE_CRASH)
    coordinator = f"127.0.0.2:{free_port('127.0.0.2')}"
    common = ("-n", "2", "--nnodes", "2", "--coordinator", coordinator)
    token = "run-test-token-fedcba9876543210"
    node0 = launcher(*common, "--node-rank", "0", "--local-addr", "127.0.0.2", str(script), NETCOLL_TOKEN=token)
    node1 = launcher(*common, "--node-rank", "1", "--local-addr", "127.0.0.3", str(script), NETCOLL_TOKEN=token)
    _, err0 = finish(node0)
    _, err1 = finish(node1)
    assert node0.returncode == 1 and node1.returncode == 1, err0 + err1
    assert "[rank 3] RuntimeError: rank 3 breaks" in err1
    assert "PeerLost" in err0 or "CollectiveAborted" in err0  # node 0's ranks learnt of it
    assert "not every node finished" not in err0 + err1  # the nodes still met at the end


CAUSE = textwrap.dedent(
    """
    import sys
    import netcoll.sync

    with netcoll.sync.connect() as comm:
        comm.barrier()
        if comm.rank == 1:
            sys.exit(7)  # leaves the group; the others' barrier fails (PeerLost), they exit 1
        comm.barrier()
    """
)


def test_the_rank_that_failed_first_sets_the_status(tmp_path: Path) -> None:
    """Whichever exits first, the rank whose failure caused the others' is named."""
    script = tmp_path / "cause.py"
    script.write_text(CAUSE)
    for _ in range(3):  # the exit order varies; the answer must not
        proc = launcher("-n", "3", str(script))
        _, err = finish(proc)
        assert proc.returncode == 7, err
        assert err.rstrip().endswith("netcoll run: rank 1 failed: SystemExit: 7; exit status 7"), err


def test_run_in_process_leaves_the_netcoll_logger_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``netcoll run`` sends the coordinator's warnings to stderr while it runs; called inside
    another program (here pytest, whose log capture hangs on the root logger) it must put the
    ``netcoll`` logger back: it left ``propagate=False``, and later tests' caplog saw nothing."""
    import logging

    from netcoll.cli import main

    script = tmp_path / "noop.py"
    script.write_text("import netcoll.sync\nnetcoll.sync.connect().close()\n")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    logger = logging.getLogger("netcoll")
    before = (logger.level, logger.propagate, list(logger.handlers))
    assert main(["run", "-n", "1", str(script)]) == 0
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
