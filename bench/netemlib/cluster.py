"""The processes of a run and the netcoll cluster they form.

:class:`Procs`: every process a run starts is the leader of a session of its own, told to die
with this script (even when it is SIGKILLed), and stopped by PID (its process group: only its
own descendants are in it). The cluster: a coordinator in its own namespace, one rank daemon
per rank namespace (``python3 -m netcoll coordinator|rank`` under ``ip netns exec``, with the
run's member and client tokens), waited for until every rank has joined; and which netcoll
they run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench.netemlib.common import COORD_PORT, say, tail

if TYPE_CHECKING:
    from bench.netemlib.run import Run


# -- processes ------------------------------------------------------------------------------------
def _die_with_parent() -> None:  # in the child, before exec: SIGTERM if this script dies (even SIGKILLed)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG, kept across exec
    except Exception:  # noqa: BLE001 - best effort
        pass


class Procs:
    """The processes this run started (each the leader of a session of its own), by PID."""

    def __init__(self) -> None:
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], log_path: str) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=os.path.dirname(log_path),  # not the caller's cwd: `python -m` would import a netcoll/ there
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.started.append((name, proc))
        return proc

    @property
    def pids(self) -> list[int]:
        return [proc.pid for _, proc in self.started]

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
        """``sig`` to the process group this run created for ``proc`` (its pid; only its own
        descendants are in it, e.g. the rank processes of a local calibration sweep)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
        if proc.poll() is None:
            self._signal(proc, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self._signal(proc, signal.SIGKILL)  # the group's stragglers too (SIGKILL to a dead group: harmless)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5.0)

    def stop_all(self) -> list[str]:
        problems = []
        for name, proc in reversed(self.started):  # bench clients and ranks first, the coordinator last
            self.stop(proc)
            if proc.poll() is None:
                problems.append(f"{name} (pid {proc.pid}) did not exit")
        return problems


# -- the cluster ----------------------------------------------------------------------------------
def netcoll_commit(path: str) -> str | None:
    """The commit of the netcoll the processes run: ``git rev-parse`` of a checkout, or the
    first line of a ``COMMIT`` file next to a ``git archive`` copy's ``netcoll/``."""
    try:
        with open(os.path.join(path, "COMMIT")) as f:
            return f.readline().strip() or None
    except OSError:
        pass
    if shutil.which("git") and os.path.exists(os.path.join(path, ".git")):
        res = subprocess.run(
            ["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        )
        dirty = subprocess.run(
            ["git", "--no-optional-locks", "-C", path, "status", "--porcelain", "--", "netcoll"],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode == 0:
            return res.stdout.strip() + (" + uncommitted changes in netcoll/" if dirty.stdout.strip() else "")
    return None


def wait_for(
    run: Run, ok: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], log: str, interval: float = 0.1
) -> None:
    """Poll ``ok`` until it holds; fail (with the log's tail) if ``proc`` exits or time runs out."""
    end = time.monotonic() + run.budget(60)
    while not ok():
        if proc.poll() is not None:
            log_tail = tail(os.path.join(run.tmp, log))
            raise RuntimeError(f"waiting for {what}: pid {proc.pid} exited {proc.returncode}: {log_tail}")
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}: {tail(os.path.join(run.tmp, log))}")
        time.sleep(interval)


def _start_coordinator(run: Run) -> subprocess.Popen[bytes]:
    ready = os.path.join(run.tmp, "coordinator.ready")
    env = run.env(NETCOLL_TOKEN=run.token, NETCOLL_CLIENT_TOKEN=run.client_token)
    argv = run.in_ns(
        run.cns, sys.executable, "-m", "netcoll", "coordinator", "--host", run.coord_ip, "--port", str(COORD_PORT),
        "--http-port", "off", "--log-level", "warning", "--ready-file", ready,
    )  # fmt: skip
    coord = run.procs.start("coordinator", argv, env, os.path.join(run.tmp, "coordinator.log"))
    wait_for(run, lambda: os.path.exists(ready), "the coordinator", coord, "coordinator.log")
    return coord


def _start_ranks(run: Run) -> None:
    for i, (ns, addr) in enumerate(zip(run.rns, run.rank_ips, strict=True)):
        argv = run.in_ns(
            ns, sys.executable, "-m", "netcoll", "rank", "--coordinator", run.coord_addr, "--host", addr,
            "--port", "0", "--http-port", "off", "--rank-hint", str(i), "--log-level", "warning",
        )  # fmt: skip
        env = run.env(NETCOLL_TOKEN=run.token)
        if run.line_delay:  # tbf+line: each daemon delays what it receives (netcoll/links/delayline.py)
            env["NETCOLL_EMULATE_DELAY_US"] = str(round(run.line_delay * 1e6))
        if run.args.cost_model:  # auto by the cost model (netcoll/selection/cost.py), not the table
            env["NETCOLL_COST_MODEL"] = "1"
        run.procs.start(f"rank{i}", argv, env, os.path.join(run.tmp, f"rank{i}.log"))


def _wait_for_members(run: Run, coord: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
    """``netcoll status`` from the coordinator's namespace until every rank has joined."""
    members: list[dict[str, Any]] = []

    def all_joined() -> bool:
        nonlocal members
        res = subprocess.run(
            run.in_ns(run.cns, sys.executable, "-m", "netcoll", "status", "--json", "--coordinator", run.coord_addr),
            capture_output=True,
            text=True,
            env=run.env(NETCOLL_CLIENT_TOKEN=run.client_token),
            cwd=run.tmp,
            timeout=run.budget(20),
            check=False,
        )
        if res.returncode != 0:
            return False
        members = json.loads(res.stdout).get("members") or []
        ranks: int = run.args.ranks
        return len(members) >= ranks

    wait_for(run, all_joined, f"{run.args.ranks} rank daemons to join", coord, "coordinator.log", interval=0.5)
    return members


def _imported_from(run: Run) -> str:
    """Where the processes import netcoll from (as they would: same namespace, env and cwd)."""
    res = subprocess.run(
        run.in_ns(run.cns, sys.executable, "-c", "import netcoll, os; print(os.path.dirname(netcoll.__file__))"),
        capture_output=True,
        text=True,
        env=run.env(),
        cwd=run.tmp,
        timeout=run.budget(30),
        check=False,
    )
    return res.stdout.strip() or res.stderr.strip()


def start_cluster(run: Run) -> None:
    """The coordinator, then the rank daemons; returns once all of them have joined."""
    coord = _start_coordinator(run)
    _start_ranks(run)
    members = _wait_for_members(run, coord)
    hosts = sorted(str(m.get("host") or m.get("address") or "?") for m in members)
    run.result["members"] = hosts
    run.result["netcoll_imported_from"] = _imported_from(run)
    say(f"the processes run netcoll from {run.result['netcoll_imported_from']}")
    say(
        f"coordinator (pid {coord.pid}) on {run.coord_addr} in {run.cns}; {len(members)} rank daemons "
        f"joined from {', '.join(hosts)}; member and client tokens generated"
        + (" (--insecure also set)" if run.args.insecure else "")
    )
