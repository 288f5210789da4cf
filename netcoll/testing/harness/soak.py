"""Soak (issue 10): many jobs with inline inputs against a coordinator and rank
daemon subprocesses on loopback; coordinator and daemon RSS and descriptors
sampled every ``--every`` jobs.

Goal: after a warm-up (by default longer than the coordinator's result history,
``max_result_jobs`` = 32, so that history is full when the baseline is taken),
every process grows its RSS by less than ``--max-rss-growth-mib`` (20) and keeps
its descriptor count. Jobs cycle through all_reduce, broadcast and all_gather
with one ``--size-mib`` float32 array per rank (inline, through the
coordinator); every ``--every``-th result is checked against numpy.

    python3 -m netcoll.testing.harness.soak --jobs 1000 --size-mib 4 --daemons 3

Exit 1 if a job failed, a process died, or growth exceeded the goals.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from typing import Any

import numpy as np

from ...service import Client
from .cluster import Cluster

OPS = ("all_reduce", "broadcast", "all_gather")


async def soak(
    *,
    jobs: int = 1000,
    size_mib: float = 4.0,
    daemons: int = 3,
    every: int = 50,
    warmup: int = 40,
    seconds: float = 900.0,
    max_result_jobs: int | None = None,
    keep_jobs: int | None = None,
    max_rss_growth_mib: float = 20.0,
    log: Any = None,
) -> dict[str, Any]:
    """Run the soak; return the report (``report["ok"]``, ``report["problems"]``)."""
    say = log or (lambda *a: None)
    env = {} if max_result_jobs is None else {"NETCOLL_LIMIT_MAX_RESULT_JOBS": str(max_result_jobs)}
    if keep_jobs is not None:
        env["NETCOLL_KEEP_JOBS"] = str(keep_jobs)
    token = secrets.token_hex(16)
    n = int(size_mib * 2**20) // 4
    rng = np.random.default_rng(0)
    inputs = [rng.integers(-1000, 1000, n).astype(np.float32) for _ in range(daemons)]
    expect = {
        "all_reduce": np.sum(inputs, axis=0, dtype=np.float32),
        "broadcast": inputs[0],
        "all_gather": np.stack(inputs),
    }
    problems: list[str] = []
    samples: list[dict[str, Any]] = []
    failed = 0
    done = 0
    t0 = time.monotonic()
    baseline: dict[str, dict[str, float]] | None = None
    async with Cluster(daemons, token, env=env) as cluster, Client(cluster.address, token=token) as client:
        start = cluster.sample()
        samples.append({"jobs": 0, "t": 0.0, **start})
        say(f"0 jobs: {json.dumps(start)}")
        while done < warmup + jobs and time.monotonic() - t0 < seconds:
            op = OPS[done % len(OPS)]
            if op == "broadcast":
                rec = await client.run(op, inputs=inputs[0], root=0, timeout=120)
            else:
                rec = await client.run(op, inputs=inputs, timeout=120)
            done += 1
            if rec["state"] != "succeeded":
                failed += 1
                problems.append(f"job {rec.get('id')} ({op}) {rec['state']}: {rec.get('error')}")
                if failed >= 5:
                    break
            elif done % every == 0:
                np.testing.assert_array_equal(rec["result"], expect[op])
            del rec
            if cluster.dead():
                problems.append(f"died: {cluster.dead()}")
                break
            if done == warmup:
                baseline = cluster.sample()
                samples.append({"jobs": done, "t": round(time.monotonic() - t0, 1), "baseline": True, **baseline})
                say(f"{done} jobs (warm-up done, baseline): {json.dumps(baseline)}")
            elif done % every == 0:
                now = cluster.sample()
                samples.append({"jobs": done, "t": round(time.monotonic() - t0, 1), **now})
                say(f"{done} jobs, {time.monotonic() - t0:.0f}s: {json.dumps(now)}")
        end = cluster.sample()
        samples.append({"jobs": done, "t": round(time.monotonic() - t0, 1), **end})
    if baseline is None:
        baseline = start
        problems.append(f"only {done} jobs: not past the warm-up of {warmup}")
    growth: dict[str, dict[str, float]] = {}
    for name, b in baseline.items():
        e = end.get(name)
        if e is None:
            problems.append(f"{name}: gone at the end")
            continue
        peak = max(s[name]["rss_mib"] for s in samples if name in s and s["jobs"] >= min(done, warmup))
        growth[name] = {
            "rss_mib": round(e["rss_mib"] - b["rss_mib"], 2),
            "rss_mib_peak_over_baseline": round(peak - b["rss_mib"], 2),
            "rss_mib_from_start": round(e["rss_mib"] - start[name]["rss_mib"], 2),
            "fds": e["fds"] - b["fds"],
        }
        if growth[name]["rss_mib"] > max_rss_growth_mib:
            problems.append(f"{name}: RSS grew {growth[name]['rss_mib']} MiB after warm-up (> {max_rss_growth_mib})")
        if growth[name]["fds"] > 0:
            problems.append(f"{name}: {growth[name]['fds']} more open descriptors")
    measured = max(done - warmup, 0)
    return {
        "jobs": measured,
        "warmup_jobs": min(done, warmup),
        "failed_jobs": failed,
        "size_mib_per_rank": size_mib,
        "daemons": daemons,
        "max_result_jobs": max_result_jobs or "default (32)",
        "keep_jobs": keep_jobs or "default (1000)",
        "seconds": round(time.monotonic() - t0, 1),
        "start": start,
        "baseline": baseline,
        "end": end,
        "growth": growth,
        "samples": samples,
        "problems": problems,
        "ok": not problems and measured >= jobs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000, help="jobs measured after the warm-up (default 1000)")
    ap.add_argument("--size-mib", type=float, default=4.0, help="inline input per rank, MiB (default 4)")
    ap.add_argument("--daemons", type=int, default=3, help="rank daemon processes (default 3)")
    ap.add_argument("--every", type=int, default=50, help="sample RSS/fds every N jobs")
    ap.add_argument("--warmup", type=int, default=40, help="jobs before the baseline (default 40 > 32 results kept)")
    ap.add_argument("--seconds", type=float, default=900.0, help="stop after this long whatever the count")
    ap.add_argument("--max-result-jobs", type=int, help="NETCOLL_LIMIT_MAX_RESULT_JOBS of the coordinator")
    ap.add_argument("--keep-jobs", type=int, help="NETCOLL_KEEP_JOBS of the coordinator (finished records kept)")
    ap.add_argument("--max-rss-growth-mib", type=float, default=20.0)
    ap.add_argument("--json", action="store_true", help="print the report on one line")
    args = ap.parse_args(argv)
    report = asyncio.run(
        soak(
            jobs=args.jobs,
            size_mib=args.size_mib,
            daemons=args.daemons,
            every=args.every,
            warmup=args.warmup,
            seconds=args.seconds,
            max_result_jobs=args.max_result_jobs,
            keep_jobs=args.keep_jobs,
            max_rss_growth_mib=args.max_rss_growth_mib,
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )
    )
    print(json.dumps(report, indent=None if args.json else 2, default=str))
    if not report["ok"] and not report["problems"]:
        print(f"only {report['jobs']} of {args.jobs} jobs within {args.seconds:g}s", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
