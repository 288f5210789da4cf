"""Large messages at any window (issue 38): one collective of ``--size`` per rank, run
by ``netcoll run`` as a user runs it (one process per rank, ``netcoll.sync``), over
TCP and over shared memory, with the default settings and with the receive window and
the result pool at their smallest allowed values. Every rank checks its result.

``--size`` is nccl-tests' size: the largest buffer a rank holds (all_reduce and
broadcast: the array; all_gather: the output, each rank giving a ``1/P`` block;
reduce_scatter: the input, each rank getting a ``1/P`` block). Reported per run: time
(the slowest rank, the best of ``--iters`` calls, and the first), bus bandwidth, every
rank's peak RSS, and whether it was right.

    python3 bench/bigmessage.py                                   # 1 GiB, 4 ranks, the whole matrix
    python3 bench/bigmessage.py --size 300M --ops all_reduce --links tcp --settings default
    python3 bench/bigmessage.py --json bench/bigmessage-results.json
    python3 bench/bigmessage.py --render bench/bigmessage-results.json   # the docs' table

Loopback only: the launcher's coordinator and the ranks listen on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from netcoll.links.factory import MIN_WINDOW
from netcoll.sizes import format_size, parse_size

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
#: (name, environment): the receive window and result pool at their defaults, or smallest
SETTINGS = {"default": {}, "minimum": {"NETCOLL_RECV_WINDOW": str(MIN_WINDOW), "NETCOLL_RESULT_POOL": "0"}}
BUSBW: dict[str, Callable[[int], float]] = {"all_reduce": lambda p: 2 * (p - 1) / p, "broadcast": lambda p: 1.0}
MARK = "BIGMESSAGE "
PATTERN = np.arange(1021, dtype=np.float32)  # the broadcast's data: PATTERN repeated


def _busbw_other(p: int) -> float:
    """The busbw factor of all_gather and reduce_scatter: (P - 1) / P."""
    return (p - 1) / p


def _is_pattern(got: np.ndarray) -> bool:
    """Whether ``got`` is PATTERN repeated (checked a piece at a time: no second copy)."""
    piece = np.resize(PATTERN, len(PATTERN) * 4096)
    return all(np.array_equal(got[i : i + len(piece)], piece[: len(got) - i]) for i in range(0, len(got), len(piece)))


def worker(op: str, size: int, iters: int) -> None:
    """One rank (under ``netcoll run``): run ``op`` ``iters`` times (timing the calls only),
    check every result, print a JSON line."""
    import netcoll.sync

    with netcoll.sync.connect(timeout=600) as comm:
        p, r = comm.world_size, comm.rank
        n = size // 4 // p * p  # float32 elements, a multiple of P
        call: Callable[[], Any]  # the collective on this rank's input
        if op == "all_reduce":
            call = functools.partial(comm.all_reduce, np.full(n, r + 1, np.float32))
        elif op == "broadcast":
            call = functools.partial(comm.broadcast, np.resize(PATTERN, n) if r == 0 else None)
        elif op == "all_gather":
            call = functools.partial(comm.all_gather, np.full(n // p, r, np.float32))
        else:
            call = functools.partial(comm.reduce_scatter, np.full((p, n // p), r + 1, np.float32))
        seconds, right = [], True
        for _ in range(iters):
            comm.barrier()
            start = time.perf_counter()
            got = call()
            seconds.append(time.perf_counter() - start)
            right &= _right(op, np.asarray(got), p)
            del got
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(MARK + json.dumps({"rank": r, "seconds": seconds, "right": right, "peak_rss": rss}), flush=True)


def _right(op: str, got: np.ndarray, p: int) -> bool:
    if op == "broadcast":
        return _is_pattern(got.view(np.float32))
    if op == "all_gather":
        return bool((got == np.arange(p, dtype=np.float32)[:, None]).all())
    return bool((got == p * (p + 1) // 2).all())


def run(op: str, size: int, ranks: int, links: str, settings: str, limit: float, iters: int) -> dict[str, Any]:
    env = {**os.environ, **SETTINGS[settings], "NETCOLL_TRANSPORT": "tcp" if links == "tcp" else "auto"}
    cmd = [sys.executable, "-m", "netcoll", "run", "-n", str(ranks), __file__, "--worker", op, "--size", str(size)]
    cmd += ["--iters", str(iters)]
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit, check=False)
        rows = [json.loads(line.split(MARK, 1)[1]) for line in out.stdout.splitlines() if MARK in line]
        error = None if out.returncode == 0 else out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]
    except subprocess.TimeoutExpired:
        rows, error = [], [f"no result within {limit:g}s"]
    row: dict[str, Any] = {"op": op, "bytes": size, "ranks": ranks, "links": links, "settings": settings}
    row["wall_s"] = round(time.perf_counter() - start, 2)
    if error or len(rows) != ranks:
        row.update(ok=False, error=" ".join(error or ["missing rank results"]))
        return row
    per_call = [max(x["seconds"][i] for x in rows) for i in range(iters)]  # the slowest rank, each call
    seconds = min(per_call)
    row.update(
        ok=all(x["right"] for x in rows),
        seconds=round(seconds, 3),
        first_s=round(per_call[0], 3),
        busbw_gbs=round(size * BUSBW.get(op, _busbw_other)(ranks) / seconds / 1e9, 3),
        peak_rss=[x["peak_rss"] for x in sorted(rows, key=lambda x: x["rank"])],
    )
    return row


def render(path: str) -> str:
    """The rows of a ``--json`` file as the Markdown table docs/benchmarks.md shows."""
    with open(path) as f:
        data = json.load(f)
    lines = [
        "| collective | links | settings | best s | first s | busbw GB/s | peak RSS (worst rank) | right |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in data["rows"]:
        if not r["ok"]:
            lines.append(f"| {r['op']} | {r['links']} | {r['settings']} | | | | | NO: {r.get('error', 'wrong')} |")
            continue
        rss = max(r["peak_rss"]) / 2**30
        lines.append(
            f"| {r['op']} | {r['links']} | {r['settings']} | {r['seconds']:.2f} | {r['first_s']:.2f}"
            f" | {r['busbw_gbs']:.2f} | {rss:.2f} GiB | yes |"
        )
    sizes = {format_size(r["bytes"]) for r in data["rows"]}
    ranks = {r["ranks"] for r in data["rows"]}
    lines.append("")
    lines.append(
        f"_{', '.join(sorted(sizes))} per rank at {', '.join(map(str, sorted(ranks)))} ranks; {data['date']};"
        f" {data['machine']['cpus']} CPUs, Python {data['machine']['python']}; from `{path}`._"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--worker", choices=OPS, help=argparse.SUPPRESS)
    ap.add_argument("--size", default="1G", help="bytes per rank (default 1G)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--iters", type=int, default=3, help="calls per run: the best is reported, and the first")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--links", default="tcp,shm")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--limit", type=float, default=900.0, help="seconds one run may take")
    ap.add_argument("--json", help="write the rows (and the machine) to this file")
    ap.add_argument("--render", metavar="JSON", help="print a --json file's rows as a Markdown table, and stop")
    args = ap.parse_args()
    if args.render:
        print(render(args.render))
        return
    size = parse_size(args.size)
    if args.worker:
        worker(args.worker, size, args.iters)
        return
    rows = []
    for settings in args.settings.split(","):
        for links in args.links.split(","):
            for op in args.ops.split(","):
                row = run(op, size, args.ranks, links, settings, args.limit, args.iters)
                rows.append(row)
                rss = max(row.get("peak_rss") or [0])
                what = f"best {row.get('seconds', '-')} s (first {row.get('first_s', '-')} s)"
                what += f", busbw {row.get('busbw_gbs', '-')} GB/s, peak RSS {format_size(rss)}"
                verdict = "right" if row["ok"] else f"FAILED: {row.get('error', 'wrong result')}"
                print(f"{op:15} {format_size(size):>8} {links:4} {settings:8} {what}: {verdict}", flush=True)
    if args.json:
        machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()}
        with open(args.json, "w") as f:
            json.dump(
                {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine, "rows": rows},
                f,
                indent=1,
            )
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
