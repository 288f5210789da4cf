"""``netcoll bench``: an nccl-tests-style sweep over a local cluster of rank processes.

    python -m netcoll.bench --ranks 4 -b 4 -e 64M -f 4 --op all
    python -m netcoll.bench --op all_reduce -b 1M -e 16M --json out.json --plot out.png

Two entry points for the command line (``netcoll bench`` wires exactly these):

* :func:`add_arguments` adds the flags to an ``argparse`` parser;
* :func:`run` (a coroutine) runs the benchmark for the parsed arguments and
  returns the exit code: 0 ok, 1 a rank failed or a result was wrong, 2 bad
  arguments or an unsupported mode.

Flags follow nccl-tests (``-b -e -f -n -w -c -r``, ``-d`` for the data type),
except that ``--op`` names the *collective* (as in ``netcoll bench``) and the
reduction operator is ``-o/--redop``. Only out-of-place calls are timed; the
table's in-place columns print ``N/A``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from .common import OPS, SweepConfig, parse_size

__all__ = ["add_arguments", "config_from_args", "main", "run"]


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``netcoll bench``'s flags to ``parser``."""
    ops = "|".join((*OPS, "all"))
    parser.add_argument("op_positional", nargs="?", metavar="OP", default=None,
                        help=f"collective(s) to run, like --op ({ops})")
    parser.add_argument("--op", default=None, metavar="OP",
                        help=f"collective, comma-separated list, or all: {ops} (default all_reduce)")
    g = parser.add_argument_group("sweep (as nccl-tests)")
    g.add_argument("-b", "--minbytes", type=_size, default=4, metavar="SIZE",
                   help="smallest size, e.g. 4, 4K, 4KiB, 64M, 1G (binary units; default 4)")
    g.add_argument("-e", "--maxbytes", type=_size, default=64 << 20, metavar="SIZE",
                   help="largest size (default 64M)")
    g.add_argument("-f", "--stepfactor", type=int, default=4, metavar="F", help="size multiplier (default 4)")
    g.add_argument("-n", "--iters", type=int, default=20, metavar="N", help="timed calls per size (default 20)")
    g.add_argument("-w", "--warmup_iters", "--warmup", dest="warmup", type=int, default=5, metavar="N",
                   help="untimed calls per size first (default 5)")
    g.add_argument("-d", "--dtype", "--datatype", dest="dtype", default="float32",
                   help="element type: float32 (float), float64 (double), float16 (half), bfloat16, int8, "
                        "uint8, int32, uint32, int64, uint64, ... (default float32)")
    g.add_argument("-o", "--redop", default="sum", help="reduction: sum prod min max avg band bor bxor (default sum)")
    g.add_argument("-r", "--root", type=int, default=0, help="root rank of rooted collectives (default 0)")
    g.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                   help="verify every result against numpy (#wrong; default 1)")
    g.add_argument("--algorithm", default="auto", help="auto (default), ring, tree, doubling, ...")
    g.add_argument("--segment-bytes", type=_size, default=None, metavar="SIZE",
                   help="largest message a collective sends (default: netcoll's)")
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="deadline of each call")
    c = parser.add_argument_group("cluster")
    c.add_argument("--ranks", type=int, default=4, metavar="N",
                   help="start a local cluster: a coordinator and N rank processes on 127.0.0.1 (default 4)")
    c.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="run the sweep as jobs on the rank daemons of a running coordinator "
                        "(netcoll up, compose, Kubernetes) instead of a local cluster")
    c.add_argument("--loop", default="auto", choices=("auto", "spin", "asyncio", "uvloop"),
                   help="event loop of the rank processes (default auto = spin: asyncio with a briefly "
                        "spinning selector, see netcoll.loop)")
    o = parser.add_argument_group("output")
    o.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="write {meta, rows} as JSON to PATH (or stdout, instead of the table)")
    o.add_argument("--plot", default=None, metavar="PNG", help="draw busbw and time against size (needs matplotlib)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar (shown only on a terminal anyway)")


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    """The sweep the parsed arguments ask for. Raises ValueError."""
    pos, flag = getattr(args, "op_positional", None), getattr(args, "op", None)
    if pos is not None and flag is not None and pos != flag:
        raise ValueError(f"collective given twice: {pos!r} and --op {flag!r}")
    return SweepConfig(
        ops=pos or flag or "all_reduce", minbytes=args.minbytes, maxbytes=args.maxbytes,
        stepfactor=args.stepfactor, iters=args.iters, warmup=args.warmup, dtype=args.dtype, redop=args.redop,
        root=args.root, check=bool(args.check), algorithm=args.algorithm, segment_bytes=args.segment_bytes,
        timeout=args.timeout,
    ).validate()


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _err(msg: str) -> None:
    print(f"netcoll bench: {msg}", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> int:
    """Run the benchmark ``args`` describe; print the table (or JSON); return the exit code."""
    from ..errors import NetcollError
    from . import report
    from .local import BenchError, run_local
    from .remote import RemoteBenchError

    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        _err(f"error: {exc}")
        return 2
    if args.ranks < 1:
        _err(f"error: --ranks must be >= 1, got {args.ranks}")
        return 2
    if args.root >= args.ranks and not args.coordinator:
        _err(f"error: -r/--root {args.root} is not a rank of {args.ranks} ranks")
        return 2
    if args.plot:
        try:
            report.require_matplotlib()
        except report.PlotUnavailable as exc:
            _err(f"error: {exc}")
            return 2

    json_to_stdout = args.json == "-"
    total = len(cfg.ops) * len(cfg.sizes())
    progress = report.Progress(total) if (not args.no_progress and report.Progress.wanted()) else None
    table = None if json_to_stdout else report.LiveTable(sys.stdout, progress)
    import netcoll

    def on_event(ev: dict[str, Any]) -> None:
        if ev["event"] == "ranks" and table is not None:
            table.start({"config": cfg.to_json(), "netcoll": netcoll.__version__,
                         "world_size": len(ev["ranks"]),
                         "transport": f"tcp, rank daemons at {args.coordinator}" if args.coordinator
                         else "tcp, loopback 127.0.0.1", "loop": args.loop, "ranks": ev["ranks"]})
        elif ev["event"] == "row" and table is not None:
            table.row(ev["row"])
        if progress is not None:
            progress.on_event(ev)

    try:
        try:
            if args.coordinator:
                from .remote import run_remote
                result = await run_remote(cfg, args.coordinator, token=os.environ.get("NETCOLL_TOKEN") or None,
                                          on_event=on_event)
            else:
                result = await run_local(cfg, args.ranks, on_event=on_event, loop=args.loop)
        finally:
            if progress is not None:
                progress.clear()
        rows, meta = result["rows"], result["meta"]
        if table is not None:
            table.finish()
        if args.json:
            text = report.to_json(meta, rows)
            if json_to_stdout:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()
            else:
                with open(args.json, "w") as f:
                    f.write(text + "\n")
    except BrokenPipeError:  # stdout closed early (| head): stop quietly, like other CLI tools
        _silence_stdout()
        return 141
    except (BenchError, RemoteBenchError, NetcollError, OSError, TimeoutError) as exc:
        _err(str(exc))
        return 1
    if args.plot:
        report.plot(rows, args.plot, title=f"netcoll, {args.ranks} ranks, {cfg.dtype}")
        _err(f"plot written to {args.plot}")
    wrong = sum(r["wrong"] or 0 for r in rows)
    if wrong:
        _err(f"{wrong} wrong elements: results FAILED verification")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m netcoll.bench``."""
    parser = argparse.ArgumentParser(prog="python -m netcoll.bench",
                                     description="nccl-tests-style collective benchmark over a local cluster "
                                                 "of netcoll rank processes.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
