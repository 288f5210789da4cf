"""One run: its state (names, addresses, tokens, time budget, the result being built) and its
phases (network, calibration, cluster, shaping, sweeps), with the guarantee that everything it
created (processes by PID, namespaces, hence veths and the bridge) is removed on success,
failure, Ctrl-C and SIGTERM: the phases run under :func:`signals_raise` inside a try whose
finally stops the processes and deletes the namespaces under :func:`signals_ignored`."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from bench.netemlib import cluster, model, netns, sweep
from bench.netemlib.cluster import Procs
from bench.netemlib.common import CLEANUP_RESERVE_S, COORD_PORT, PREFIX, Interrupted, OutOfTime, say
from bench.netemlib.netns import Host

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Run:
    """What one run knows: its arguments and the machine's capabilities, its namespaces and
    addresses, its processes, its logs' directory, its tokens and deadline, and the result."""

    def __init__(self, args: argparse.Namespace, caps: dict[str, Any]) -> None:
        self.args, self.caps = args, caps
        self.t0 = time.monotonic()
        self.deadline: float = self.t0 + args.limit - CLEANUP_RESERVE_S
        self.prefix = f"{PREFIX}-{os.getpid()}"
        self.host = Host(caps["ip"], caps["tc"], self.prefix)
        self.procs = Procs()
        self.tmp = tempfile.mkdtemp(prefix="netcoll-netem-")
        self.site = congestion_site(self.tmp, args.congestion)
        self.token, self.client_token = secrets.token_hex(24), secrets.token_hex(24)
        net = args.subnet
        self.coord_ip = f"{net}.1"
        self.rank_ips = [f"{net}.{10 + i}" for i in range(args.ranks)]
        self.coord_addr = f"{self.coord_ip}:{COORD_PORT}"
        self.sw, self.cns = f"{self.prefix}-sw", f"{self.prefix}-c"
        self.rns = [f"{self.prefix}-r{i}" for i in range(args.ranks)]
        self.shaping = shaping(args, caps)
        #: the one-way delay netcoll's own delay line adds in each rank daemon (tbf+line), else 0
        self.line_delay = args.delay if self.shaping == "tbf+line" else 0.0
        self.delay_applied = args.delay if self.shaping in ("netem", "tbf+line") else 0.0
        self.result = self._initial_result()

    def _initial_result(self) -> dict[str, Any]:
        """The result as it starts: what the run is, before anything is measured."""
        args, caps = self.args, self.caps
        return {
            "prefix": self.prefix,
            "capabilities": caps,
            "shaping": self.shaping,
            "delay_requested_s": args.delay,
            "delay_applied_s": self.delay_applied,
            "rate_bits_per_s": args.rate if self.shaping != "none" else None,
            "ranks": args.ranks,
            "netcoll_path": args.netcoll_path,
            "netcoll_commit": cluster.netcoll_commit(args.netcoll_path),
            "auto_by": "cost model (NETCOLL_COST_MODEL=1)" if args.cost_model else "fixed table",
            "sweeps": [],
            "notes": [],
        }

    # -- time --
    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def budget(self, want: float) -> float:
        left = self.remaining()
        if left <= 1:
            raise OutOfTime(f"--limit {self.args.limit:g} s reached")
        return min(want, left)

    # -- environment --
    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
        env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        # TCP links only: netcoll would otherwise join ranks on one host by shared memory
        # (netcoll.links.shm), which namespaces do not separate, and nothing would cross the veths
        env["NETCOLL_TRANSPORT"] = "tcp"
        path = self.args.netcoll_path
        if self.site:  # --congestion: every TCP socket of the processes sets it
            path += os.pathsep + self.site
            env["NETEM_TCP_CONGESTION"] = self.args.congestion
        env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if self.args.insecure:
            env["NETCOLL_INSECURE"] = "1"
        env.update(extra)
        return env

    def in_ns(self, ns: str, *argv: str) -> list[str]:
        if ns not in self.host.created:
            raise RuntimeError(f"refusing to run in namespace {ns!r}: not created by this run")
        return [self.caps["ip"], "netns", "exec", ns, *argv]


_SITE = '''\
"""bench/netem.py --congestion: TCP sockets of this process use $NETEM_TCP_CONGESTION."""
import os
import socket

_cc = os.environ.get("NETEM_TCP_CONGESTION", "").encode()
_init = socket.socket.__init__


def _with_congestion(self, family=-1, type=-1, proto=-1, fileno=None):
    _init(self, family, type, proto, fileno)
    if _cc and fileno is None and self.type == socket.SOCK_STREAM and self.family in (socket.AF_INET, socket.AF_INET6):
        self.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, _cc)  # accepted sockets inherit it


socket.socket.__init__ = _with_congestion
'''


def congestion_site(tmp: str, name: str | None) -> str | None:
    """With ``--congestion NAME``: a directory whose ``sitecustomize`` makes every TCP socket
    of the processes use NAME (``setsockopt(TCP_CONGESTION)``; a namespace's own sysctl may
    refuse a change, as on this machine). An unknown or disallowed name fails the first
    socket, hence the run, with the kernel's error. None without it."""
    if not name:
        return None
    site = os.path.join(tmp, "site")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(_SITE)
    return site


def shaping(args: argparse.Namespace, caps: dict[str, Any]) -> str:
    """How the links are shaped: ``netem`` (delay and rate in the kernel); ``tbf+line`` (the
    rate by tbf, the delay by netcoll's delay line, NETCOLL_EMULATE_DELAY_US in each rank
    daemon: ``--shape line``, and ``auto`` on a kernel without netem); ``tbf`` (rate only);
    ``none``."""
    if args.shape == "none":
        return "none"
    if caps["netem"] and args.shape in ("auto", "netem"):
        return "netem"
    if args.shape in ("auto", "line") and args.delay > 0:
        return "tbf+line"
    return "tbf"


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP raise Interrupted (so every finally runs)."""

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """While cleaning up: a second Ctrl-C must not leave half of it undone."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _phases(run: Run, steps: list[tuple[str, str]]) -> None:
    """Network, loopback calibration, cluster, veth calibration, shaping, the sweeps."""
    netns.build(run)
    sweep.calibrate(run)
    cluster.start_cluster(run)
    if not run.args.skip_veth_calibration:
        sweep.calibrate_veth(run)
    netns.shape(run)
    run.result["loadavg_before"] = os.getloadavg()
    for repeat in range(run.args.repeats):
        for op, alg in steps:
            sweep.sweep(run, op, alg, repeat)
    run.result["loadavg_after"] = os.getloadavg()
    say(
        "1-minute load average {:.1f} before the sweeps, {:.1f} after (2 cores here: other work on the "
        "machine shows in the times)".format(run.result["loadavg_before"][0], run.result["loadavg_after"][0])
    )
    netns.link_stats(run)


def _measure(run: Run, steps: list[tuple[str, str]]) -> int:
    """The phases, under signals that raise; the status they end with (0, 1 failed, 130 interrupted)."""
    with signals_raise():
        try:
            _phases(run, steps)
        except OutOfTime as exc:
            say(f"stopped early: {exc}; keeping the sweeps finished so far")
            run.result["truncated"] = str(exc)
        except Interrupted as exc:
            say(f"interrupted ({exc}): cleaning up")
            run.result["interrupted"] = str(exc)
            return 130
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
            say(f"FAILED: {exc}")
            run.result["error"] = str(exc)
            return 1
    return 0


def _cleanup(run: Run, status: int) -> list[str]:
    """Stop every process by PID and delete every namespace, signals ignored; the problems."""
    with signals_ignored():
        problems = run.procs.stop_all() + run.host.delete_all()
        if run.args.keep_logs or status == 1:
            say(f"logs kept in {run.tmp}")
        else:
            shutil.rmtree(run.tmp, ignore_errors=True)
    return problems


def execute(run: Run, steps: list[tuple[str, str]]) -> int:
    """The run's phases, then (always) its cleanup, recorded and said; the status (1 if the
    cleanup had problems, 130 if interrupted)."""
    status, problems = 0, []
    try:
        status = _measure(run, steps)
    finally:
        problems = _cleanup(run, status)
    run.result["pids"] = run.procs.pids
    run.result["cleanup"] = {"ok": not problems, "problems": problems, "namespaces_deleted": run.host.created == []}
    say(
        f"cleaned up: stopped {len(run.procs.pids)} processes by PID, deleted {run.host.deleted} namespaces "
        "(with their veths and the bridge)" + ("" if not problems else "; PROBLEMS: " + "; ".join(problems))
    )
    if problems and status == 0:
        status = 1
    return status


def predict_measured(run: Run, status: int) -> int:
    """Predictions where there are sweeps and the calibration they need; a failure is recorded
    (the measurements are still worth writing) and makes the status 1."""
    calibration = "calibration_veth" if run.args.overhead == "veth" else "calibration"
    if run.result["sweeps"] and calibration in run.result:
        try:
            model.predict(run)
        except Exception as exc:  # noqa: BLE001 - the measurements are still worth writing
            say(f"predictions failed: {exc!r}")
            run.result["predict_error"] = repr(exc)
            status = status or 1
    return status


def describe(run: Run, steps: list[tuple[str, str]], t0: float, command: str) -> None:
    """How long the run took, its configuration, when and by which command."""
    args = run.args
    run.result["elapsed_s"] = round(time.monotonic() - t0, 1)
    run.result["config"] = {
        "ops": args.ops,
        "steps": [list(s) for s in steps],
        "minbytes": args.minbytes,
        "maxbytes": args.maxbytes,
        "stepfactor": args.stepfactor,
        "iters": args.iters,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "statistic": args.statistic,
        "subnet": f"{args.subnet}.0/24",
        "limit_s": args.limit,
    }
    run.result["generated"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    run.result["command"] = command
