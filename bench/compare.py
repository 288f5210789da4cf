#!/usr/bin/env python3
"""netcoll side by side with Gloo and MPI on this machine, written into docs/benchmarks.md.

    python3 bench/compare.py --ranks 2 4 8 16              # the sweep of bench/regenerate.sh
    python3 bench/compare.py --ranks 2 16 -b 4 -e 64K -n 3 -w 1 --op all_reduce --no-doc --json /tmp/x.json
    python3 bench/compare.py --from-json bench/results.json # re-render the doc and its plots only

For every world size it runs the same sweep (same sizes, geometry and busbw factors:
:mod:`netcoll.bench.common`) through each implementation of :mod:`bench.runners`: netcoll
over TCP (``NETCOLL_TRANSPORT=tcp``), netcoll's default (``auto``; labelled by the link kind
it used; when that is TCP too it is not measured twice), Gloo, MPI over TCP and MPI with Open
MPI's defaults (shared memory), each with a dedicated 4-byte all_reduce latency run. Then the
peak resident memory per rank during a 64 MiB all_reduce. Raw results go to
``bench/results.json``; the report (:mod:`bench.report`, :mod:`bench.report_scaling`) and the
plots (:mod:`bench.plots`) are rendered from that JSON alone, between the ``BEGIN GENERATED``
/ ``END GENERATED`` markers of docs/benchmarks.md (the hand-written text is kept).

``--rounds R`` runs every implementation R times at world sizes up to ``--rounds-ranks``
(default 4), interleaved (once per round, the order rotated each round), and keeps for every
cell the run with its median time: the machine's drift then falls on every column alike.

With more than 4 ranks the sizes from ``--split-bytes`` (1 MiB) up time fewer calls,
``iters·4/P`` (at least 3) after ``warmup·4/P`` (at least 1), so that 16 rank processes on two
cores finish in minutes; ``--no-scale-iters`` turns that off.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
from typing import Any

from bench import machine, runners
from bench.labels import PEERS, label
from bench.plots import plot_all
from bench.report import BEGIN, END, compact_json, ratios, render, targets, write_doc
from netcoll.bench.common import OPS, SweepConfig, parse_ops
from netcoll.bench.local import BenchError
from netcoll.sizes import format_size, size_arg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
__all__ = ["BEGIN", "END", "main", "plan_bands", "ratios", "render", "targets", "write_doc"]


def say(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def plan_bands(cfg: SweepConfig, n: int, *, split: int = 1 << 20, scale: bool = True) -> list[SweepConfig]:
    """The sweep of ``n`` ranks as one or two runs: above 4 ranks, sizes >= ``split`` time
    ``iters·4/n`` calls (at least 3) after ``warmup·4/n`` (at least 1)."""
    sizes = cfg.sizes()
    large = [s for s in sizes if s >= split]
    iters, warmup = max(3, cfg.iters * 4 // n), max(1, cfg.warmup * 4 // n)
    if not scale or n <= 4 or not large or (iters >= cfg.iters and warmup >= cfg.warmup):
        return [cfg]
    small = [s for s in sizes if s < split]
    big = dataclasses.replace(
        cfg, minbytes=large[0], maxbytes=large[-1], iters=min(iters, cfg.iters), warmup=min(warmup, cfg.warmup)
    )
    return ([dataclasses.replace(cfg, minbytes=small[0], maxbytes=small[-1])] if small else []) + [big]


def _band(c: SweepConfig) -> dict[str, int]:
    return {"minbytes": c.minbytes, "maxbytes": c.maxbytes, "iters": c.iters, "warmup": c.warmup}


def _order(row: dict[str, Any]) -> tuple[int, int]:
    return (OPS.index(row["op"]) if row["op"] in OPS else len(OPS), row["requested"])


async def sweep(impl: str, cfgs: list[SweepConfig], n: int, ns: argparse.Namespace) -> list[dict[str, Any]]:
    """``impl``'s runs of ``cfgs`` (the bands, then the latency run) at ``n`` ranks. When the
    whole fails and there is a latency run, the bands are tried again without it."""
    try:
        return await runners.run_impl(impl, cfgs, n, ns.limit, ns.loop)
    except (RuntimeError, BenchError, TimeoutError) as exc:
        if len(cfgs) < 2 or cfgs[-1].maxbytes != 4 or not ns.latency_iters:
            raise
        say(f"  {impl} with its latency run failed ({str(exc)[:200]}); once more without it")
        return [*await runners.run_impl(impl, cfgs[:-1], n, ns.limit, ns.loop), {"rows": [], "failed": str(exc)}]


def _median_row(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The row with the median ``key`` of one cell's runs (the lower middle of an even count),
    with every run's value in ``rounds_<key>``."""
    ranked = sorted(rows, key=lambda r: r[key])
    return {**ranked[(len(ranked) - 1) // 2], f"rounds_{key}": [r[key] for r in rows]}


def median_parts(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One implementation's interleaved runs (each a list of parts: bands, then any latency
    run) as one list of parts: each cell (op, size, in place) the run with its median time."""
    if len(runs) == 1:
        return runs[0]
    merged = []
    for parts in zip(*runs, strict=True):
        cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for part in parts:
            for row in part["rows"]:
                cells.setdefault((row["op"], row["size"], row.get("in_place")), []).append(row)
        key = "median_us" if parts[0].get("latency") else "time_us"
        rows = [_median_row(rows, key) for rows in cells.values()]
        merged.append({**parts[0], "rows": rows, "rounds": len(parts)})
    return merged


async def one_world(n: int, impls: list[str], cfg: SweepConfig, ns: argparse.Namespace) -> dict[str, Any]:
    bands = plan_bands(cfg, n, split=ns.split_bytes, scale=not ns.no_scale_iters)
    run: dict[str, Any] = {"world_size": n, "notes": [], "bands": [_band(c) for c in bands], "links": {}}
    run["aliases"], run["impls"], run["latency"] = {}, {}, {}
    latency = None
    if ns.latency_iters:
        latency = dataclasses.replace(
            cfg, ops=["all_reduce"], minbytes=4, maxbytes=4, iters=ns.latency_iters,
            warmup=max(5, ns.latency_iters // 10),
        )  # fmt: skip
    todo = [impl for impl in impls if await _measured(impl, n, run, ns)]
    rounds = ns.rounds if n <= ns.rounds_ranks else 1
    run["rounds"] = rounds
    runs: dict[str, list[list[dict[str, Any]]]] = {impl: [] for impl in todo}
    for k in range(rounds if todo else 0):  # each round runs every implementation once, in rotated order
        for impl in todo[k % len(todo) :] + todo[: k % len(todo)]:
            say(
                f"{label(impl, run)}: {n} ranks, {format_size(cfg.minbytes)} .. {format_size(cfg.maxbytes)} "
                f"x{cfg.stepfactor}, {', '.join(cfg.ops)}" + (f", {len(bands)} bands" if len(bands) > 1 else "")
                + (f", round {k + 1} of {rounds}" if rounds > 1 else "")
            )  # fmt: skip
            t0 = time.time()
            try:
                parts = await sweep(impl, [*bands, latency] if latency else bands, n, ns)
            except (RuntimeError, BenchError, TimeoutError) as exc:
                say(msg := f"{label(impl, run)} at {n} ranks failed: {exc}")
                run["notes"].append(msg)
                continue
            if latency:
                parts[-1] = {**parts[-1], "latency": True}
            runs[impl].append(parts)
            say(f"  {label(impl, run)} done in {time.time() - t0:.0f} s")
    for impl in todo:
        if runs[impl]:
            _record(run, impl, median_parts(runs[impl]), latency is not None)
    return run


async def _measured(impl: str, n: int, run: dict[str, Any], ns: argparse.Namespace) -> bool:
    """Whether ``impl`` is measured at ``n`` ranks: netcoll's default is not when its links
    there are TCP (its rows are then netcoll-TCP's)."""
    if impl != "netcoll":
        return True
    try:
        kinds = await runners.probe_links(n, "auto")
    except (RuntimeError, TimeoutError) as exc:
        kinds = []
        run["notes"].append(f"the link probe at {n} ranks failed: {exc}")
    run["links"]["netcoll"] = kinds
    say(f"netcoll's default links at {n} ranks: {', '.join(kinds) or '?'}")
    if kinds == ["tcp"] and "netcoll-tcp" in ns.impls and not ns.measure_default:
        run["aliases"]["netcoll"] = "netcoll-tcp"
        run["notes"].append(
            f"netcoll's default picked TCP links at {n} ranks, so its rows are the netcoll-TCP rows "
            "(not measured twice; --measure-default does)"
        )
        return False
    return True


def _record(run: dict[str, Any], impl: str, parts: list[dict[str, Any]], latency: bool) -> None:
    """``impl``'s rows, latency, notes and link kinds into ``run``."""
    if latency:
        lat = parts.pop()
        if lat["rows"]:
            run["latency"][impl] = lat["rows"][0]
        else:
            why = lat.get("failed", "?")
            run["notes"].append(f"{label(impl, run)} latency run at {run['world_size']} ranks failed: {why}")
    for u in (u for p in parts for u in p.get("unsupported", [])):
        note = f"{label(impl, run)} has no {u['op']} here ({u['reason']})"
        if note not in run["notes"]:
            run["notes"].append(note)
    run["impls"][impl] = sorted((r for p in parts for r in p["rows"]), key=_order)
    kinds = next((p["links"] for p in parts if p.get("links")), None)  # as netcoll's benchmark reported them
    if impl == "netcoll-tcp":
        run["links"][impl] = kinds or ["tcp"]
    elif impl == "netcoll" and kinds:
        run["links"][impl] = kinds


async def collect(ns: argparse.Namespace, cfg: SweepConfig) -> dict[str, Any]:
    peers = [p for p in ns.peers.split(",") if p]
    skipped: dict[str, str] = {}
    for p in peers:
        if why := runners.peer_available(p):
            skipped[p] = why
            say(f"skipping {label(p)}: {why}")
    modes = [m for m in ns.netcoll.split(",") if m]
    impls = [i for i, m in (("netcoll-tcp", "tcp"), ("netcoll", "auto")) if m in modes]
    impls += [p for p in PEERS if p in peers and p not in skipped]
    ns.impls = impls
    t_start, load_start, busy_start = time.time(), machine.loadavg(), machine.cpu_busy()
    if busy_start is not None and busy_start > 0.1:
        say(f"warning: the CPUs are {100 * busy_start:.0f}% busy before starting: the numbers will be skewed")
    runs = {str(n): await one_world(n, impls, cfg, ns) for n in ns.ranks}
    rss = None
    if not ns.no_rss:
        say("peak RSS during a 64 MiB all_reduce (4 ranks)")
        rss = await runners.measure_rss(4, ns.loop)
    meta = {
        **machine.facts(),
        "loop": ns.loop,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)),
        "config": cfg.to_json(),
        "command": "python3 bench/compare.py " + " ".join(sys.argv[1:]),
        "skipped": skipped,
        "statistic": machine.STAT_SWEEP,
        "latency_statistic": machine.STAT_LATENCY,
        "mpirun": machine.peer_versions().get("mpirun"),
        "mpi_commands": {
            "mpi": " ".join(runners.mpirun_command(2, "tcp")),
            "mpi-sm": " ".join(runners.mpirun_command(2, "default")),
        },
        "elapsed_s": round(time.time() - t_start),
        "rounds": {str(n): runs[str(n)]["rounds"] for n in ns.ranks},
        "loadavg_start": load_start,
        "loadavg_end": machine.loadavg(),
        "cpu_busy_start": busy_start,
    }
    return {"meta": {k: v for k, v in meta.items() if v is not None}, "runs": runs, "rss": rss}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[4], help="world sizes to run (default 4)")
    p.add_argument("-b", "--minbytes", type=size_arg, default=4)
    p.add_argument("-e", "--maxbytes", type=size_arg, default=64 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("--op", default="all", help="collective(s): a name, a comma-separated list, or all")
    p.add_argument("--peers", default="gloo,mpi,mpi-sm", help="comma-separated: gloo, mpi (TCP), mpi-sm (defaults)")
    p.add_argument("--netcoll", default="tcp,auto", help="NETCOLL_TRANSPORT modes to run: tcp, auto (default both)")
    p.add_argument(
        "--measure-default",
        action="store_true",
        help="measure netcoll's default even when it picks the same TCP links as netcoll-TCP",
    )
    p.add_argument(
        "--loop", default="auto", choices=("auto", "spin", "asyncio", "uvloop"), help="event loop of the netcoll ranks"
    )
    p.add_argument("--limit", type=float, default=1200.0, help="seconds allowed per process launch")
    p.add_argument(
        "--split-bytes",
        type=size_arg,
        default=1 << 20,
        help="above 4 ranks, sizes from here up time fewer calls (default 1M)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="interleaved runs of every implementation (the order rotated each round) at world sizes "
        "up to --rounds-ranks; each cell keeps the run with its median time (default 1)",
    )
    p.add_argument("--rounds-ranks", type=int, default=4, help="the largest world size run --rounds times (default 4)")
    p.add_argument("--no-scale-iters", action="store_true", help="the same -n/-w at every size and world size")
    p.add_argument("--no-rss", action="store_true", help="skip the peak-RSS measurement")
    p.add_argument(
        "--latency-iters",
        type=int,
        default=500,
        help="calls in the dedicated 4-byte all_reduce run of each implementation (0: the sweep's row)",
    )
    p.add_argument("--json", default=os.path.join(ROOT, "bench", "results.json"), help="raw results (written)")
    p.add_argument("--from-json", default=None, help="re-render the doc and its plots from raw results; run nothing")
    p.add_argument("--doc", default=DOC, help="markdown file to update (default docs/benchmarks.md)")
    p.add_argument("--no-doc", action="store_true", help="print the generated markdown instead of writing it")
    return p


def main(argv: list[str] | None = None) -> int:
    import json

    p = parser()
    ns = p.parse_args(argv)
    if ns.from_json:
        with open(ns.from_json) as f:
            results = json.load(f)
    else:
        try:
            cfg = SweepConfig(
                ops=parse_ops(ns.op),
                minbytes=ns.minbytes,
                maxbytes=ns.maxbytes,
                stepfactor=ns.stepfactor,
                iters=ns.iters,
                warmup=ns.warmup,
            ).validate()
        except ValueError as exc:
            p.error(str(exc))
        if ns.rounds < 1:
            p.error(f"--rounds must be at least 1, got {ns.rounds}")
        try:
            results = asyncio.run(collect(ns, cfg))
        except KeyboardInterrupt:
            say("interrupted")
            return 130
        with open(ns.json, "w") as f:
            f.write(compact_json(results))
        say(f"raw results in {os.path.relpath(ns.json)}")
    doc_dir = os.path.dirname(os.path.abspath(ns.doc))
    plots = {} if ns.no_doc else plot_all(results, doc_dir, os.path.splitext(os.path.basename(ns.doc))[0])
    text = render(results, plots)
    if ns.no_doc:
        print(text)
    else:
        write_doc(ns.doc, text)
        say(f"wrote {os.path.relpath(ns.doc)}" + (f" and {', '.join(plots.values())}" if plots else ""))
    for t, meas, verdict in targets(results):
        say(f"{verdict:>7}: {t}: {meas}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
