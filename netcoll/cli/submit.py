"""``netcoll submit``: run one collective job on the rank daemons and wait for it.

The collectives, their arguments and their algorithms come from the registry
(:mod:`netcoll.collectives`); sizes parse with :func:`netcoll.sizes.parse_size`.
Exit 0 iff the job succeeded; Ctrl-C cancels the job (exit 130).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from .. import collectives
from ..choices import REDUCE_OPS, check_algorithm, check_arguments, check_collective, check_reduce_op, check_root
from ..escape import escape
from ..sizes import format_size, size_arg
from .common import FORMATTER, CliError, JsonDoc, add_client_arguments, flags, mean, print_json, run_client
from .connect import connected
from .errors import one_line
from .progress import ProgressDisplay, plural

if TYPE_CHECKING:
    from ..config import SubmitConfig
    from ..service.client import Client
    from ..service.jobs import JobSpec
    from .common import Subparsers

HELP = "run a collective job on the rank daemons"
EXAMPLES = (
    "examples:\n  netcoll submit all_reduce --size 64MiB --iters 5\n"
    "  netcoll submit reduce --dtype int32 --op max --root 2 --json\n"
)


def collective_arg(text: str) -> str:
    """``type=`` of OP: a collective of the registry, or a usage error with the choices
    and, for a near miss, "did you mean" (the same words as the coordinator's)."""
    try:
        return check_collective(text).name
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid choice: {exc}".replace("unknown collective ", "")) from None


def _reduce_op_arg(text: str) -> str:
    try:
        return check_reduce_op(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid choice: {exc}".replace("unknown reduction ", "")) from None


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    names = collectives.NAMES
    sp = sub.add_parser(
        "submit",
        formatter_class=FORMATTER,
        help=HELP,
        description="Submit a collective job on generated data (verified on every rank) and wait\n"
        "for it. Exit 0 iff it succeeded.",
        epilog=EXAMPLES
        + "\nalgorithms (--algorithm; auto picks by size and number of ranks):\n"
        + collectives.algorithms_help(),
    )
    sp.add_argument("op", type=collective_arg, metavar="OP", help=" | ".join(names))
    _add_job_arguments(sp)
    sp.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="show progress on stderr while the job waits and runs: a bar on a terminal, else a "
        "line per update (default: on when stderr is a terminal; elsewhere only what a queued job "
        "waits for; --no-progress: nothing)",
    )
    add_client_arguments(sp)
    sp.add_argument(
        "--trace",
        metavar="FILE",
        help="record the job's timeline on every rank and write it to FILE as a Chrome trace "
        "(open it in https://ui.perfetto.dev)",
    )
    sp.set_defaults(handler=run)
    return sp


def _add_job_arguments(sp: argparse.ArgumentParser) -> None:
    """The flags of the job itself: data, reduction, root, algorithm, iterations, ranks, deadline."""
    sp.add_argument(
        "--size",
        type=size_arg,
        metavar="SIZE",
        help="bytes per rank: 4096, 4KiB, 64MiB, 1.5M, 1G, 12MB (K/M/G and KiB/MiB/GiB are powers of 1024, "
        "KB/MB/GB of 1000; default 1MiB)",
    )
    sp.add_argument("--dtype", help="float32 (default), float64, float16, bfloat16, int32, int8, bool, ...")
    sp.add_argument(
        "--op",
        dest="reduce_op",
        type=_reduce_op_arg,
        metavar="REDOP",
        help="reduction: " + " ".join(REDUCE_OPS) + " (default sum)",
    )
    sp.add_argument("--root", type=int, help="root rank of broadcast/reduce/gather/scatter (default 0)")
    sp.add_argument("--algorithm", metavar="NAME", help="auto (default) or one of OP's algorithms (listed below)")
    sp.add_argument(
        "--compression",
        choices=["none", "fp16", "bf16", "int8"],
        help="codec of all_reduce, reduce, reduce_scatter, all_gather, broadcast on float data "
        "(default: the rank daemons' NETCOLL_COMPRESSION, else none); docs/compression.md",
    )
    sp.add_argument("--iters", type=int, metavar="K", help="timed iterations (default 1)")
    sp.add_argument("--warmup", type=int, metavar="W", help="untimed iterations first (default 0)")
    sp.add_argument(
        "--world-size",
        type=int,
        metavar="N",
        help="run on exactly N ranks, waiting for them (default: every ready rank daemon)",
    )
    sp.add_argument(
        "--deadline",
        type=float,
        metavar="SECONDS",
        help="how long the job may take from when the coordinator takes it up, waiting for its ranks "
        "included: a job whose ranks never come fails then, saying what it waited for (default 300)",
    )
    sp.add_argument("--input", metavar="NAME", help="use the named tensor kept on the ranks instead of generated data")
    sp.add_argument("--output", metavar="NAME", help="keep the result on the ranks under this name")


def run(ns: argparse.Namespace) -> int:
    from ..config import SubmitConfig

    trace_file = vars(ns).pop("trace", None)
    with JsonDoc(bool(ns.json_output), coordinator=ns.coordinator) as doc:  # --json: one object, whatever happens
        cfg = SubmitConfig.load(flags(ns))
        doc["coordinator"] = cfg.coordinator
        spec = job_spec(cfg, trace=trace_file is not None)
        rec = run_client(_submit(cfg, spec, progress_mode(cfg.progress, sys.stderr.isatty()), trace_file, doc))
    if cfg.json_output:
        print_json(job_json(rec, cfg.coordinator))
    else:
        print_job(rec)
    if rec["state"] != "succeeded":
        reason = " ".join(str(rec.get("error") or "no reason given").split())
        raise CliError(f"job {rec['id']} {rec['state']}: {reason}")
    return 0


def progress_mode(flag: bool | None, tty: bool) -> str:
    """What shows on stderr while the job waits and runs: ``"all"`` (``--progress``, or a
    terminal), ``"waiting"`` (the default elsewhere: what a queued job waits for, so a job
    waiting for ranks never waits silently), ``"none"`` (``--no-progress``)."""
    if flag is None:
        return "all" if tty else "waiting"
    return "all" if flag else "none"


def job_spec(cfg: SubmitConfig, *, trace: bool = False) -> JobSpec:
    """The job, checked before anything is sent (exit 2): the names first, which need no
    numpy (collective, flags it does not take, algorithm, root against --world-size), then
    all of it (dtype, reduction, size ...) as the coordinator will check it
    (:mod:`netcoll.choices`)."""
    try:
        coll = check_collective(cfg.op)
        check_arguments(coll, given_arguments(cfg))
        check_algorithm(coll, cfg.algorithm)
        check_root(coll, cfg.root, cfg.world_size)
        from ..service.jobs import JobSpec

        return JobSpec(**cfg.job_fields(), trace=trace)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        raise CliError(f"invalid job: {one_line(exc)}", 2) from None


#: SubmitConfig field -> (the argument of choices.check_arguments, its flag)
_ARGUMENT_FLAGS = {
    "reduce_op": ("op", "--op"),
    "root": ("root", "--root"),
    "size": ("data", "--size"),
    "dtype": ("data", "--dtype"),
    "input": ("data", "--input"),
    "output": ("data", "--output"),
}


def given_arguments(cfg: SubmitConfig) -> dict[str, str]:
    """The job arguments given on the command line, by argument (``{"op": "--op"}``)."""
    given: dict[str, str] = {}
    for field, (arg, flag) in _ARGUMENT_FLAGS.items():
        if field in cfg.model_fields_set:
            given.setdefault(arg, flag)
    return given


async def _submit(
    cfg: SubmitConfig, spec: JobSpec, progress: str, trace_file: str | None = None, doc: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Check the root against the ranks, submit, then wait for the job's record
    (Ctrl-C / SIGTERM cancel it), showing on stderr what :func:`progress_mode` says; with
    ``trace_file``, write the job's Chrome trace there. ``doc`` notes the job's id."""
    async with connected(cfg) as client:
        await _check_root(client, spec)
        job_id = await client.submit(spec)
        if doc is not None:
            doc["id"] = job_id
        rec = await (_watch(client, job_id, spec, progress) if progress != "none" else _wait_or_cancel(client, job_id))
        if trace_file is not None:
            _write_trace(trace_file, await client.trace(job_id))
        return rec


async def _watch(client: Client, job_id: int, spec: JobSpec, progress: str = "all") -> dict[str, Any]:
    """Wait for the job's record while its progress (or, ``"waiting"``, only what it waits
    for) shows on stderr."""
    display = ProgressDisplay(job_id, spec.op, waiting_only=progress == "waiting")
    watching = asyncio.ensure_future(_show_progress(client, job_id, display))
    rec: dict[str, Any] | None = None
    try:
        rec = await _wait_or_cancel(client, job_id)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        display.finish(None if rec is None else str(rec["state"]), rec)  # before any error line
    return rec


def _write_trace(path: str, doc: dict[str, Any]) -> None:
    import json

    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f)
    except OSError as exc:
        raise CliError(f"cannot write the trace to {path}: {exc.strerror or exc}") from None
    ranks = sum(1 for e in doc.get("traceEvents", ()) if e.get("name") == "process_name")
    sys.stderr.write(f"trace: {path} ({len(doc.get('traceEvents', ()))} events from {ranks} ranks)\n")


async def _show_progress(client: Client, job_id: int, display: ProgressDisplay) -> None:
    async for event in client.progress(job_id):
        display.show(event)


async def _check_root(client: Client, spec: JobSpec) -> None:
    """A job on every ready daemon (no --world-size) needs its root among them: ask the
    coordinator how many there are, before anything is queued (exit 2 otherwise)."""
    coll = spec.collective
    if coll is None or not coll.takes_root or spec.world_size is not None or spec.root == 0:
        return
    members = (await client.status()).get("members") or []
    ready = sum(m.get("state") != "draining" for m in members)
    try:
        check_root(coll, spec.root, max(ready, 1))
    except ValueError as exc:
        raise CliError(
            f"invalid job: {exc}: {plural(ready, 'rank daemon')} ready at the coordinator "
            "(--world-size N waits for N ranks)",
            2,
        ) from None


async def _wait_or_cancel(client: Client, job_id: int) -> dict[str, Any]:
    """The finished job's record; on SIGINT/SIGTERM cancel the job and raise (exit 130)."""
    import signal

    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, interrupted.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    wait = asyncio.ensure_future(client.wait(job_id))
    stop = asyncio.ensure_future(interrupted.wait())
    try:
        await asyncio.wait({wait, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        stop.cancel()
    if wait.done():
        result: dict[str, Any] = wait.result()
        return result
    wait.cancel()
    try:
        await asyncio.wait_for(client.cancel(job_id), 5.0)
        what = f"cancelled job {job_id}"
    except Exception:  # noqa: BLE001 - best effort
        what = f"job {job_id} may still run"
    raise CliError(f"interrupted: {what}", 130)


def job_json(rec: dict[str, Any], coordinator: str) -> dict[str, Any]:
    """The ``--json`` document: the record without result arrays, plus mean seconds per
    iteration on each rank (every time in it is in seconds; bandwidths in GB/s)."""
    doc = {k: v for k, v in rec.items() if k != "result"}
    doc["rank_time_s"] = {r: mean(t) for r, t in (rec.get("timings") or {}).items()}
    doc["coordinator"] = coordinator
    return doc


def _job_data_line(rec: dict[str, Any]) -> str | None:
    """What the job ran on: data, reduction, root, codec, algorithm, iterations (None for barrier)."""
    spec = rec.get("spec") or {}
    coll = collectives.REGISTRY.get(rec["op"])
    if coll is None or not coll.has_data:
        return None
    data = (
        f"named tensor {spec.get('input')!r}"
        if spec.get("data") == "buffer"
        else f"{format_size(spec.get('size'))} {spec.get('dtype')} per rank"
    )
    extra = f", op {spec.get('reduce_op')}" if coll.takes_op else ""
    extra += f", root {spec.get('root')}" if coll.takes_root else ""
    extra += f", compression {spec['compression']}" if spec.get("compression") not in (None, "none") else ""
    warmup = f" + {spec.get('warmup')} warm-up" if spec.get("warmup") else ""
    iters = spec.get("iters")
    count = plural(iters, "iteration") if isinstance(iters, int) else f"{iters} iterations"
    return f"  {data}{extra}, algorithm {_algorithm(rec, spec)}, {count}{warmup}"


def _algorithm(rec: dict[str, Any], spec: dict[str, Any]) -> str:
    """``ring``, or for ``auto`` what it ran: ``auto (ran ring)`` (``auto`` when the record
    does not say: the job did not run)."""
    from ..service.records import chosen

    asked = escape(spec.get("algorithm"), 40)
    ran = chosen(rec, rec["op"]) if asked == "auto" and rec.get("state") == "succeeded" else None
    return f"auto (ran {escape(ran['algorithm'], 40)})" if ran else asked


def print_job(rec: dict[str, Any]) -> None:
    """The job as text: outcome, what ran, time and bandwidth, and time per rank."""
    from ..service.local import gbps, human_time

    state = rec["state"]
    world = rec.get("world_size") or 0
    where = f" on {world} ranks (epoch {rec.get('epoch')})" if world else ""
    state = escape(state, 40)
    print(f"job {rec['id']} {escape(rec['op'], 40)}: {state if state == 'succeeded' else state.upper()}{where}")
    line = _job_data_line(rec)
    if line is not None:
        print(line)
    if state == "succeeded":
        verified = {True: "yes", False: "NO", None: "-"}[rec.get("verified")]
        print(
            f"  time {human_time(rec.get('time_s'))}/iter   algbw {gbps(rec.get('algbw'))} GB/s   "
            f"busbw {gbps(rec.get('busbw'))} GB/s   verified {verified}"
        )
    timings = rec.get("timings") or {}
    if timings:
        addresses = {str(r["rank"]): r.get("address") for r in rec.get("ranks") or []}
        print(f"  {'rank':>4}  {'address':<22}{'mean time':>12}")
        for r in sorted(timings, key=int):
            address = escape(addresses.get(r) or "-", 60)
            print(f"  {escape(r, 8):>4}  {address:<22}{human_time(mean(timings[r])):>12}")
        if state == "succeeded":  # why the time above exceeds each mean below
            print("  (time/iter is the mean of each iteration's slowest rank, so it is at least every rank's mean)")
