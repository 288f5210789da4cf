"""The command line of ``bench/netem.py``: the parser, the checks on its arguments, and the
plan (the (collective, algorithm) sweeps to run, in order)."""

from __future__ import annotations

import argparse
import ipaddress
import os

from bench.netemlib.common import DEFAULT_ALGORITHMS, REPO, parse_delay, parse_rate, parse_size

EPILOG = (
    "Needs root and iproute2 (ip, tc); without them it says so and exits 0. "
    "Everything it creates is named ncX-<pid>-* and removed at the end."
)


def private_subnet(text: str) -> str:
    try:
        net = ipaddress.ip_network(f"{text}.0/24")
    except ValueError:
        raise argparse.ArgumentTypeError(f"--subnet wants three octets like 10.213.7, got {text!r}") from None
    if not net.is_private or net.is_loopback or net.is_link_local:
        raise argparse.ArgumentTypeError(f"--subnet {text}.0/24 is not a private (10/8, 172.16/12, 192.168/16) range")
    return text


def _link_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, default=4, help="rank daemons, one namespace each (default 4)")
    p.add_argument(
        "--delay", type=parse_delay, default=parse_delay("200us"), help="one-way delay per link (default 200us)"
    )
    p.add_argument("--rate", type=parse_rate, default=parse_rate("1gbit"), help="link rate, each way (default 1gbit)")
    p.add_argument(
        "--queue",
        type=parse_delay,
        default=parse_delay("100ms"),
        help="the most a link's queue holds, as time at its rate (tbf latency, netem limit; default 100ms)",
    )
    p.add_argument(
        "--shape",
        choices=("auto", "netem", "line", "tbf", "none"),
        default="auto",
        help="auto: netem (delay + rate) if the kernel has it, else line; line: the rate by tbf and the delay by "
        "netcoll's delay line in each rank daemon (NETCOLL_EMULATE_DELAY_US); tbf: rate only; none: plain veths",
    )


def _sweep_args(p: argparse.ArgumentParser) -> None:
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


def _run_args(p: argparse.ArgumentParser) -> None:
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
        "--statistic",
        choices=("mean", "median"),
        default="mean",
        help="a job's time per call: the mean over its calls of the slowest rank (default; a stall of one "
        "call counts) or their median",
    )
    p.add_argument(
        "--calib-iters", type=int, default=200, help="calls of the 4-byte loopback calibration (default 200)"
    )
    p.add_argument("--limit", type=float, default=900.0, help="bound on the whole run, seconds (default 900)")
    p.add_argument(
        "--subnet", type=private_subnet, default="10.213.7", help="private /24 inside the namespaces (default 10.213.7)"
    )


def _output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json", default="netem-results.json", metavar="PATH", help="results (default ./netem-results.json)"
    )
    p.add_argument(
        "--plot", default=None, metavar="PNG", help="plot (default: the JSON path with .png; needs matplotlib)"
    )
    p.add_argument("--no-plot", action="store_true", help="no plot")
    p.add_argument(
        "--congestion",
        default=None,
        help="TCP congestion control of every TCP socket the processes open (e.g. cubic; set per socket "
        "through a sitecustomize; default: the namespaces' own, recorded with what ss shows after the sweeps)",
    )
    p.add_argument(
        "--idle-restart",
        choices=("keep", "off"),
        default="keep",
        help="TCP's slow start after an idle connection (net.ipv4.tcp_slow_start_after_idle) in the rank "
        "namespaces: keep the kernel's default (1), or off (0, what HPC clusters often set)",
    )
    p.add_argument(
        "--cost-model",
        action="store_true",
        help="the rank daemons run with NETCOLL_COST_MODEL=1: auto chooses by the cost model, calibrated when "
        "the group forms and refined from traffic, instead of the fixed table",
    )
    p.add_argument("--insecure", action="store_true", help="also pass NETCOLL_INSECURE=1 (tokens are generated anyway)")
    p.add_argument(
        "--netcoll-path",
        default=REPO,
        type=os.path.abspath,
        metavar="DIR",
        help="the netcoll checkout the processes run (default: this one), e.g. a `git archive HEAD` copy",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (their directory is printed)")


def _mode_args(p: argparse.ArgumentParser) -> None:
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


def build_parser(description: str) -> argparse.ArgumentParser:
    """The parser; ``description``: the first paragraph of ``bench/netem.py``'s docstring."""
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python3 -m bench.netem",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    for add in (_link_args, _sweep_args, _run_args, _output_args, _mode_args):
        add(p)
    return p


def check_args(args: argparse.Namespace) -> None:
    """SystemExit with the reason for arguments that cannot make a run."""
    if args.ranks < 2:
        raise SystemExit("netem: --ranks must be >= 2")
    if args.repeats < 1 or args.iters < 1:
        raise SystemExit("netem: --repeats and -n must be >= 1")
    if args.queue <= 0:
        raise SystemExit("netem: --queue must be more than 0 (e.g. 5ms)")
    if args.ranks > 200:
        raise SystemExit("netem: --ranks must be <= 200 (one /24)")
    if args.overhead == "veth" and args.skip_veth_calibration:
        raise SystemExit("netem: --overhead veth needs the veth calibration (drop --skip-veth-calibration)")


def plan(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The sweeps, in order: every op of ``--ops`` with each of its algorithms (or ``--algorithms``)."""
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
