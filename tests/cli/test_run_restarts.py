"""``netcoll run --max-restarts K`` and ``--nnodes MIN:MAX`` (issue 35 item 1): every local rank
started again after a failure with NETCOLL_RESTART_COUNT set, nodes restarting together, a group
of as many nodes as arrived. Process-level, on 127.0.0.x loopback addresses."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from netcoll.cli.run import Plan, free_port
from netcoll.cli.runnodes import Lobby
from netcoll.errors import RendezvousError
from tests.cli.test_run import finish, launcher

TOKEN = "restart-test-token-0123456789abcdef"

# Fails in the first attempt only (rank 1 raises); each rank prints its attempt and an all_reduce.
ONCE = textwrap.dedent(
    """
    import os, time
    import numpy as np
    import netcoll.sync

    attempt = int(os.environ["NETCOLL_RESTART_COUNT"])
    assert os.environ["TORCHELASTIC_RESTART_COUNT"] == str(attempt)
    with netcoll.sync.connect() as comm:
        comm.barrier()
        if attempt == 0 and comm.rank == int(os.environ.get("FAILING_RANK", "1")):
            raise RuntimeError("the first run breaks")
        if attempt == 0:
            time.sleep(60)  # until the launcher stops it: the launchers, not the ranks, notice the failure
        total = comm.all_reduce(np.array([comm.rank + 1]))
        print(f"attempt {attempt} world {comm.world_size} node {os.environ['GROUP_RANK']} total {int(total[0])}")
    """
)

ALWAYS = textwrap.dedent(
    """
    import sys
    import netcoll.sync

    with netcoll.sync.connect() as comm:
        comm.barrier()
        if comm.rank == 0:
            sys.exit(5)
        comm.barrier()
    """
)


def lines(out: str) -> list[str]:
    return sorted(out.splitlines())


def test_a_rank_failing_in_the_first_run_only_is_recovered(tmp_path: Path) -> None:
    script = tmp_path / "once.py"
    script.write_text(ONCE)
    proc = launcher("-n", "2", "--max-restarts", "1", str(script))
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert lines(out) == ["[rank 0] attempt 1 world 2 node 0 total 3", "[rank 1] attempt 1 world 2 node 0 total 3"]
    restarts = [line for line in err.splitlines() if line.startswith("netcoll run: restart ")]
    assert restarts == ["netcoll run: restart 1 of 1 after rank 1 failed: RuntimeError: the first run breaks"], err
    coordinators = re.findall(r"netcoll run: coordinator (\S+);", err)
    assert len(coordinators) == 2 and coordinators[0] != coordinators[1]  # a fresh one for the second attempt


def test_an_always_failing_run_exits_with_its_status_after_k_restarts(tmp_path: Path) -> None:
    script = tmp_path / "always.py"
    script.write_text(ALWAYS)
    proc = launcher("-n", "2", "--max-restarts", "2", str(script))
    _, err = finish(proc)
    assert proc.returncode == 5, err
    restarts = re.findall(r"netcoll run: restart (\d) of 2 after rank 0 failed: SystemExit: 5", err)
    assert restarts == ["1", "2"], err
    assert err.rstrip().endswith("netcoll run: no restart left (2 of 2 done); exit status 5"), err


def test_without_max_restarts_a_failure_ends_the_run(tmp_path: Path) -> None:
    script = tmp_path / "once.py"
    script.write_text(ONCE)
    proc = launcher("-n", "2", str(script))
    out, err = finish(proc)
    assert proc.returncode == 1, err
    assert "netcoll run: restart" not in err and out == ""
    assert err.rstrip().endswith("netcoll run: rank 1 failed: RuntimeError: the first run breaks; exit status 1"), err


WAIT = textwrap.dedent(
    """
    import time
    import netcoll.sync

    with netcoll.sync.connect() as comm:
        comm.barrier()
        print("ready", flush=True)
        time.sleep(120)
    """
)


def test_a_signal_to_the_launcher_never_restarts(tmp_path: Path) -> None:
    script = tmp_path / "wait.py"
    script.write_text(WAIT)
    proc = launcher("-n", "2", "--max-restarts", "3", str(script))
    assert proc.stdout is not None
    assert sorted(proc.stdout.readline().strip() for _ in range(2)) == ["[rank 0] ready", "[rank 1] ready"]
    proc.send_signal(signal.SIGINT)
    _, err = finish(proc)
    assert proc.returncode == 130, err
    assert "netcoll run: got SIGINT; passing it to the ranks" in err and "netcoll run: restart" not in err


def two_nodes(script: Path, *flags: str, ranks: bool = True) -> list[tuple[subprocess.Popen[str], str, str]]:
    """Two launchers as nodes 0 (127.0.0.2, which runs the coordinator) and 1 (127.0.0.3)."""
    coordinator = f"127.0.0.2:{free_port('127.0.0.2')}"
    common = ("-n", "2", "--coordinator", coordinator, *flags)
    node0 = launcher(
        *common, *(("--node-rank", "0") if ranks else ()), "--local-addr", "127.0.0.2", str(script), NETCOLL_TOKEN=TOKEN
    )
    procs = [node0]
    try:
        assert node0.stderr is not None
        assert node0.stderr.readline().startswith(f"netcoll run: coordinator {coordinator};")  # node 0 arrived first
        procs.append(
            launcher(
                *common,
                *(("--node-rank", "1") if ranks else ()),
                "--local-addr",
                "127.0.0.3",
                str(script),
                NETCOLL_TOKEN=TOKEN,
            )
        )
        return [(p, *finish(p)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_two_nodes_restart_together_when_a_rank_on_node_1_fails(tmp_path: Path) -> None:
    script = tmp_path / "once.py"
    script.write_text(ONCE.replace('os.environ.get("FAILING_RANK", "1")', '"3"'))
    (node0, out0, err0), (node1, out1, err1) = two_nodes(script, "--nnodes", "2", "--max-restarts", "1")
    assert node0.returncode == 0 and node1.returncode == 0, err0 + err1
    assert lines(out0) == [f"[rank {r}] attempt 1 world 4 node 0 total 10" for r in (0, 1)]
    assert lines(out1) == [f"[rank {r}] attempt 1 world 4 node 1 total 10" for r in (2, 3)]
    said = "restart 1 of 1 after rank 3 failed: RuntimeError: the first run breaks"
    assert f"netcoll run: {said} (on node 1)" in err0, err0
    assert f"netcoll run: {said}\n" in err1, err1


@pytest.mark.parametrize("nodes", [1, 2])
def test_nnodes_min_max_forms_the_group_with_the_nodes_that_arrived(tmp_path: Path, nodes: int) -> None:
    script = tmp_path / "once.py"
    script.write_text(ONCE)
    flags = ("--nnodes", "1:2", "--max-restarts", "1")
    if nodes == 1:
        coordinator = f"127.0.0.2:{free_port('127.0.0.2')}"
        proc = launcher(
            "-n", "2", "--coordinator", coordinator, *flags, "--last-call", "0.5", str(script), NETCOLL_TOKEN=TOKEN
        )
        out, err = finish(proc)
        assert proc.returncode == 0, err
        assert "netcoll run: the group formed with 1 node(s); this is node 0" in err
        assert lines(out) == [f"[rank {r}] attempt 1 world 2 node 0 total 3" for r in (0, 1)]
        return
    (node0, out0, err0), (node1, out1, err1) = two_nodes(script, *flags, "--last-call", "60", ranks=False)
    assert node0.returncode == 0 and node1.returncode == 0, err0 + err1  # MAX arrived: no need to wait 60s
    assert "this is node 0" in err0 and "this is node 1" in err1
    assert lines(out0) == [f"[rank {r}] attempt 1 world 4 node 0 total 10" for r in (0, 1)]
    assert lines(out1) == [f"[rank {r}] attempt 1 world 4 node 1 total 10" for r in (2, 3)]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--nnodes", "2:1"), "MIN <= MAX"),
        (("--nnodes", "x"), "M or MIN:MAX"),
        (("--nnodes", "1:2", "--node-rank", "0"), "--node-rank goes with --nnodes M"),
        (("--max-restarts", "-1"), "--max-restarts"),
    ],
)
def test_bad_restart_flags_exit_2(args: tuple[str, ...], says: str) -> None:
    proc = launcher("-n", "1", "--coordinator", "127.0.0.1:1", *args, "x.py", NETCOLL_TOKEN=TOKEN)
    out, err = finish(proc)
    assert proc.returncode == 2 and says in err and out == "", err


def plan(low: int, high: int, nprocs: int = 2) -> Plan:
    return Plan(nprocs, low, None, ["x"], "127.0.0.1:1", None, None, 1.0, 10.0, low, high, 0, 0.0)


async def test_the_lobby_ranks_nodes_by_arrival_and_turns_late_ones_away() -> None:
    lobby = Lobby(plan(2, 3))
    params = {"nprocs": 2, "max_restarts": 0, "nnodes": "2:3"}
    first = asyncio.create_task(lobby.arrive(None, params, memoryview(b"")))  # type: ignore[arg-type]
    second = asyncio.create_task(lobby.arrive(None, params, memoryview(b"")))  # type: ignore[arg-type]
    assert await first == {"nnodes": 3, "node_rank": 1} and await second == {"nnodes": 3, "node_rank": 2}
    with pytest.raises(RendezvousError, match="already formed with 3 node"):
        await lobby.arrive(None, params, memoryview(b""))  # type: ignore[arg-type]
    with pytest.raises(RendezvousError, match="same -n"):
        await Lobby(plan(2, 3)).arrive(None, {**params, "nprocs": 4}, memoryview(b""))  # type: ignore[arg-type]


async def test_the_lobby_forms_after_the_last_call_with_min_nodes() -> None:
    lobby = Lobby(plan(2, 4))
    params = {"nprocs": 2, "max_restarts": 0, "nnodes": "2:4"}
    assert not lobby.formed.done()  # node 0 alone: fewer than MIN
    assert await lobby.arrive(None, params, memoryview(b"")) == {"nnodes": 2, "node_rank": 1}  # type: ignore[arg-type]


pytestmark = [
    pytest.mark.tcp,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="127.0.0.x addresses (Linux loopback)"),
]


def test_a_signal_to_one_nodes_launcher_restarts_no_node(tmp_path: Path) -> None:
    script = tmp_path / "wait.py"
    script.write_text(WAIT)
    coordinator = f"127.0.0.2:{free_port('127.0.0.2')}"
    common = ("-n", "1", "--nnodes", "2", "--coordinator", coordinator, "--max-restarts", "2", "--grace", "2")
    procs = [
        launcher(*common, "--node-rank", str(k), "--local-addr", f"127.0.0.{k + 2}", str(script), NETCOLL_TOKEN=TOKEN)
        for k in (0, 1)
    ]
    try:
        for k, p in enumerate(procs):
            assert p.stdout is not None
            assert p.stdout.readline().strip() == f"[rank {k}] ready"
        procs[1].send_signal(signal.SIGINT)
        (_, err0), (_, err1) = finish(procs[0]), finish(procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert procs[1].returncode == 130 and procs[0].returncode == 130, err0 + err1
    assert "netcoll run: node 1 failed (its launcher got a signal)" in err0
    assert "netcoll run: restart" not in err0 + err1
