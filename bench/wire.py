"""Compressed all_reduce and DDP against torch Gloo on an emulated network (issue 36.4):
``--ranks`` rank processes, one per network namespace, joined by veth pairs through a
bridge, every rank link shaped by ``tbf`` to ``--rate`` each way (``--slow-rank R
--slow-factor F``: rank R's link F times slower, both ways). Every rank process holds a
netcoll session (torch's ``netcoll`` backend as the default group) and a Gloo group over
the same addresses (``new_group(backend="gloo")``), so Gloo and netcoll cross the very
same shaped links in the same run, their calls interleaved (bench/wire_worker.py).

    python3 -m bench.wire --json bench/wire-results.json --run even --ddp        # from the repository root
    python3 -m bench.wire --json bench/wire-results.json --run slow --slow-rank 3 --slow-factor 4 \\
        --codecs none --algorithms ring,weighted
    python3 -m bench.wire --render-docs bench/wire-results.json   # docs' tables from the JSON alone

The delay: this kernel's ``netem`` qdisc is what would add a one-way delay that both
netcoll and Gloo see; without it (``--check`` says) the links get the rate alone and the
run records a delay of 0 for both: netcoll's own delay line (bench/netem.py's ``line``
shaping) would delay netcoll's bytes and not Gloo's. At 64 MiB over 1 Gbit/s a ring's
``2(P-1)`` steps of 200 µs are 1.2 ms of a call of about 800 ms.

Each measurement is one call (one DDP step) timed by every rank between two barriers;
its time is the slowest rank's, a case's figure the median over ``--reps`` repetitions.
Needs root, iproute2 and torch; without them it says why and exits 0. Everything it
creates (processes by PID, namespaces ``ncW-<pid>-*``) is removed at the end, and the run is
bounded by ``--limit`` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench import machine, wire_report
from bench.netemlib import capabilities
from bench.netemlib.cluster import Procs
from bench.netemlib.common import Skip, parse_rate, parse_size, say, tail, tc_rate
from bench.netemlib.netns import Host
from bench.netemlib.run import signals_ignored, signals_raise
from bench.tls import make_pki

PREFIX = "ncW"
COORD_PORT, MASTER_PORT = 29400, 29500


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m bench.wire", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rate", type=parse_rate, default=parse_rate("1gbit"), help="link rate each way (default 1gbit)")
    p.add_argument("--slow-rank", type=int, default=None, help="this rank's link is --slow-factor times slower")
    p.add_argument("--slow-factor", type=float, default=4.0)
    p.add_argument("--size", type=parse_size, default=64 << 20, help="all_reduce bytes of float32 (default 64M)")
    p.add_argument("--codecs", default="none,fp16,bf16,int8", help="netcoll's codecs (comma-separated)")
    p.add_argument("--algorithms", default="auto", help="netcoll's all_reduce algorithms (comma-separated)")
    p.add_argument("--no-gloo", action="store_true", help="leave torch Gloo out")
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("--ddp", action="store_true", help="also DDP step time (bench/ddp.py's MLP)")
    p.add_argument("--ddp-codecs", default="none,fp16", help="netcoll's codecs for DDP (NETCOLL_COMPRESSION)")
    p.add_argument(
        "--ddp-hook",
        default="",
        help="feedback: netcoll.torch.compression_hook(codec, error_feedback=True) (branch feedback); "
        "module:function(ddp_model, group): registers a comm hook itself",
    )
    p.add_argument("--ddp-width", type=int, default=1536, help="MLP width: 9.5 width^2 parameters (22.4 M)")
    p.add_argument("--ddp-steps", type=int, default=6, help="steps per DDP case and repetition")
    p.add_argument(
        "--ddp-warmup",
        type=int,
        default=2,
        help="of which the first ones not timed (the first runs before DDP rebuilds its buckets, the second"
        " is the first on the rebuilt ones)",
    )
    p.add_argument(
        "--link",
        choices=("tcp", "tls"),
        default="tcp",
        help="netcoll's links (tls: mutual TLS, certificates from a throwaway CA; needs the test extra)",
    )
    p.add_argument("--cost-model", action="store_true", help="NETCOLL_COST_MODEL=1 in the ranks (calibration: rates)")
    p.add_argument(
        "--netcoll-path", default=None, help="import netcoll from this checkout in the ranks (bench/ from here)"
    )
    p.add_argument("--subnet", default="10.213.9", help="three octets of a private /24 (default 10.213.9)")
    p.add_argument("--limit", type=float, default=900.0, help="seconds the whole run may take (default 900)")
    p.add_argument("--run", default="even", help="the run's name in the JSON (default even)")
    p.add_argument("--json", default=None, help="add (or replace) this run in a JSON file")
    p.add_argument("--check", action="store_true", help="only say what this machine allows")
    p.add_argument("--render-docs", metavar="JSON", help="rewrite the docs' generated tables from JSON; run nothing")
    return p


def cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The all_reduce cases: Gloo, then netcoll per (algorithm, codec)."""
    out = [] if args.no_gloo else [{"label": "gloo", "impl": "gloo"}]
    for alg in args.algorithms.split(","):
        for codec in args.codecs.split(","):
            label = f"netcoll {codec}" + ("" if alg == "auto" else f" {alg}")
            out.append({"label": label, "impl": "netcoll", "compression": codec, "algorithm": alg})
    return out


def ddp_cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"label": "gloo", "impl": "gloo"}]
    for codec in args.ddp_codecs.split(","):
        out.append({"label": f"netcoll {codec}", "impl": "netcoll", "compression": codec})
        if args.ddp_hook and codec != "none":
            out.append(
                {
                    "label": f"netcoll {codec} + hook",
                    "impl": "netcoll",
                    "compression": "none",
                    "hook": args.ddp_hook,
                    "codec": codec,
                }
            )
    return out


class Net:
    """The namespaces (a switch with a bridge holding the coordinator's address, one per
    rank), the shaped links, the processes; all removed by :meth:`close`."""

    def __init__(self, args: argparse.Namespace, caps: dict[str, Any]) -> None:
        self.args = args
        self.prefix = f"{PREFIX}-{os.getpid()}"
        self.host = Host(caps["ip"], caps["tc"], self.prefix)
        self.procs = Procs()
        self.tmp = tempfile.mkdtemp(prefix="netcoll-wire-")
        self.sw = f"{self.prefix}-sw"
        self.rns = [f"{self.prefix}-r{i}" for i in range(args.ranks)]
        self.coord_ip = f"{args.subnet}.1"
        self.ips = [f"{args.subnet}.{10 + i}" for i in range(args.ranks)]
        self.token = secrets.token_hex(24)
        self.pki = make_pki(self.tmp) if args.link == "tls" else {}

    def rate(self, rank: int) -> float:
        slow = self.args.slow_rank is not None and rank == self.args.slow_rank
        return float(self.args.rate / self.args.slow_factor if slow else self.args.rate)

    def build(self) -> None:
        h = self.host
        h.add_netns(self.sw)
        h.ns(self.sw, "link", "set", "lo", "up")
        h.ns(self.sw, "link", "add", "br0", "type", "bridge")
        h.ns(self.sw, "addr", "add", f"{self.coord_ip}/24", "dev", "br0")
        h.ns(self.sw, "link", "set", "br0", "up")
        for i, (ns, ip) in enumerate(zip(self.rns, self.ips, strict=True)):
            h.add_netns(ns)
            h.ns(ns, "link", "set", "lo", "up")
            h.ns(ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns", self.sw)
            h.ns(ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            h.ns(ns, "link", "set", "eth0", "up")
            h.ns(self.sw, "link", "set", f"p{i}", "master", "br0")
            h.ns(self.sw, "link", "set", f"p{i}", "up")
            rate = self.rate(i)
            burst = max(32 * 1024, int(rate / 8 * 1e-3))  # 1 ms of the rate, at least 32 KiB
            tbf = ("tbf", "rate", tc_rate(rate), "burst", str(burst), "latency", "100ms")
            h.ns(ns, "tc", "qdisc", "add", "dev", "eth0", "root", *tbf)  # the rank's uplink
            h.ns(self.sw, "tc", "qdisc", "add", "dev", f"p{i}", "root", *tbf)  # its downlink

    def _netcoll_only(self) -> str:
        """A directory holding only ``netcoll`` (a link to ``--netcoll-path``'s), so the ranks
        import netcoll from there and everything else, ``bench`` included, from here (the
        other checkout first on the path would also have put its own ``bench`` first)."""
        only = os.path.join(self.tmp, "netcoll-only")
        if not os.path.isdir(only):
            os.mkdir(only)
            os.symlink(os.path.join(os.path.abspath(self.args.netcoll_path), "netcoll"), os.path.join(only, "netcoll"))
        return only

    def env(self, rank: int | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NETCOLL_", "GLOO_"))}
        env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NETCOLL_TOKEN=self.token)
        env.update(NETCOLL_TRANSPORT=self.args.link)  # namespaces do not separate /dev/shm: no shared memory
        env.update(self.pki)  # tls: the coordinator and every rank present the bench's certificate
        path = machine.ROOT if not self.args.netcoll_path else os.pathsep.join([self._netcoll_only(), machine.ROOT])
        env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if self.args.cost_model:
            env["NETCOLL_COST_MODEL"] = "1"
        if rank is not None:
            env.update(RANK=str(rank), WORLD_SIZE=str(self.args.ranks), MASTER_ADDR=self.ips[0])
            env.update(MASTER_PORT=str(MASTER_PORT), GLOO_SOCKET_IFNAME="eth0")
            env.update(NETCOLL_COORDINATOR=f"{self.coord_ip}:{COORD_PORT}", NETCOLL_WORLD_SIZE=str(self.args.ranks))
            env.update(NETCOLL_RANK=str(rank))
        return env

    def start(self, name: str, ns: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        full = [self.host.ip, "netns", "exec", ns, sys.executable, *argv]
        return self.procs.start(name, full, env, os.path.join(self.tmp, f"{name}.log"))

    def close(self) -> list[str]:
        with signals_ignored():
            problems = self.procs.stop_all() + self.host.delete_all()
            shutil.rmtree(self.tmp, ignore_errors=True)
        return problems


def _wait(net: Net, procs: list[subprocess.Popen[bytes]], deadline: float) -> None:
    for i, proc in enumerate(procs):
        try:
            rc = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"--limit reached; rank {i}: {tail(os.path.join(net.tmp, f'rank{i}.log'))}") from None
        if rc != 0:
            raise RuntimeError(f"rank {i} exited {rc}: {tail(os.path.join(net.tmp, f'rank{i}.log'), 15)}")


def measure(net: Net, deadline: float) -> list[list[dict[str, Any]]]:
    """Coordinator, rank processes, their JSON lines (one list per rank)."""
    a = net.args
    ready = os.path.join(net.tmp, "coordinator.ready")
    coord_argv = ["-m", "netcoll", "coordinator", "--host", net.coord_ip, "--port", str(COORD_PORT)]
    coord_argv += ["--http-port", "off", "--log-level", "warning", "--ready-file", ready]
    net.start("coordinator", net.sw, coord_argv, net.env())
    while not os.path.exists(ready):
        if time.monotonic() > deadline:
            raise RuntimeError("the coordinator did not start")
        time.sleep(0.1)
    argv = ["-m", "bench.wire_worker", "--cases", json.dumps(cases(a)), "--size", str(a.size)]
    argv += ["--reps", str(a.reps), "--ddp-width", str(a.ddp_width), "--ddp-steps", str(a.ddp_steps)]
    argv += ["--ddp-warmup", str(a.ddp_warmup)]
    if a.ddp:
        argv += ["--ddp", json.dumps(ddp_cases(a))]
    procs = [net.start(f"rank{i}", ns, argv, net.env(i)) for i, ns in enumerate(net.rns)]
    _wait(net, procs, deadline)
    lines = []
    for i in range(a.ranks):
        with open(os.path.join(net.tmp, f"rank{i}.log")) as f:
            lines.append([json.loads(x) for x in f if x.startswith("{")])
    return lines


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        caps = capabilities.probe("ip", "tc", f"{PREFIX}-{os.getpid()}")
    except Skip as exc:
        say(f"skipped: {exc}. Nothing was created; exiting 0.")
        return 0
    say(f"netem: {caps['netem']} ({caps.get('netem_error', 'works')}); tbf: {caps['tbf']}")
    if args.check or not caps["tbf"]:
        return 0
    net = Net(args, caps)
    load = machine.loadavg()
    status, lines, problems = 0, [], []
    try:
        with signals_raise():
            net.build()
            lines = measure(net, t0 + args.limit - 20)
    except Exception as exc:  # noqa: BLE001 - said, then the cleanup
        say(f"FAILED: {exc}")
        status = 1
    finally:
        problems = net.close()
    say(
        f"cleaned up: {len(net.procs.pids)} processes stopped by PID, {net.host.deleted} namespaces deleted"
        + ("" if not problems else "; PROBLEMS: " + "; ".join(problems))
    )
    if status or not lines:
        return status or 1
    result = wire_report.summarize(args, lines, caps, command="python3 -m bench.wire " + " ".join(sys.argv[1:]))
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    result["loadavg_1min_before"] = load
    result["cleanup"] = {"ok": not problems, "problems": problems}
    print(wire_report.text(result))
    if args.json:
        wire_report.store(args.json, args.run, result)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.ddp_warmup < args.ddp_steps:
        parser.error(f"--ddp-warmup {args.ddp_warmup} must be at least 0 and below --ddp-steps {args.ddp_steps}")
    if args.render_docs:
        return wire_report.render_docs(args.render_docs)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
