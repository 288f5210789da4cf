"""netcoll.sync shutdown: Ctrl-C while blocked in a call, and interpreter exit
without closing (rank processes started from the environment ``netcoll run`` sets)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from .conftest import PYTHON, subprocess_env

pytestmark = pytest.mark.tcp

# Rank 0 blocks in an all_reduce that rank 2 never joins; the test interrupts it
# once a watcher thread sees the main thread waiting inside the call.
RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, time
    import numpy as np
    import netcoll, netcoll.sync

    RANK = int(os.environ["NETCOLL_RANK"])

    def blocked_in_call():
        frame = sys._current_frames().get(threading.main_thread().ident)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        return names[:3] == ["wait", "result", "_call"]  # in SyncCommunicator._call's done.result()

    def announce():
        while not blocked_in_call():
            time.sleep(0.01)
        print("blocked", flush=True)

    try:
        with netcoll.sync.connect() as comm:
            comm.barrier()
            if RANK == 0:
                threading.Thread(target=announce, name="announce", daemon=True).start()
                comm.all_reduce(np.ones(4))
            elif RANK == 1:
                try:
                    comm.all_reduce(np.ones(4))
                except netcoll.CollectiveCancelled as exc:
                    print("rank 1 got", type(exc).__name__, exc, flush=True)
            else:
                sys.stdin.readline()  # never joins the all_reduce; leaves when told
    except KeyboardInterrupt:
        names = sorted(t.name for t in threading.enumerate() if t.name != "announce")
        print("KeyboardInterrupt; threads:", names, flush=True)
        sys.exit(130)
    """
)


def _start(coordinator: str, rank: int, world_size: int, script: str) -> subprocess.Popen[str]:
    env = subprocess_env(NETCOLL_COORDINATOR=coordinator, NETCOLL_WORLD_SIZE=str(world_size), NETCOLL_RANK=str(rank))
    return subprocess.Popen(
        [PYTHON, "-c", script],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _reap(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=30)


def test_ctrl_c_cancels_the_collective_on_every_rank(coordinator: str) -> None:
    procs = [_start(coordinator, r, 3, RANK_SCRIPT) for r in range(3)]
    try:
        assert procs[0].stdout is not None and procs[2].stdin is not None
        assert procs[0].stdout.readline().strip() == "blocked"
        procs[0].send_signal(signal.SIGINT)
        out0, err0 = procs[0].communicate(timeout=30)
        out1, err1 = procs[1].communicate(timeout=30)
        _, err2 = procs[2].communicate("go\n", timeout=30)
    finally:
        _reap(procs)
    assert procs[0].returncode == 130, err0
    assert out0.strip() == "KeyboardInterrupt; threads: ['MainThread']"  # the loop thread is gone
    assert procs[1].returncode == 0, err1
    assert out1.startswith("rank 1 got CollectiveCancelled all_reduce #1"), out1
    assert "cancelled on rank 0" in out1
    assert procs[2].returncode == 0, err2


EXIT_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import netcoll.sync

    comm = netcoll.sync.connect()  # never closed: atexit does it
    print(comm.all_reduce(np.array([comm.rank + 1])).tolist(), flush=True)
    """
)


def test_interpreter_exit_closes_an_open_communicator(coordinator: str) -> None:
    procs = [_start(coordinator, r, 2, EXIT_SCRIPT) for r in range(2)]
    try:
        results = [p.communicate(timeout=60) for p in procs]
    finally:
        _reap(procs)
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == "[3]"
        assert "Traceback" not in err and "warning" not in err.lower(), err


CONNECT_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import netcoll.sync

    def blocked_connecting():
        frame = sys._current_frames().get(threading.main_thread().ident)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        return names[:3] == ["wait", "result", "start"]  # in Runner.start's ready.result()

    def announce():
        while not blocked_connecting():
            time.sleep(0.01)
        print("connecting", flush=True)

    threading.Thread(target=announce, name="announce", daemon=True).start()
    try:
        netcoll.sync.connect()  # the second rank never comes
    except KeyboardInterrupt:
        names = sorted(t.name for t in threading.enumerate() if t.name != "announce")
        print("KeyboardInterrupt; threads:", names, flush=True)
        sys.exit(130)
    """
)


def test_ctrl_c_while_connecting_leaves_no_thread(coordinator: str) -> None:
    proc = _start(coordinator, 0, 2, CONNECT_SCRIPT)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "connecting"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        _reap([proc])
    assert proc.returncode == 130, err
    assert out.strip() == "KeyboardInterrupt; threads: ['MainThread']"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/task/*/status")
def test_netcoll_threads_leave_signals_to_the_main_thread(coordinator: str) -> None:
    """The sync loop and the heartbeat run with SIGINT and SIGTERM blocked, so the kernel
    delivers a Ctrl-C to the main thread (delivered to a loop thread, it stayed pending while
    the main thread waited in connect: the test above hung now and then under load)."""
    import netcoll.sync

    def blocked(t: threading.Thread) -> int:
        with open(f"/proc/self/task/{t.native_id}/status") as f:
            return int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)

    with netcoll.sync.connect(coordinator, world_size=1, group="signals") as comm:
        assert comm.world_size == 1
        ours = [t for t in threading.enumerate() if t.name in ("netcoll-sync", "netcoll-heartbeat")]
        assert {t.name for t in ours} == {"netcoll-sync", "netcoll-heartbeat"}
        for t in ours:
            mask = blocked(t)
            for sig in (signal.SIGINT, signal.SIGTERM):
                assert mask & (1 << (sig - 1)), f"{t.name} does not block {sig.name}"
        assert not blocked(threading.main_thread()) & (1 << (signal.SIGINT - 1))
