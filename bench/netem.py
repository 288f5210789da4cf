"""Emulated network (issue 12, goal 4): rank daemons in network namespaces joined by
veth pairs through a bridge, with ``tc`` delay and rate limits; the sweep is run
through them and predicted and measured times are compared, crossovers included.

    sudo python3 bench/netem.py --ranks 4 --delay 200us --rate 1gbit
    python3 bench/netem.py --check            # only say what this machine allows

What it builds (every name carries ``ncX-<pid>``, so nothing of anyone else is touched):

* a "switch" namespace ``ncX-<pid>-sw`` holding a bridge;
* a coordinator namespace ``ncX-<pid>-c`` (``<subnet>.1``) and one namespace per rank
  ``ncX-<pid>-r<i>`` (``<subnet>.<10+i>``), each joined to the bridge by a veth pair
  that is created inside the namespaces (no link ever appears in the root namespace);
* on every rank's veth: one-way delay and the rate on the rank side (its uplink), the
  rate alone on the switch side (its downlink): a full-duplex link of that rate and a
  rank-to-rank one-way delay of ``--delay``. The coordinator's link (control traffic
  only, never on a collective's path) is not shaped.

The shaping uses ``netem`` (delay + rate) where the kernel has it; where it does not
but ``tbf`` works, the rate is emulated with ``tbf`` and the delay is NOT (it says so,
and the predictions then use a delay of 0). Where namespaces are not allowed (not
root, no iproute2, EPERM, ...) it says why and exits 0. Every capability is found by
trying it in a throwaway namespace.

Then: a netcoll coordinator and N rank daemons (``python3 -m netcoll coordinator|rank``
under ``ip netns exec``) with freshly generated member and client tokens (``--insecure``
only when asked), and ``python3 -m netcoll.bench --coordinator ...`` run from the
coordinator's namespace once per (collective, algorithm), ``auto`` included.

Predictions: ``T = steps * alpha + link_bytes * beta`` per algorithm (the cost headers of
``netcoll/algorithms/*.py``, read as "the busiest link direction carries ``link_bytes``"),
with ``alpha = delay + o`` and ``beta = 1 / rate``, where ``o`` is the per-message
overhead measured on loopback (a 4-byte recursive-doubling all_reduce of the same
number of ranks, inside the switch namespace, divided by its rounds). A second model
adds ``beta0``, the per-byte CPU cost measured on loopback (a 4 MiB ring all_reduce).
Where ``netcoll/algorithms/cost.py`` exists (the cost model behind ``auto``), its
``predict()`` is used with ``Params(alpha, overhead=0, beta, gamma=0)`` (the same two-parameter
model, from that module's formulas); else the local :func:`cost_terms`. The JSON says which, and
keeps the local formulas' prediction beside it.

Children run with ``NETCOLL_TRANSPORT=tcp``: namespaces do not separate ``/dev/shm``, and
netcoll would otherwise join the ranks by shared memory, around the emulated links.

Everything it created (processes by PID, namespaces, hence veths and the bridge) is
removed on success, failure, Ctrl-C and SIGTERM. Run time is bounded by ``--limit``.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import itertools
import json
import math
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "ncX"
#: what each collective's sweep runs (``auto`` last); the fixed algorithms of netcoll.algorithms.ALGORITHMS
DEFAULT_ALGORITHMS = {
    "all_reduce": ("ring", "tree", "doubling", "allpairs", "halving", "auto"),
    "all_gather": ("ring", "doubling", "auto"),
    "broadcast": ("tree", "ring", "auto"),
}
DEFAULT_SEGMENT_BYTES = 4 << 20  # netcoll.algorithms._common.DEFAULT_SEGMENT_BYTES
COORD_PORT = 29400
CLEANUP_RESERVE_S = 20.0  # of --limit, kept for stopping processes and deleting namespaces


class Skip(Exception):
    """The machine does not allow what this needs: say why, exit 0."""


class Interrupted(Exception):
    """SIGINT / SIGTERM / SIGHUP."""


class OutOfTime(Exception):
    """--limit reached."""


def say(msg: str) -> None:
    print(f"netem: {msg}", flush=True)


# -- units ----------------------------------------------------------------------------------------
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6, "µs": 1e-6, "ns": 1e-9}
_RATE_UNITS = {
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
}


def parse_delay(text: str) -> float:
    """``200us``, ``1.5ms``, ``0`` -> seconds (tc's units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zµ]*)\s*", text.lower())
    if not m or (m.group(2) and m.group(2) not in _TIME_UNITS):
        raise argparse.ArgumentTypeError(f"bad delay {text!r}: use e.g. 200us, 1ms, 0")
    value = float(m.group(1)) * _TIME_UNITS.get(m.group(2) or "s", 1.0)
    if value > 1.0:
        raise argparse.ArgumentTypeError(f"delay {text!r} is over 1 s")
    return value


def parse_rate(text: str) -> float:
    """``1gbit``, ``100mbit``, ``125mbps`` -> bits per second (tc's units: bps = bytes/s)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", text.lower())
    if not m or m.group(2) not in _RATE_UNITS:
        raise argparse.ArgumentTypeError(f"bad rate {text!r}: use e.g. 1gbit, 100mbit, 10gbit")
    value = float(m.group(1)) * _RATE_UNITS[m.group(2)]
    if not 1e5 <= value <= 1e12:
        raise argparse.ArgumentTypeError(f"rate {text!r} outside 100kbit..1tbit")
    return value


def parse_size(text: str) -> int:
    """``4``, ``4K``, ``4KiB``, ``16M``, ``1G``: powers of 1024, as netcoll's sizes (no netcoll
    import here, so the "not allowed here" path needs nothing but Python)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(|b|k|kb|kib|m|mb|mib|g|gb|gib)\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 4, 4K, 64KiB, 16M")
    scale = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2)[:1]]
    return int(float(m.group(1)) * scale)


def fmt_size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_us(us: float | None) -> str:
    if us is None or not math.isfinite(us):
        return "—"
    return f"{us / 1000:.2f} ms" if us >= 10_000 else f"{us:.0f} µs"


def tc_time(seconds: float) -> str:
    return f"{round(seconds * 1e6)}us"


def tc_rate(bits: float) -> str:
    return f"{round(bits)}bit"


# -- cost model -------------------------------------------------------------------------------------
def _log2_floor_pow(p: int) -> int:
    """The largest power of two <= p."""
    return 1 << (p.bit_length() - 1)


def cost_terms(
    op: str, algorithm: str, nbytes: int, p: int, segment_bytes: int = DEFAULT_SEGMENT_BYTES
) -> tuple[float, float]:
    """``(steps, link_bytes)`` of one call: the latency terms on the critical path and the
    bytes through the busiest link direction, from the cost headers of netcoll/algorithms.

    ``T = steps * alpha + link_bytes * beta``. ``nbytes`` as nccl-tests' size: all_reduce's
    and broadcast's buffer, all_gather's output (all P blocks).
    """
    if p <= 1:
        return 0.0, 0.0
    n = float(nbytes)
    L = math.ceil(math.log2(p))
    p2 = _log2_floor_pow(p)
    k = p2.bit_length() - 1
    extra = p != p2
    if op == "all_reduce":
        if algorithm == "ring":  # 2(P-1) steps, 2(P-1)/P N per rank; S segments per chunk pipelined
            s = max(1, math.ceil(n / p / segment_bytes))
            return 2 * (p - 1) + (s - 1), 2 * (p - 1) / p * n
        if algorithm == "doubling":  # log2 P' rounds (+2 with extra ranks), the whole N each
            steps = k + (2 if extra else 0)
            return steps, steps * n
        if algorithm == "halving":  # 2 log2 P' steps, 2(P'-1)/P' N (+ N in and N out with extras)
            return 2 * k + (2 if extra else 0), 2 * (p2 - 1) / p2 * n + (2 * n if extra else 0)
        if algorithm == "tree":  # reduce (L levels) + broadcast (L levels); the root's link carries L*N each way
            s = max(1, math.ceil(n / segment_bytes))
            return 2 * (L + s - 1), 2 * L * n
        if algorithm == "allpairs":  # 1 step, (P-1) N sent and received per rank
            return 1, (p - 1) * n
    elif op == "all_gather":
        if algorithm == "ring":  # P-1 steps, (P-1)/P N
            s = max(1, math.ceil(n / p / segment_bytes))
            return (p - 1) + (s - 1), (p - 1) / p * n
        if algorithm == "doubling":  # Bruck: L steps, (P-1)/P N
            return L, (p - 1) / p * n
    elif op == "broadcast":
        s = max(1, math.ceil(n / segment_bytes))
        if algorithm == "tree":  # L levels, L+S-1 segment times; the root sends L*N
            return L + s - 1, L * n
        if algorithm == "ring":  # chain: P+S-2 segment times of N/S bytes
            return p + s - 2, (p + s - 2) * n / s
    raise ValueError(f"no cost formula for {op} / {algorithm}")


def auto_choice(op: str, nbytes: int, p: int) -> str:
    """What ``auto`` runs (netcoll.algorithms.choose, with the size the Communicator passes)."""
    from netcoll.algorithms import choose

    return str(choose(op, 0 if op in ("broadcast", "scatter") else nbytes, p))


def load_cost_module(*roots: str) -> Any:
    """``netcoll/algorithms/cost.py`` (the cost model behind ``auto``: pure functions, no
    imports of netcoll) loaded by path from the first root that has it, if its ``predict``
    and ``Params`` are there; else None (the local formulas are used)."""
    import importlib.util

    for root in roots:
        path = os.path.join(root, "netcoll", "algorithms", "cost.py")
        if not os.path.exists(path):
            continue
        try:
            spec = importlib.util.spec_from_file_location("netcoll_cost_model", path)
            if spec is None or spec.loader is None:
                continue
            mod = importlib.util.module_from_spec(spec)
            sys.modules["netcoll_cost_model"] = mod  # dataclasses look their module up
            spec.loader.exec_module(mod)
        except Exception as exc:  # noqa: BLE001 - someone else's module: fall back, and say so
            say(f"{path} does not load ({exc}); using the local formulas")
            continue
        if callable(getattr(mod, "predict", None)) and getattr(mod, "Params", None) is not None:
            mod.path = path
            return mod
    return None


class Model:
    """Predicted seconds per call for one (alpha, beta): ``netcoll.algorithms.cost.predict``
    with ``Params(alpha, overhead=0, beta, gamma=0)`` when that module exists, else the local
    :func:`cost_terms`; both are ``steps * alpha + bytes * beta``."""

    def __init__(self, alpha: float, beta: float, p: int, cost: Any = None) -> None:
        self.alpha, self.beta, self.p, self.cost = alpha, beta, p, cost
        self.source = f"{cost.path} predict()" if cost is not None else "bench/netem.py cost_terms"

    def local(self, op: str, algorithm: str, nbytes: int) -> float:
        steps, link_bytes = cost_terms(op, algorithm, nbytes, self.p)
        return steps * self.alpha + link_bytes * self.beta

    def seconds(self, op: str, algorithm: str, nbytes: int) -> float:
        if algorithm == "auto":
            algorithm = auto_choice(op, nbytes, self.p)
        if self.cost is not None:
            try:
                params = self.cost.Params(self.alpha, 0.0, self.beta, 0.0)
                t = float(self.cost.predict(op, algorithm, nbytes, self.p, params, DEFAULT_SEGMENT_BYTES))
                if math.isfinite(t) and t >= 0:
                    return t
                raise ValueError(f"predicted {t}")
            except Exception as exc:  # noqa: BLE001 - an unknown module's failure: fall back, and say so
                say(f"cost.predict failed for {op}/{algorithm} ({exc}); using the local formulas from now on")
                self.cost, self.source = None, "bench/netem.py cost_terms"
        return self.local(op, algorithm, nbytes)


def crossovers(curves: dict[str, list[tuple[float, float]]], *, smooth: bool = False) -> list[dict[str, Any]]:
    """Where the fastest algorithm changes along size. ``curves``: algorithm -> [(size, time)]
    on the same sizes. Each crossover: the sizes it lies between, the algorithms before and
    after, and the size where their two curves cross (log-log interpolation). ``smooth``: a
    winner at one size only, between two sizes won by the same other algorithm, is taken
    as noise (for measurements)."""
    algs = sorted(curves)
    if len(algs) < 2:
        return []
    sizes = sorted({s for pts in curves.values() for s, _ in pts if s > 0})
    table = {a: dict(curves[a]) for a in algs}
    best: list[tuple[float, str]] = []
    for s in sizes:
        cands = [(table[a][s], a) for a in algs if s in table[a] and table[a][s] > 0]
        if cands:
            best.append((s, min(cands)[1]))
    if smooth:
        for i in range(1, len(best) - 1):
            if best[i - 1][1] == best[i + 1][1] != best[i][1]:
                best[i] = (best[i][0], best[i - 1][1])
    out = []
    for (s0, a0), (s1, a1) in itertools.pairwise(best):
        if a0 == a1:
            continue
        at = math.sqrt(s0 * s1)
        try:  # log t_a0 - log t_a1 goes from <0 at s0 to >0 at s1: where is it 0?
            d0 = math.log(table[a0][s0]) - math.log(table[a1][s0])
            d1 = math.log(table[a0][s1]) - math.log(table[a1][s1])
            if d1 != d0:
                f = min(1.0, max(0.0, -d0 / (d1 - d0)))
                at = math.exp(math.log(s0) + f * (math.log(s1) - math.log(s0)))
        except (KeyError, ValueError):
            pass
        out.append({"from": a0, "to": a1, "between": [s0, s1], "at": at})
    return out


# -- commands ------------------------------------------------------------------------------------
class Host:
    """Runs ``ip`` / ``tc`` and remembers everything it created."""

    def __init__(self, ip: str, tc: str, prefix: str) -> None:
        self.ip, self.tc, self.prefix = ip, tc, prefix
        self.created: list[str] = []  # namespaces, in creation order
        self.deleted = 0
        self.log: list[str] = []

    def run(
        self, argv: Sequence[str], *, check: bool = True, timeout: float = 20.0
    ) -> subprocess.CompletedProcess[str]:
        self.log.append(" ".join(argv))
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
        if check and res.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` failed ({res.returncode}): {(res.stderr or res.stdout).strip()}")
        return res

    def netns_list(self) -> set[str]:
        res = self.run([self.ip, "netns", "list"], check=False)
        return {line.split()[0] for line in res.stdout.splitlines() if line.strip()}

    def add_netns(self, name: str) -> None:
        if not name.startswith(self.prefix):
            raise RuntimeError(f"refusing to create namespace {name!r} outside {self.prefix}*")
        if name in self.netns_list():
            raise RuntimeError(f"namespace {name} already exists: not ours, refusing to touch it")
        self.run([self.ip, "netns", "add", name])
        self.created.append(name)

    def ns(self, name: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ip -n NAME ...`` (or ``ip netns exec NAME tc ...``) in one of OUR namespaces."""
        if name not in self.created:
            raise RuntimeError(f"refusing to act in namespace {name!r}: not created by this run")
        if argv and argv[0] == "tc":
            return self.run([self.ip, "netns", "exec", name, self.tc, *argv[1:]], check=check)
        return self.run([self.ip, "-n", name, *argv], check=check)

    def delete_all(self) -> list[str]:
        """Delete the namespaces this run created (and with them their veths and bridge);
        return the problems."""
        problems = []
        self.deleted = 0
        for name in reversed(self.created):
            res = self.run([self.ip, "netns", "pids", name], check=False)
            pids = res.stdout.split()
            if pids:
                problems.append(f"processes still in {name}: {' '.join(pids)}")
            res = self.run([self.ip, "netns", "del", name], check=False)
            if res.returncode != 0:
                problems.append(f"ip netns del {name}: {res.stderr.strip()}")
            else:
                self.deleted += 1
        left = self.netns_list() & set(self.created)
        if left:
            problems.append(f"namespaces left: {sorted(left)}")
        self.created = [n for n in self.created if n in left]
        return problems


def probe(ip: str, tc: str, prefix: str) -> dict[str, Any]:
    """What this machine allows, found by trying each thing in a throwaway namespace.
    Raises Skip when namespaces (or veths, or a bridge) cannot be used."""
    caps: dict[str, Any] = {"root": False, "netns": False, "veth": False, "bridge": False, "netem": False, "tbf": False}
    if not sys.platform.startswith("linux"):
        raise Skip(f"network namespaces need Linux; this is {sys.platform}")
    ip_path, tc_path = shutil.which(ip), shutil.which(tc)
    if ip_path is None:
        raise Skip(f"no `ip` binary ({ip!r}): install iproute2 (apt-get install -y iproute2)")
    if tc_path is None:
        raise Skip(f"no `tc` binary ({tc!r}): install iproute2 (apt-get install -y iproute2)")
    caps.update(ip=ip_path, tc=tc_path)
    caps["root"] = os.geteuid() == 0  # not decisive: capabilities are found by trying them below
    who = "" if caps["root"] else f" (not root: euid {os.geteuid()}; namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    host = Host(ip_path, tc_path, prefix)
    name = f"{prefix}-probe"
    try:
        try:
            host.add_netns(name)
            host.ns(name, "link", "set", "lo", "up")
            host.run([ip_path, "netns", "exec", name, "true"])
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            raise Skip(f"network namespaces are not allowed here{who}: {exc}") from None
        caps["netns"] = True
        try:
            host.ns(name, "link", "add", "pa", "type", "veth", "peer", "name", "pb")
            host.ns(name, "link", "set", "pa", "up")
            host.ns(name, "link", "set", "pb", "up")
        except RuntimeError as exc:
            raise Skip(f"veth pairs are not allowed here: {exc}") from None
        caps["veth"] = True
        try:
            host.ns(name, "link", "add", "br0", "type", "bridge")
        except RuntimeError as exc:
            raise Skip(f"bridges are not allowed here: {exc}") from None
        caps["bridge"] = True
        for kind, args in (
            ("netem", ("netem", "delay", "200us", "rate", "1gbit")),
            ("tbf", ("tbf", "rate", "1gbit", "burst", "131072", "latency", "100ms")),
        ):
            res = host.ns(name, "tc", "qdisc", "add", "dev", "pa", "root", *args, check=False)
            caps[kind] = res.returncode == 0
            if res.returncode != 0:
                caps[f"{kind}_error"] = (res.stderr or res.stdout).strip()
            else:
                host.ns(name, "tc", "qdisc", "del", "dev", "pa", "root", check=False)
    finally:
        problems = host.delete_all()
        if problems:
            say("probe cleanup: " + "; ".join(problems))
    return caps


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


# -- the run ---------------------------------------------------------------------------------------
class Run:
    def __init__(self, args: argparse.Namespace, caps: dict[str, Any]) -> None:
        self.args, self.caps = args, caps
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.limit - CLEANUP_RESERVE_S
        self.prefix = f"{PREFIX}-{os.getpid()}"
        self.host = Host(caps["ip"], caps["tc"], self.prefix)
        self.procs = Procs()
        self.tmp = tempfile.mkdtemp(prefix="netcoll-netem-")
        self.token, self.client_token = secrets.token_hex(24), secrets.token_hex(24)
        net = args.subnet
        self.coord_ip = f"{net}.1"
        self.rank_ips = [f"{net}.{10 + i}" for i in range(args.ranks)]
        self.coord_addr = f"{self.coord_ip}:{COORD_PORT}"
        self.sw, self.cns = f"{self.prefix}-sw", f"{self.prefix}-c"
        self.rns = [f"{self.prefix}-r{i}" for i in range(args.ranks)]
        self.shaping = "netem" if caps["netem"] and args.shape in ("auto", "netem") else "tbf"
        if args.shape == "none":
            self.shaping = "none"
        self.delay_applied = args.delay if self.shaping == "netem" else 0.0
        self.result: dict[str, Any] = {
            "prefix": self.prefix,
            "capabilities": caps,
            "shaping": self.shaping,
            "delay_requested_s": args.delay,
            "delay_applied_s": self.delay_applied,
            "rate_bits_per_s": args.rate if self.shaping != "none" else None,
            "ranks": args.ranks,
            "netcoll_path": args.netcoll_path,
            "netcoll_commit": netcoll_commit(args.netcoll_path),
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
        env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if self.args.insecure:
            env["NETCOLL_INSECURE"] = "1"
        env.update(extra)
        return env

    def in_ns(self, ns: str, *argv: str) -> list[str]:
        if ns not in self.host.created:
            raise RuntimeError(f"refusing to run in namespace {ns!r}: not created by this run")
        return [self.caps["ip"], "netns", "exec", ns, *argv]

    # -- network --
    def build(self) -> None:
        h, a = self.host, self.args
        say(f"creating namespaces {self.prefix}-{{sw,c,r0..r{a.ranks - 1}}} on {a.subnet}.0/24")
        h.add_netns(self.sw)
        h.ns(self.sw, "link", "set", "lo", "up")
        h.ns(self.sw, "link", "add", "br0", "type", "bridge")
        h.ns(self.sw, "link", "set", "br0", "up")
        for ns, addr, port in [
            (self.cns, self.coord_ip, "pc"),
            *zip(self.rns, self.rank_ips, [f"p{i}" for i in range(a.ranks)], strict=True),
        ]:
            h.add_netns(ns)
            h.ns(ns, "link", "set", "lo", "up")
            h.ns(ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", self.sw)
            h.ns(ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            h.ns(ns, "link", "set", "eth0", "up")
            h.ns(self.sw, "link", "set", port, "master", "br0")
            h.ns(self.sw, "link", "set", port, "up")

    def shape(self) -> None:
        a, h = self.args, self.host
        if self.shaping == "none":
            say("no shaping (--shape none): plain veths")
            return
        burst = max(32 * 1024, int(a.rate / 8 * 1e-3))  # 1 ms of the rate, at least 32 KiB (a GSO super-packet)
        for i, ns in enumerate(self.rns):
            if self.shaping == "netem":
                limit = str(max(1000, int(a.rate / 8 * 0.1 / 1500)))  # 100 ms of the rate, in packets
                h.ns(
                    ns,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    "eth0",
                    "root",
                    "netem",
                    "delay",
                    tc_time(a.delay),
                    "rate",
                    tc_rate(a.rate),
                    "limit",
                    limit,
                )
                h.ns(
                    self.sw,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    f"p{i}",
                    "root",
                    "netem",
                    "rate",
                    tc_rate(a.rate),
                    "limit",
                    limit,
                )
            else:
                tbf = ("tbf", "rate", tc_rate(a.rate), "burst", str(burst), "latency", "100ms")
                h.ns(ns, "tc", "qdisc", "add", "dev", "eth0", "root", *tbf)
                h.ns(self.sw, "tc", "qdisc", "add", "dev", f"p{i}", "root", *tbf)
        shown = h.ns(self.rns[0], "tc", "qdisc", "show", "dev", "eth0").stdout.strip()
        self.result["qdisc_rank0"] = shown
        if self.shaping == "netem":
            say(f"netem on every rank link: one-way delay {a.delay * 1e6:.0f} µs, {a.rate / 1e9:g} Gbit/s each way")
        else:
            say(
                f"netem is NOT available here ({self.caps.get('netem_error', 'unknown qdisc')}): "
                f"rate only, with tbf at {a.rate / 1e9:g} Gbit/s each way; the delay of "
                f"{a.delay * 1e6:.0f} µs could NOT be emulated and is left out of the predictions"
            )
            self.result["notes"].append("netem missing: delay not emulated, rate-only run with tbf")
        say(f"rank0 eth0: {shown}")

    # -- calibration --
    def calibrate(self) -> None:
        """Per-message overhead ``o`` and per-byte CPU cost ``beta0`` on loopback (inside the
        switch namespace: its own 127.0.0.1), same number of ranks."""
        a = self.args
        p = a.ranks
        rounds = cost_terms("all_reduce", "doubling", 4, p)[0] or 1
        small = self.local_bench(
            "calib-small", ["-b", "4", "-e", "4", "-n", str(a.calib_iters), "-w", "20", "--algorithm", "doubling"]
        )
        t_small = small["median_us"] * 1e-6
        o = t_small / rounds
        big_n = 4 << 20
        big = self.local_bench("calib-big", ["-b", "4M", "-e", "4M", "-n", "5", "-w", "2", "--algorithm", "ring"])
        steps, link = cost_terms("all_reduce", "ring", big_n, p)
        beta0 = max(0.0, (big["time_us"] * 1e-6 - steps * o) / link)
        self.result["calibration"] = {
            "where": f"loopback 127.0.0.1 inside {self.sw}, {p} rank processes (python3 -m netcoll.bench --ranks {p})",
            "small": {"algorithm": "doubling", "size": 4, "median_us": small["median_us"], "rounds": rounds},
            "big": {"algorithm": "ring", "size": big_n, "time_us": big["time_us"]},
            "overhead_per_message_s": o,
            "beta0_s_per_byte": beta0,
        }
        say(
            f"loopback calibration: 4 B doubling all_reduce {small['median_us']:.0f} µs over {rounds} rounds "
            f"-> o = {o * 1e6:.0f} µs per message; 4 MiB ring {big['time_us'] / 1000:.1f} ms -> "
            f"beta0 = {beta0 * 1e9:.2f} ns/B ({8 / beta0 / 1e9 if beta0 else float('inf'):.1f} Gbit/s of CPU)"
        )

    def local_bench(self, tag: str, flags: list[str]) -> dict[str, Any]:
        out = os.path.join(self.tmp, f"{tag}.json")
        argv = self.in_ns(
            self.sw,
            sys.executable,
            "-m",
            "netcoll.bench",
            "--ranks",
            str(self.args.ranks),
            "-c",
            "0",
            "--no-progress",
            "--json",
            out,
            *flags,
        )
        self.run_child(tag, argv, self.env(), want=120)
        with open(out) as f:
            return json.load(f)["rows"][0]  # type: ignore[no-any-return]

    def run_child(self, tag: str, argv: list[str], env: dict[str, str], want: float) -> None:
        log = os.path.join(self.tmp, f"{tag}.log")
        proc = self.procs.start(tag, argv, env, log)
        try:
            rc = proc.wait(self.budget(want))
        except subprocess.TimeoutExpired:
            self.procs.stop(proc)
            if self.remaining() <= 1:
                raise OutOfTime(f"--limit {self.args.limit:g} s reached during {tag}") from None
            raise RuntimeError(f"{tag} took over {want:g} s") from None
        if rc != 0:
            raise RuntimeError(f"{tag} exited {rc}: {tail(log)}")

    # -- cluster --
    def start_cluster(self) -> None:
        a = self.args
        ready = os.path.join(self.tmp, "coordinator.ready")
        env = self.env(NETCOLL_TOKEN=self.token, NETCOLL_CLIENT_TOKEN=self.client_token)
        argv = self.in_ns(
            self.cns,
            sys.executable,
            "-m",
            "netcoll",
            "coordinator",
            "--host",
            self.coord_ip,
            "--port",
            str(COORD_PORT),
            "--http-port",
            "off",
            "--log-level",
            "warning",
            "--ready-file",
            ready,
        )
        coord = self.procs.start("coordinator", argv, env, os.path.join(self.tmp, "coordinator.log"))
        self.wait_for(lambda: os.path.exists(ready), "the coordinator", coord, "coordinator.log")
        for i, (ns, addr) in enumerate(zip(self.rns, self.rank_ips, strict=True)):
            argv = self.in_ns(
                ns,
                sys.executable,
                "-m",
                "netcoll",
                "rank",
                "--coordinator",
                self.coord_addr,
                "--host",
                addr,
                "--port",
                "0",
                "--http-port",
                "off",
                "--rank-hint",
                str(i),
                "--log-level",
                "warning",
            )
            self.procs.start(
                f"rank{i}", argv, self.env(NETCOLL_TOKEN=self.token), os.path.join(self.tmp, f"rank{i}.log")
            )
        members: list[dict[str, Any]] = []

        def all_joined() -> bool:
            nonlocal members
            res = subprocess.run(
                self.in_ns(
                    self.cns, sys.executable, "-m", "netcoll", "status", "--json", "--coordinator", self.coord_addr
                ),
                capture_output=True,
                text=True,
                env=self.env(NETCOLL_CLIENT_TOKEN=self.client_token),
                cwd=self.tmp,
                timeout=self.budget(20),
                check=False,
            )
            if res.returncode != 0:
                return False
            members = json.loads(res.stdout).get("members") or []
            return len(members) >= a.ranks

        self.wait_for(all_joined, f"{a.ranks} rank daemons to join", coord, "coordinator.log", interval=0.5)
        hosts = sorted(str(m.get("host") or m.get("address") or "?") for m in members)
        self.result["members"] = hosts
        res = subprocess.run(
            self.in_ns(self.cns, sys.executable, "-c", "import netcoll, os; print(os.path.dirname(netcoll.__file__))"),
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=self.tmp,
            timeout=self.budget(30),
            check=False,
        )
        self.result["netcoll_imported_from"] = res.stdout.strip() or res.stderr.strip()
        say(f"the processes run netcoll from {self.result['netcoll_imported_from']}")
        say(
            f"coordinator (pid {coord.pid}) on {self.coord_addr} in {self.cns}; {len(members)} rank daemons "
            f"joined from {', '.join(hosts)}; member and client tokens generated"
            + (" (--insecure also set)" if a.insecure else "")
        )

    def wait_for(
        self, ok: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], log: str, interval: float = 0.1
    ) -> None:
        end = time.monotonic() + self.budget(60)
        while not ok():
            if proc.poll() is not None:
                log_tail = tail(os.path.join(self.tmp, log))
                raise RuntimeError(f"waiting for {what}: pid {proc.pid} exited {proc.returncode}: {log_tail}")
            if time.monotonic() > end:
                raise RuntimeError(f"timed out waiting for {what}: {tail(os.path.join(self.tmp, log))}")
            time.sleep(interval)

    # -- sweeps --
    def remote_bench(self, tag: str, flags: list[str]) -> list[dict[str, Any]]:
        """``python3 -m netcoll.bench --coordinator ...`` from the coordinator's namespace
        (client token only); its rows."""
        out = os.path.join(self.tmp, f"{tag}.json")
        argv = self.in_ns(
            self.cns,
            sys.executable,
            "-m",
            "netcoll.bench",
            "--coordinator",
            self.coord_addr,
            "--no-progress",
            "--json",
            out,
            *flags,
        )
        self.run_child(tag, argv, self.env(NETCOLL_CLIENT_TOKEN=self.client_token), want=self.args.limit)
        with open(out) as f:
            return list(json.load(f)["rows"])

    def calibrate_veth(self) -> None:
        """The same two calibration calls through the rank daemons over the veths, before any
        shaping: the per-message overhead of the path the sweep measures."""
        a, p = self.args, self.args.ranks
        rounds = cost_terms("all_reduce", "doubling", 4, p)[0] or 1
        iters = str(max(10, a.calib_iters // 2))
        small = self.remote_bench(
            "veth-small", ["-b", "4", "-e", "4", "-n", iters, "-w", "10", "--algorithm", "doubling"]
        )
        big = self.remote_bench("veth-big", ["-b", "4M", "-e", "4M", "-n", "5", "-w", "2", "--algorithm", "ring"])
        o = small[0]["time_us"] * 1e-6 / rounds
        steps, link = cost_terms("all_reduce", "ring", 4 << 20, p)
        beta0 = max(0.0, (big[0]["time_us"] * 1e-6 - steps * o) / link)
        self.result["calibration_veth"] = {
            "where": "rank daemons over the unshaped veths (jobs: time = mean over calls of the slowest rank)",
            "small": {"algorithm": "doubling", "size": 4, "time_us": small[0]["time_us"], "rounds": rounds},
            "big": {"algorithm": "ring", "size": 4 << 20, "time_us": big[0]["time_us"]},
            "overhead_per_message_s": o,
            "beta0_s_per_byte": beta0,
        }
        say(
            f"unshaped veth calibration (daemons): 4 B doubling {small[0]['time_us']:.0f} µs -> o = {o * 1e6:.0f} µs; "
            f"4 MiB ring {big[0]['time_us'] / 1000:.1f} ms -> beta0 = {beta0 * 1e9:.2f} ns/B"
        )

    def sweep(self, op: str, algorithm: str, repeat: int = 0) -> None:
        """One sweep of ``op`` with ``algorithm``; a repeat adds its times to the first one's
        rows (``time_us`` is then the median over repeats, each repeat in ``times_us``)."""
        a = self.args
        flags = ["--op", op, "--algorithm", algorithm, "-b", str(a.minbytes), "-e", str(a.maxbytes)]
        flags += ["-f", str(a.stepfactor), "-n", str(a.iters), "-w", str(a.warmup)]
        t = time.monotonic()
        rows = self.remote_bench(f"sweep-{op}-{algorithm}-{repeat}", flags)
        wrong = sum(r.get("wrong") or 0 for r in rows)
        keys = ("size", "count", "time_us", "busbw", "wrong", "rank_time_us", "job")
        mine = next((sw for sw in self.result["sweeps"] if (sw["op"], sw["algorithm"]) == (op, algorithm)), None)
        if mine is None:
            mine = {"op": op, "algorithm": algorithm, "seconds": 0.0, "rows": []}
            for r in rows:
                row = {k: r.get(k) for k in keys}
                row["times_us"] = [r["time_us"]]
                mine["rows"].append(row)
            self.result["sweeps"].append(mine)
        else:
            by_size = {r["size"]: r for r in rows}
            for row in mine["rows"]:
                r = by_size.get(row["size"])
                if r is None:
                    continue
                row["times_us"].append(r["time_us"])
                row["wrong"] = (row["wrong"] or 0) + (r.get("wrong") or 0)
                row["time_us"] = statistics.median(row["times_us"])
        mine["seconds"] = round(mine["seconds"] + time.monotonic() - t, 2)
        say(
            f"{op:<10} {algorithm:<8} {len(rows)} sizes in {time.monotonic() - t:5.1f} s"
            + (f" (repeat {repeat + 1})" if a.repeats > 1 else "")
            + ("" if not wrong else f"  ({wrong} WRONG elements)")
        )

    def link_stats(self) -> None:
        """Bytes each rank's shaped uplink carried: proof that the traffic crossed the emulated links."""
        if self.shaping == "none":
            return
        sent = []
        for ns in self.rns:
            text = self.host.ns(ns, "tc", "-s", "qdisc", "show", "dev", "eth0", check=False).stdout
            m = re.search(r"Sent (\d+) bytes", text)
            sent.append(int(m.group(1)) if m else None)
        self.result["qdisc_sent_bytes"] = sent
        total = sum(x or 0 for x in sent)
        say(f"bytes sent through the shaped rank uplinks: {', '.join(fmt_size(x or 0) for x in sent)}")
        if self.result["sweeps"] and self.args.maxbytes >= 1 << 20 and total < self.args.maxbytes:
            say("WARNING: far fewer bytes crossed the shaped links than the sweep moved")
            self.result["notes"].append("the shaped links carried less than the sweep moved")

    # -- predictions --
    def predict(self) -> None:
        a = self.args
        cal = self.result["calibration_veth" if a.overhead == "veth" else "calibration"]
        o, beta0 = cal["overhead_per_message_s"], cal["beta0_s_per_byte"]
        beta = 8.0 / a.rate if self.shaping != "none" else 0.0
        alpha = self.delay_applied + o
        cost = load_cost_module(a.netcoll_path, REPO)
        net = Model(alpha, beta, a.ranks, cost)
        cpu = Model(alpha, beta + beta0, a.ranks, cost)
        self.result["model"] = {
            "formula": "T = steps * alpha + link_bytes * beta "
            "(netcoll/algorithms cost headers; link_bytes: the busiest link direction)",
            "overhead_from": "calibration_veth" if a.overhead == "veth" else "calibration (loopback)",
            "alpha_s": alpha,
            "beta_s_per_byte": beta,
            "beta0_s_per_byte": beta0,
            "source": net.source,
            "cpu_model": "the same with beta + beta0 (the per-byte CPU cost measured on loopback)",
        }
        by_op: dict[str, dict[str, Any]] = {}
        for sw in self.result["sweeps"]:
            op, alg = sw["op"], sw["algorithm"]
            for r in sw["rows"]:
                r["predicted_us"] = net.seconds(op, alg, r["size"]) * 1e6
                r["predicted_cpu_us"] = cpu.seconds(op, alg, r["size"]) * 1e6
                if alg != "auto":
                    r["predicted_local_formulas_us"] = net.local(op, alg, r["size"]) * 1e6
                if alg == "auto":
                    r["auto_runs"] = auto_choice(op, r["size"], a.ranks)
            by_op.setdefault(op, {})[alg] = sw["rows"]
        self.result["model"]["source"] = net.source
        summary = {}
        for op, algs in by_op.items():
            fixed = {k: v for k, v in algs.items() if k != "auto"}
            measured = {k: [(r["size"], r["time_us"]) for r in v if r["size"] > 0] for k, v in fixed.items()}
            predicted = {k: [(r["size"], r["predicted_us"]) for r in v if r["size"] > 0] for k, v in fixed.items()}
            # the model's crossovers on a fine grid over the same range, for the exact sizes
            lo = max(1, min((s for pts in measured.values() for s, _ in pts), default=1))
            hi = max((s for pts in measured.values() for s, _ in pts), default=1)
            grid = sorted({round(lo * (hi / lo) ** (i / 400)) for i in range(401)}) if hi > lo else [lo]
            fine = {k: [(s, net.seconds(op, k, s)) for s in grid] for k in fixed}
            summary[op] = {
                "measured_crossovers": crossovers(measured, smooth=True),
                "measured_crossovers_raw": crossovers(measured),
                "predicted_crossovers": crossovers(fine),
                "predicted_crossovers_cpu_model": crossovers(
                    {k: [(s, cpu.seconds(op, k, s)) for s in grid] for k in fixed}
                ),
                "predicted_crossovers_on_sampled_sizes": crossovers(predicted),
            }
        self.result["crossovers"] = summary


def tail(path: str, n: int = 6) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:]) or "(empty log)"


# -- report -----------------------------------------------------------------------------------------
def text_table(result: dict[str, Any]) -> str:
    lines = []
    by_op: dict[str, list[dict[str, Any]]] = {}
    for sw in result.get("sweeps", []):
        by_op.setdefault(sw["op"], []).append(sw)
    for op, sweeps in by_op.items():
        algs = [s["algorithm"] for s in sweeps]
        sizes = sorted({r["size"] for s in sweeps for r in s["rows"]})
        lines.append(f"\n{op}, {result['ranks']} ranks: measured / predicted (per call)")
        lines.append(f"{'size':>9} | " + " | ".join(f"{a:^23}" for a in algs))
        for size in sizes:
            cells = []
            for s in sweeps:
                r = next((r for r in s["rows"] if r["size"] == size), None)
                cells.append(f"{fmt_us(r['time_us']):>10} / {fmt_us(r.get('predicted_us')):<10}" if r else f"{'':23}")
            lines.append(f"{fmt_size(size):>9} | " + " | ".join(cells))
        cx = result.get("crossovers", {}).get(op, {})
        for kind in ("measured_crossovers", "predicted_crossovers", "predicted_crossovers_cpu_model"):
            items = cx.get(kind) or []
            text = ", ".join(f"{c['from']}→{c['to']} at {fmt_size(c['at'])}" for c in items) or "none in range"
            lines.append(f"  {kind.replace('_', ' ')}: {text}")
    return "\n".join(lines)


def xs_all(sweeps: list[dict[str, Any]]) -> list[int]:
    return [r["size"] for sw in sweeps for r in sw["rows"] if r["size"] > 0] or [1]


def plot(result: dict[str, Any], path: str) -> str | None:
    """time vs size per collective, measured (solid) and predicted (dashed), crossovers marked.
    Returns why it was skipped, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib)"
    by_op: dict[str, list[dict[str, Any]]] = {}
    for sw in result.get("sweeps", []):
        by_op.setdefault(sw["op"], []).append(sw)
    if not by_op:
        return "no measurements"
    fig, axes = plt.subplots(len(by_op), 1, figsize=(11, 5.2 * len(by_op)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (op, sweeps) in zip(axes[:, 0], by_op.items(), strict=True):
        for i, sw in enumerate(sweeps):
            rows = [r for r in sw["rows"] if r["size"] > 0]
            xs = [r["size"] for r in rows]
            c = "black" if sw["algorithm"] == "auto" else colors[i % len(colors)]
            ax.plot(xs, [r["time_us"] for r in rows], "o-", color=c, label=f"{sw['algorithm']} measured", ms=4)
            if sw["algorithm"] != "auto":
                ys = [r["predicted_us"] for r in rows]
                ax.plot(xs, ys, "--", color=c, alpha=0.8, label=f"{sw['algorithm']} predicted")
        cx = result.get("crossovers", {}).get(op, {})
        ymax = max(r["time_us"] for sw in sweeps for r in sw["rows"])
        ymin = min(
            min(r["time_us"], r.get("predicted_us") or r["time_us"]) for sw in sweeps for r in sw["rows"] if r["size"]
        )
        marks = [("pred", "grey", "--", c) for c in cx.get("predicted_crossovers", [])]
        marks += [("meas", "red", ":", c) for c in cx.get("measured_crossovers", [])]
        for k, (kind, color, ls, c) in enumerate(marks):
            ax.axvline(c["at"], color=color, ls=ls, lw=1.0)
            y = ymax * (ymin / ymax) ** (0.04 + 0.1 * (k % 6))  # stagger the labels down the log axis
            text = f" {kind} {c['from']}→{c['to']} {fmt_size(c['at'])}"
            ax.text(c["at"], y, text, fontsize=7, va="top", color=color)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = [x for x in (4 << (2 * k) for k in range(16)) if min(xs_all(sweeps)) <= x <= max(xs_all(sweeps))]
        ax.set_xticks(ticks, [fmt_size(t) for t in ticks], fontsize=8)
        ax.set_xlabel("size")
        ax.set_ylabel("time per call (µs)")
        ax.set_title(f"{op}, {result['ranks']} ranks: measured (solid) and predicted (dashed)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    shaping = result["shaping"]
    rate = result.get("rate_bits_per_s")
    link = (
        f"netem {result['delay_applied_s'] * 1e6:.0f} µs + {rate / 1e9:g} Gbit/s"
        if shaping == "netem"
        else f"tbf {rate / 1e9:g} Gbit/s, delay not emulated"
        if shaping == "tbf"
        else "unshaped veths"
    )
    m = result.get("model", {})
    fig.suptitle(
        f"netcoll over an emulated network ({link})\npredicted: alpha = {m.get('alpha_s', 0) * 1e6:.0f} µs, "
        f"beta = {m.get('beta_s_per_byte', 0) * 1e9:.2f} ns/B; crossovers: grey = predicted, red = measured",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# -- main -------------------------------------------------------------------------------------------
def private_subnet(text: str) -> str:
    try:
        net = ipaddress.ip_network(f"{text}.0/24")
    except ValueError:
        raise argparse.ArgumentTypeError(f"--subnet wants three octets like 10.213.7, got {text!r}") from None
    if not net.is_private or net.is_loopback or net.is_link_local:
        raise argparse.ArgumentTypeError(f"--subnet {text}.0/24 is not a private (10/8, 172.16/12, 192.168/16) range")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 bench/netem.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Needs root and iproute2 (ip, tc); without them it says so and exits 0. "
        "Everything it creates is named ncX-<pid>-* and removed at the end.",
    )
    p.add_argument("--ranks", type=int, default=4, help="rank daemons, one namespace each (default 4)")
    p.add_argument(
        "--delay", type=parse_delay, default=parse_delay("200us"), help="one-way delay per link (default 200us)"
    )
    p.add_argument("--rate", type=parse_rate, default=parse_rate("1gbit"), help="link rate, each way (default 1gbit)")
    p.add_argument(
        "--shape",
        choices=("auto", "netem", "tbf", "none"),
        default="auto",
        help="auto: netem (delay + rate) if the kernel has it, else tbf (rate only); none: plain veths",
    )
    p.add_argument(
        "--ops", default="all_reduce", help="comma-separated: all_reduce, all_gather, broadcast (default all_reduce)"
    )
    p.add_argument(
        "--algorithms",
        default=None,
        help="comma-separated, for every op (default: each op's fixed algorithms and auto)",
    )
    p.add_argument("-b", "--minbytes", type=parse_size, default=4, help="smallest size (default 4)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=16 << 20, help="largest size (default 16M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier (default 4)")
    p.add_argument("-n", "--iters", type=int, default=10, help="timed calls per size (default 10)")
    p.add_argument("-w", "--warmup", type=int, default=3, help="warmup calls per size (default 3)")
    p.add_argument(
        "--overhead",
        choices=("loopback", "veth"),
        default="loopback",
        help="per-message overhead o in alpha: from the loopback calibration (default) or the daemons over "
        "the unshaped veths",
    )
    p.add_argument("--skip-veth-calibration", action="store_true", help="no daemon calibration before shaping")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every sweep this many times, interleaved; a row's time is the median (default 1)",
    )
    p.add_argument(
        "--calib-iters", type=int, default=200, help="calls of the 4-byte loopback calibration (default 200)"
    )
    p.add_argument("--limit", type=float, default=900.0, help="bound on the whole run, seconds (default 900)")
    p.add_argument(
        "--subnet", type=private_subnet, default="10.213.7", help="private /24 inside the namespaces (default 10.213.7)"
    )
    p.add_argument(
        "--json", default="netem-results.json", metavar="PATH", help="results (default ./netem-results.json)"
    )
    p.add_argument(
        "--plot", default=None, metavar="PNG", help="plot (default: the JSON path with .png; needs matplotlib)"
    )
    p.add_argument("--no-plot", action="store_true", help="no plot")
    p.add_argument("--insecure", action="store_true", help="also pass NETCOLL_INSECURE=1 (tokens are generated anyway)")
    p.add_argument(
        "--netcoll-path",
        default=REPO,
        type=os.path.abspath,
        metavar="DIR",
        help="the netcoll checkout the processes run (default: this one), e.g. a `git archive HEAD` copy",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (their directory is printed)")
    p.add_argument(
        "--from-json", metavar="PATH", help="re-print the table and redraw the plot of an earlier run; run nothing"
    )
    p.add_argument("--check", action="store_true", help="only report what this machine allows, then exit 0")
    p.add_argument(
        "--ip", default=os.environ.get("NETCOLL_NETEM_IP", "ip"), help="the ip binary (env NETCOLL_NETEM_IP)"
    )
    p.add_argument(
        "--tc", default=os.environ.get("NETCOLL_NETEM_TC", "tc"), help="the tc binary (env NETCOLL_NETEM_TC)"
    )
    return p


def plan(args: argparse.Namespace) -> list[tuple[str, str]]:
    steps = []
    for op in [o.strip() for o in args.ops.split(",") if o.strip()]:
        if op not in DEFAULT_ALGORITHMS:
            raise SystemExit(f"netem: --ops: {op!r} is not one of {', '.join(DEFAULT_ALGORITHMS)}")
        algs = [x.strip() for x in args.algorithms.split(",")] if args.algorithms else list(DEFAULT_ALGORITHMS[op])
        for alg in algs:
            if alg not in DEFAULT_ALGORITHMS[op]:
                known = ", ".join(DEFAULT_ALGORITHMS[op])
                raise SystemExit(f"netem: --algorithms: {op} has no {alg!r} (has {known})")
            steps.append((op, alg))
    return steps


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP raise Interrupted (so every finally runs)."""

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """While cleaning up: a second Ctrl-C must not leave half of it undone."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.ranks < 2:
        raise SystemExit("netem: --ranks must be >= 2")
    if args.repeats < 1 or args.iters < 1:
        raise SystemExit("netem: --repeats and -n must be >= 1")
    if args.ranks > 200:
        raise SystemExit("netem: --ranks must be <= 200 (one /24)")
    if args.overhead == "veth" and args.skip_veth_calibration:
        raise SystemExit("netem: --overhead veth needs the veth calibration (drop --skip-veth-calibration)")
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
        print(text_table(result))
        if not args.no_plot:
            png = args.plot or os.path.splitext(args.from_json)[0] + ".png"
            why = plot(result, png)
            say(f"plot skipped: {why}" if why else f"plot written to {png}")
        return 0
    steps = plan(args)
    t0 = time.monotonic()
    try:
        caps = probe(args.ip, args.tc, f"{PREFIX}-{os.getpid()}")
    except Skip as exc:
        say(f"skipped: {exc}. Nothing was created; exiting 0.")
        return 0
    allowed = ", ".join(k for k in ("netns", "veth", "bridge", "netem", "tbf") if caps.get(k))
    say(f"this machine allows: {allowed}" + ("" if caps["netem"] else f"; no netem ({caps.get('netem_error', '?')})"))
    if not caps["netem"] and not caps["tbf"] and args.shape != "none":
        say("skipped: neither netem nor tbf qdiscs work here, so there is nothing to emulate; exiting 0")
        return 0
    if args.shape == "netem" and not caps["netem"]:
        say("skipped: --shape netem asked for, but the kernel has no netem; exiting 0")
        return 0
    if args.shape == "tbf" and not caps["tbf"]:
        say("skipped: --shape tbf asked for, but tbf does not work here; exiting 0")
        return 0
    if args.check:
        return 0
    run = Run(args, caps)
    status, problems = 0, []
    try:
        with signals_raise():
            try:
                run.build()
                run.calibrate()
                run.start_cluster()
                if not args.skip_veth_calibration:
                    run.calibrate_veth()
                run.shape()
                run.result["loadavg_before"] = os.getloadavg()
                for repeat in range(args.repeats):
                    for op, alg in steps:
                        run.sweep(op, alg, repeat)
                run.result["loadavg_after"] = os.getloadavg()
                say(
                    "1-minute load average {:.1f} before the sweeps, {:.1f} after (2 cores here: other work on the "
                    "machine shows in the times)".format(
                        run.result["loadavg_before"][0], run.result["loadavg_after"][0]
                    )
                )
                run.link_stats()
            except OutOfTime as exc:
                say(f"stopped early: {exc}; keeping the sweeps finished so far")
                run.result["truncated"] = str(exc)
            except Interrupted as exc:
                say(f"interrupted ({exc}): cleaning up")
                run.result["interrupted"] = str(exc)
                status = 130
            except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
                say(f"FAILED: {exc}")
                run.result["error"] = str(exc)
                status = 1
    finally:
        with signals_ignored():
            problems = run.procs.stop_all() + run.host.delete_all()
            if args.keep_logs or status == 1:
                say(f"logs kept in {run.tmp}")
            else:
                shutil.rmtree(run.tmp, ignore_errors=True)
    run.result["pids"] = run.procs.pids
    run.result["cleanup"] = {"ok": not problems, "problems": problems, "namespaces_deleted": run.host.created == []}
    say(
        f"cleaned up: stopped {len(run.procs.pids)} processes by PID, deleted {run.host.deleted} namespaces "
        "(with their veths and the bridge)" + ("" if not problems else "; PROBLEMS: " + "; ".join(problems))
    )
    if problems and status == 0:
        status = 1
    if status == 130:
        return status
    if run.result["sweeps"] and ("calibration_veth" if args.overhead == "veth" else "calibration") in run.result:
        try:
            run.predict()
        except Exception as exc:  # noqa: BLE001 - the measurements are still worth writing
            say(f"predictions failed: {exc!r}")
            run.result["predict_error"] = repr(exc)
            status = status or 1
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
        "subnet": f"{args.subnet}.0/24",
        "limit_s": args.limit,
    }
    run.result["generated"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    run.result["command"] = "python3 bench/netem.py " + " ".join(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(run.result, f, indent=1)
        f.write("\n")
    print(text_table(run.result))
    say(f"results written to {args.json}")
    if not args.no_plot and run.result["sweeps"]:
        png = args.plot or os.path.splitext(args.json)[0] + ".png"
        why = plot(run.result, png)
        say(f"plot skipped: {why}; the JSON and the table above have everything" if why else f"plot written to {png}")
    return status


if __name__ == "__main__":
    _path = next((sys.argv[i + 1] for i, x in enumerate(sys.argv[:-1]) if x == "--netcoll-path"), REPO)
    sys.path.insert(0, os.path.abspath(_path))
    sys.exit(main())
