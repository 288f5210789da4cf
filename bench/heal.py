"""Time to heal a joiner (issue 35 item 3): ``netcoll.elastic.heal`` of ``--size`` of
state (float32 arrays of ``--array`` bytes each, and a step counter) at ``--ranks`` ranks,
``--joiners`` of them joiners, the others live members (sources). One process per rank,
run by ``netcoll run`` on loopback, over TCP and over shared memory.

Each run heals ``2 * --iters`` times, alternately with the CRC-32 check and with
``checksum=False`` (what the check costs, measured under the same load: the machine
may be shared), each after a barrier, the joiner's arrays zeroed before and
filled in place. A heal's time is the slowest rank's; a run reports the median of each
kind. The joiner checks every byte of every heal. Also measured: CRC-32 (zlib) over
1 GiB on one core.

A rank is made a joiner by setting ``comm._joined``, as a ``regroup`` marks a newcomer
(no process needs to die and rejoin to measure a heal).

    python3 bench/heal.py                                    # 1 GiB, 4 ranks, 1 joiner, tcp and shm
    python3 bench/heal.py --json bench/heal-results.json
    python3 bench/heal.py --render bench/heal-results.json   # the docs' table
    python3 bench/heal.py --docs bench/heal-results.json     # ... written into docs/training.md

Loopback only: the launcher's coordinator and the ranks listen on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import zlib
from typing import Any

import numpy as np

from netcoll.sizes import format_size, parse_size

MARK = "HEAL "
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the markers around the table in docs/training.md (``--docs`` rewrites what is between them)
DOCS = os.path.join(ROOT, "docs", "training.md")
BEGIN, END = "<!-- heal-results -->", "<!-- /heal-results -->"


def state_of(size: int, array: int, fill: bool) -> dict[str, Any]:
    """``size`` bytes of float32 arrays of ``array`` bytes (the last one shorter), and a step."""
    model: dict[str, Any] = {}
    for k, start in enumerate(range(0, size, array)):
        n, first = min(array, size - start) // 4, start // 4
        model[f"w{k:03d}"] = np.arange(first, first + n, dtype=np.float32) if fill else np.zeros(n, np.float32)
    return {"model": model, "step": 1000 if fill else 0}


async def _worker(size: int, array: int, joiners: int, iters: int) -> None:
    import netcoll
    import netcoll.elastic

    async with netcoll.connect(collective_timeout=900) as comm:
        comm._joined = comm.rank >= comm.world_size - joiners
        state = state_of(size, array, not comm.joined)
        want = state_of(size, array, True) if comm.joined else None
        seconds: dict[str, list[float]] = {"crc32": [], "none": []}
        right = True
        for i in range(2 * iters):
            kind = ("crc32", "none")[i % 2]
            if want is not None:
                for a in state["model"].values():
                    a[:] = 0
            await comm.barrier()
            start = time.perf_counter()
            got = await netcoll.elastic.heal(comm, state, timeout=900, checksum=kind == "crc32")
            seconds[kind].append(time.perf_counter() - start)
            if want is not None:
                right &= got["step"] == 1000 and all(
                    np.array_equal(got["model"][k], v) for k, v in want["model"].items()
                )
                right &= all(got["model"][k] is state["model"][k] for k in state["model"])  # filled in place
        kinds = sorted({s["kind"] for s in comm.link_stats().values()})
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        line = {"rank": comm.rank, "joined": comm.joined, "seconds": seconds, "right": right}
        print(MARK + json.dumps({**line, "peak_rss": rss, "kinds": kinds}), flush=True)


def run(size: int, array: int, ranks: int, joiners: int, links: str, iters: int, limit: float) -> dict[str, Any]:
    """One ``netcoll run`` of the workers: the row of the results."""
    from bench.machine import loadavg

    env = {**os.environ, "NETCOLL_TRANSPORT": "tcp" if links == "tcp" else "auto"}
    cmd = [sys.executable, "-m", "netcoll", "run", "-n", str(ranks), __file__, "--worker", "--size", str(size)]
    cmd += ["--array", str(array), "--joiners", str(joiners), "--iters", str(iters)]
    row: dict[str, Any] = {"bytes": size, "array_bytes": array, "ranks": ranks, "joiners": joiners, "links": links}
    row["load_before"] = loadavg()
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit, check=False)
        rows = [json.loads(line.split(MARK, 1)[1]) for line in out.stdout.splitlines() if MARK in line]
        error = None if out.returncode == 0 else out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]
    except subprocess.TimeoutExpired:
        rows, error = [], [f"no result within {limit:g}s"]
    if error or len(rows) != ranks:
        row.update(ok=False, error=" ".join(error or ["missing rank results"]))
        return row
    rows.sort(key=lambda x: x["rank"])
    for kind in ("crc32", "none"):
        per_heal = [max(x["seconds"][kind][i] for x in rows) for i in range(iters)]  # the slowest rank, each heal
        row[f"seconds_{kind}"] = [round(s, 3) for s in per_heal]
        row[f"median_{kind}_s"] = round(statistics.median(per_heal), 3)
    row.update(
        ok=all(x["right"] for x in rows),
        kinds=sorted({k for x in rows for k in x["kinds"]}),
        gbs=round(size / row["median_crc32_s"] / 1e9, 3),
        peak_rss=[x["peak_rss"] for x in rows],
        load_after=loadavg(),
    )
    return row


def crc32_seconds(nbytes: int = 1 << 30, piece: int = 16 << 20) -> float:
    """Seconds of zlib.crc32 over ``nbytes`` (in pieces, as a joiner checks its chunks), one core."""
    buf = np.random.default_rng(0).integers(0, 255, piece, dtype=np.uint8)
    start, crc = time.perf_counter(), 0
    for _ in range(nbytes // piece):
        crc = zlib.crc32(buf.data, crc)
    return time.perf_counter() - start


def render(path: str) -> str:
    """The rows of a ``--json`` file as the Markdown table docs/training.md shows."""
    with open(path) as f:
        data = json.load(f)
    lines = [
        "| state | ranks (joiners) | links | median s | GB/s | heals (s) | no checksum: median s | peak RSS"
        " (worst rank) | load average | right |",
        "|---:|---|---|---:|---:|---|---:|---:|---|---|",
    ]
    for r in data["rows"]:
        head = f"| {format_size(r['bytes'])} | {r['ranks']} ({r['joiners']}) | {r['links']}"
        if "seconds_crc32" not in r:
            lines.append(f"{head} | | | | | | | NO: {r.get('error', 'wrong')} |")
            continue
        rss = max(r["peak_rss"]) / 2**30
        heals = ", ".join(f"{s:.2f}" for s in r["seconds_crc32"])
        right = "yes" if r["ok"] else "NO"
        load = f"{r['load_before']} → {r['load_after']}"
        lines.append(
            f"{head} | {r['median_crc32_s']:.2f} | {r['gbs']:.2f} | {heals} | {r['median_none_s']:.2f}"
            f" | {rss:.2f} GiB | {load} | {right} |"
        )
    m = data["machine"]
    lines.append("")
    lines.append(
        f"_{data['date']}; {m['cpus']} CPUs ({m['cpu']}), Python {m['python']}, numpy {m['numpy']}, netcoll "
        f"{m['netcoll']} ({m['commit']}); CRC-32 over 1 GiB on one core: {data['crc32_s_per_gib']:.2f} s;"
        f" from `{os.path.relpath(path, ROOT)}`._"
    )
    return "\n".join(lines)


def docs_with(text: str, table: str) -> str:
    """``text`` (docs/training.md) with ``table`` between the markers."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main() -> None:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="1G", help="bytes of state (default 1G)")
    ap.add_argument("--array", default="64M", help="bytes per array of the state (default 64M)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--joiners", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5, help="heals of each kind per run: the median is reported")
    ap.add_argument("--links", default="tcp,shm")
    ap.add_argument("--limit", type=float, default=1800.0, help="seconds one run may take")
    ap.add_argument("--json", help="write the rows (and the machine) to this file")
    ap.add_argument("--render", metavar="JSON", help="print a --json file's rows as a Markdown table, and stop")
    ap.add_argument("--docs", metavar="JSON", help="write a --json file's table into docs/training.md, and stop")
    args = ap.parse_args()
    if args.render:
        print(render(args.render))
        return
    if args.docs:
        with open(DOCS) as page:
            text = docs_with(page.read(), render(args.docs))
        with open(DOCS, "w") as page:
            page.write(text)
        return
    size, array = parse_size(args.size), parse_size(args.array)
    if args.worker:
        asyncio.run(_worker(size, array, args.joiners, args.iters))
        return
    rows = []
    for links in args.links.split(","):
        row = run(size, array, args.ranks, args.joiners, links, args.iters, args.limit)
        rows.append(row)
        what = f"median {row.get('median_crc32_s', '-')} s of {row.get('seconds_crc32', '-')}"
        what += f" ({row.get('median_none_s', '-')} s without the checksum)"
        verdict = "right" if row["ok"] else f"FAILED: {row.get('error', 'wrong result')}"
        print(
            f"{format_size(size)} at {args.ranks} ranks ({args.joiners} joiner) {links}: {what}: {verdict}", flush=True
        )
    crc = crc32_seconds()
    print(f"crc32 over 1 GiB, one core: {crc:.2f} s")
    if args.json:
        from bench.machine import facts

        f = facts()
        keys = ("cpu", "kernel", "python", "numpy", "netcoll", "commit")
        machine = {k: f[k] for k in keys} | {"cpus": f["nproc"]}
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        with open(args.json, "w") as out:
            json.dump({"date": date, "machine": machine, "crc32_s_per_gib": round(crc, 3), "rows": rows}, out, indent=1)
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
