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

from .. import collectives, settings
from ..sizes import size_arg
from .common import OPS, SweepConfig

__all__ = ["add_arguments", "config_from_args", "main", "run"]


def algorithms_epilog(names: tuple[str, ...] = collectives.NAMES) -> str:
    """The ``--algorithm`` names of each collective, for a parser's epilog."""
    return "algorithms (--algorithm; auto picks by size and number of ranks):\n" + collectives.algorithms_help(names)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``netcoll bench``'s flags to ``parser`` (and its epilog: the algorithms)."""
    ops = "|".join((*OPS, "all"))
    parser.add_argument(
        "op_positional", nargs="?", metavar="OP", default=None, help=f"collective(s) to run, like --op ({ops})"
    )
    parser.add_argument(
        "--op", default=None, metavar="OP", help=f"collective, comma-separated list, or all: {ops} (default all_reduce)"
    )
    _add_sweep_arguments(parser.add_argument_group("sweep (as nccl-tests)"))
    _add_cluster_arguments(parser.add_argument_group("cluster"))
    _add_output_arguments(parser.add_argument_group("output"))
    parser.epilog = algorithms_epilog(OPS)


def _add_sweep_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "-b",
        "--minbytes",
        type=size_arg,
        default=4,
        metavar="SIZE",
        help="smallest size, e.g. 4, 4K, 4KiB, 1.5M, 64M, 1G (K/M/G, KiB/MiB/GiB: powers of 1024; KB/MB/GB: "
        "of 1000; default 4)",
    )
    g.add_argument(
        "-e", "--maxbytes", type=size_arg, default=64 << 20, metavar="SIZE", help="largest size (default 64M)"
    )
    g.add_argument("-f", "--stepfactor", type=int, default=4, metavar="F", help="size multiplier (default 4)")
    g.add_argument("-n", "--iters", type=int, default=20, metavar="N", help="timed calls per size (default 20)")
    g.add_argument(
        "-w",
        "--warmup_iters",
        "--warmup",
        dest="warmup",
        type=int,
        default=5,
        metavar="N",
        help="untimed calls per size first (default 5)",
    )
    g.add_argument(
        "-d",
        "--dtype",
        "--datatype",
        dest="dtype",
        default="float32",
        help="element type: float32 (float), float64 (double), float16 (half), bfloat16, int8, "
        "uint8, int32, uint32, int64, uint64, ... (default float32)",
    )
    g.add_argument("-o", "--redop", default="sum", help="reduction: sum prod min max avg band bor bxor (default sum)")
    g.add_argument("-r", "--root", type=int, default=0, help="root rank of rooted collectives (default 0)")
    g.add_argument(
        "-c",
        "--check",
        type=int,
        choices=(0, 1),
        default=1,
        help="verify every result against numpy (#wrong; default 1)",
    )
    _add_call_arguments(g)


def _add_cluster_arguments(c: argparse._ArgumentGroup) -> None:
    c.add_argument(
        "--ranks",
        type=int,
        default=4,
        metavar="N",
        help="start a local cluster: a coordinator and N rank processes on 127.0.0.1 (default 4)",
    )
    c.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="run the sweep as jobs on the rank daemons of a running coordinator "
        "(netcoll up, compose, Kubernetes) instead of a local cluster",
    )
    c.add_argument(
        "--loop",
        default="auto",
        choices=("auto", "spin", "asyncio", "uvloop"),
        help="event loop of the rank processes (default auto = spin: asyncio with a briefly "
        "spinning selector, see netcoll.loop)",
    )


def _add_output_arguments(o: argparse._ArgumentGroup) -> None:
    o.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write {meta, rows} as JSON to PATH (or stdout, instead of the table)",
    )
    o.add_argument("--plot", default=None, metavar="PNG", help="draw busbw and time against size (needs matplotlib)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar (shown only on a terminal anyway)")


def _add_call_arguments(g: argparse._ArgumentGroup) -> None:
    """How each call runs: algorithm, compression, segment size, deadline."""
    g.add_argument(
        "--algorithm",
        default="auto",
        metavar="NAME",
        help="auto (default) or a collective's algorithm (listed below); collectives without it run auto",
    )
    g.add_argument(
        "--compression",
        default="none",
        choices=["none", "fp16", "bf16", "int8"],
        help="codec of all_reduce, reduce, reduce_scatter, all_gather, broadcast (float dtypes; "
        "the others run uncompressed; default none); #wrong then allows the codec's error",
    )
    g.add_argument(
        "--segment-bytes",
        type=size_arg,
        default=None,
        metavar="SIZE",
        help="largest message a collective sends (default: netcoll's)",
    )
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="deadline of each call")


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    """The sweep the parsed arguments ask for. Raises ValueError."""
    pos, flag = getattr(args, "op_positional", None), getattr(args, "op", None)
    if pos is not None and flag is not None and pos != flag:
        raise ValueError(f"collective given twice: {pos!r} and --op {flag!r}")
    return SweepConfig(
        ops=pos or flag or "all_reduce",
        minbytes=args.minbytes,
        maxbytes=args.maxbytes,
        stepfactor=args.stepfactor,
        iters=args.iters,
        warmup=args.warmup,
        dtype=args.dtype,
        redop=args.redop,
        root=args.root,
        check=bool(args.check),
        algorithm=args.algorithm,
        compression=getattr(args, "compression", "none"),
        segment_bytes=args.segment_bytes,
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


def _check(args: argparse.Namespace) -> SweepConfig:
    """The sweep, after every check that needs no cluster. Raises ValueError (exit 2)."""
    from . import report

    cfg = config_from_args(args)
    if args.ranks < 1:
        raise ValueError(f"--ranks must be >= 1, got {args.ranks}")
    if args.root >= args.ranks and not args.coordinator:
        raise ValueError(f"-r/--root {args.root} is not a rank of {args.ranks} ranks")
    if args.plot:
        try:
            report.require_matplotlib()
        except report.PlotUnavailable as exc:
            raise ValueError(str(exc)) from None
    return cfg


class _Display:
    """The live table on stdout (unless JSON goes there) and a progress bar on a terminal."""

    def __init__(self, cfg: SweepConfig, args: argparse.Namespace) -> None:
        from . import report

        self.cfg, self.args = cfg, args
        total = len(cfg.ops) * len(cfg.sizes())
        self.progress = report.Progress(total) if (not args.no_progress and report.Progress.wanted()) else None
        self.table = None if args.json == "-" else report.LiveTable(sys.stdout, self.progress)

    def on_event(self, ev: dict[str, Any]) -> None:
        """A runner's event: the ranks (table preamble), a row, or progress."""
        import netcoll

        if ev["event"] == "ranks" and self.table is not None:
            coordinator = self.args.coordinator
            self.table.start(
                {
                    "config": self.cfg.to_json(),
                    "netcoll": netcoll.__version__,
                    "world_size": len(ev["ranks"]),
                    "transport": f"tcp, rank daemons at {coordinator}"
                    if coordinator
                    else f"{'tls' if settings.tls_files().cert else 'tcp'}, loopback 127.0.0.1",
                    "loop": self.args.loop,
                    "ranks": ev["ranks"],
                }
            )
        elif ev["event"] == "row" and self.table is not None:
            self.table.row(ev["row"])
        if self.progress is not None:
            self.progress.on_event(ev)


def _credentials(args: argparse.Namespace) -> dict[str, Any]:
    """Token, client token and TLS for ``--coordinator``, as every client command
    reads them: the flags ``netcoll bench`` adds (``--token-file``, ``--client-token``,
    ``--client-token-file``, ``--tls-*``), else ``NETCOLL_TOKEN`` / ``NETCOLL_CLIENT_TOKEN``
    (or their ``_FILE``) / ``NETCOLL_TLS_*`` (a ConfigError when unusable)."""
    from ..config import ClientConfig

    names = ("token_file", "client_token", "client_token_file", "tls_cert", "tls_key", "tls_ca")
    cfg = ClientConfig.load({name: getattr(args, name, None) for name in names})
    return {"token": cfg.token, "client_token": cfg.client_token, "tls": cfg.tls_config()}


async def _execute(cfg: SweepConfig, args: argparse.Namespace, display: _Display) -> dict[str, Any]:
    """Run the sweep on a local cluster, or as jobs at ``--coordinator``; ``{"rows", "meta"}``."""
    from .local import run_local
    from .remote import run_remote

    try:
        credentials = _credentials(args)  # flags, else the environment; checked before any rank starts
        if args.coordinator:
            return await run_remote(cfg, args.coordinator, **credentials, on_event=display.on_event)
        tls = credentials["tls"]
        if tls is not None:  # the local cluster (coordinator here, ranks as children) reads NETCOLL_TLS_*
            os.environ.update(NETCOLL_TLS_CERT=tls.cert, NETCOLL_TLS_KEY=tls.key, NETCOLL_TLS_CA=tls.ca)
        return await run_local(cfg, args.ranks, on_event=display.on_event, loop=args.loop)
    finally:
        if display.progress is not None:
            display.progress.clear()


def _write_json(path: str, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """``{meta, rows}`` to ``path`` (``-``: stdout)."""
    from . import report

    text = report.to_json(meta, rows) + "\n"
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(path, "w") as f:
            f.write(text)


def _verdict(rows: list[dict[str, Any]], args: argparse.Namespace, cfg: SweepConfig) -> int:
    """Draw the plot if asked; exit 1 if any result failed verification."""
    if args.plot:
        from . import report

        report.plot(rows, args.plot, title=f"netcoll, {args.ranks} ranks, {cfg.dtype}")
        _err(f"plot written to {args.plot}")
    wrong = sum(r["wrong"] or 0 for r in rows)
    if wrong:
        _err(f"{wrong} wrong elements: results FAILED verification")
        return 1
    return 0


async def run(args: argparse.Namespace) -> int:
    """Run the benchmark ``args`` describe; print the table (or JSON); return the exit code."""
    from ..errors import NetcollError
    from .local import BenchError
    from .remote import RemoteBenchError

    try:
        cfg = _check(args)
    except ValueError as exc:
        _err(f"error: {exc}")
        return 2
    display = _Display(cfg, args)
    try:
        result = await _execute(cfg, args, display)
        rows, meta = result["rows"], result["meta"]
        if display.table is not None:
            display.table.finish()
        if args.json:
            _write_json(args.json, meta, rows)
    except BrokenPipeError:  # stdout closed early (| head): stop quietly, like other CLI tools
        _silence_stdout()
        return 141
    except (BenchError, RemoteBenchError, NetcollError, OSError, TimeoutError) as exc:
        _err(str(exc))
        return 1
    return _verdict(rows, args, cfg)


def main(argv: list[str] | None = None) -> int:
    """``python -m netcoll.bench``."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m netcoll.bench",
        description="nccl-tests-style collective benchmark over a local cluster of netcoll rank processes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
