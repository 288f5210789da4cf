"""The measurements: ``python3 -m netcoll.bench`` run as a child of the run, on loopback in
the switch namespace (the calibration of the per-message overhead ``o`` and the per-byte CPU
cost ``beta0``), through the rank daemons over the unshaped veths (the same calibration), and
through them over the shaped links (the sweeps, one per collective and algorithm)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from bench.netemlib.common import OutOfTime, fmt_size, say, tail
from bench.netemlib.model import cost_terms

if TYPE_CHECKING:
    from bench.netemlib.run import Run

_ROW_KEYS = ("size", "count", "time_us", "busbw", "wrong", "rank_time_us", "job")


def run_child(run: Run, tag: str, argv: list[str], env: dict[str, str], want: float) -> None:
    """Run ``argv`` to its end within ``want`` seconds (and the run's budget); its log in the run's tmp."""
    log = os.path.join(run.tmp, f"{tag}.log")
    proc = run.procs.start(tag, argv, env, log)
    try:
        rc = proc.wait(run.budget(want))
    except subprocess.TimeoutExpired:
        run.procs.stop(proc)
        if run.remaining() <= 1:
            raise OutOfTime(f"--limit {run.args.limit:g} s reached during {tag}") from None
        raise RuntimeError(f"{tag} took over {want:g} s") from None
    if rc != 0:
        raise RuntimeError(f"{tag} exited {rc}: {tail(log)}")


def local_bench(run: Run, tag: str, flags: list[str]) -> dict[str, Any]:
    """``python3 -m netcoll.bench --ranks P`` on loopback inside the switch namespace; its first row."""
    out = os.path.join(run.tmp, f"{tag}.json")
    argv = run.in_ns(
        run.sw, sys.executable, "-m", "netcoll.bench", "--ranks", str(run.args.ranks), "-c", "0", "--no-progress",
        "--json", out, *flags,
    )  # fmt: skip
    run_child(run, tag, argv, run.env(), want=120)
    with open(out) as f:
        return json.load(f)["rows"][0]  # type: ignore[no-any-return]


def remote_bench(run: Run, tag: str, flags: list[str]) -> list[dict[str, Any]]:
    """``python3 -m netcoll.bench --coordinator ...`` from the coordinator's namespace
    (client token only); its rows."""
    out = os.path.join(run.tmp, f"{tag}.json")
    argv = run.in_ns(
        run.cns, sys.executable, "-m", "netcoll.bench", "--coordinator", run.coord_addr, "--no-progress",
        "--json", out, *flags,
    )  # fmt: skip
    run_child(run, tag, argv, run.env(NETCOLL_CLIENT_TOKEN=run.client_token), want=run.args.limit)
    with open(out) as f:
        return list(json.load(f)["rows"])


def calibrate(run: Run) -> None:
    """Per-message overhead ``o`` and per-byte CPU cost ``beta0`` on loopback (inside the
    switch namespace: its own 127.0.0.1), same number of ranks."""
    a = run.args
    p = a.ranks
    rounds = cost_terms("all_reduce", "doubling", 4, p)[0] or 1
    small = local_bench(
        run, "calib-small", ["-b", "4", "-e", "4", "-n", str(a.calib_iters), "-w", "20", "--algorithm", "doubling"]
    )
    t_small = small["median_us"] * 1e-6
    o = t_small / rounds
    big_n = 4 << 20
    big = local_bench(run, "calib-big", ["-b", "4M", "-e", "4M", "-n", "5", "-w", "2", "--algorithm", "ring"])
    steps, link = cost_terms("all_reduce", "ring", big_n, p)
    beta0 = max(0.0, (big["time_us"] * 1e-6 - steps * o) / link)
    run.result["calibration"] = {
        "where": f"loopback 127.0.0.1 inside {run.sw}, {p} rank processes (python3 -m netcoll.bench --ranks {p})",
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


def calibrate_veth(run: Run) -> None:
    """The same two calibration calls through the rank daemons over the veths, before any
    shaping: the per-message overhead of the path the sweep measures. With ``tbf+line`` the
    daemons' delay line is already on: its delay is taken off each step."""
    a, p = run.args, run.args.ranks
    rounds = cost_terms("all_reduce", "doubling", 4, p)[0] or 1
    iters = str(max(10, a.calib_iters // 2))
    small = remote_bench(run, "veth-small", ["-b", "4", "-e", "4", "-n", iters, "-w", "10", "--algorithm", "doubling"])
    big = remote_bench(run, "veth-big", ["-b", "4M", "-e", "4M", "-n", "5", "-w", "2", "--algorithm", "ring"])
    d = run.line_delay
    o = max(0.0, small[0]["time_us"] * 1e-6 / rounds - d)
    steps, link = cost_terms("all_reduce", "ring", 4 << 20, p)
    beta0 = max(0.0, (big[0]["time_us"] * 1e-6 - steps * (o + d)) / link)
    run.result["calibration_veth"] = {
        "where": "rank daemons over the unshaped veths (jobs: time = mean over calls of the slowest rank)",
        "small": {"algorithm": "doubling", "size": 4, "time_us": small[0]["time_us"], "rounds": rounds},
        "big": {"algorithm": "ring", "size": 4 << 20, "time_us": big[0]["time_us"]},
        "overhead_per_message_s": o,
        "beta0_s_per_byte": beta0,
        "line_delay_s": d,
    }
    say(
        f"unshaped veth calibration (daemons): 4 B doubling {small[0]['time_us']:.0f} µs -> o = {o * 1e6:.0f} µs; "
        f"4 MiB ring {big[0]['time_us'] / 1000:.1f} ms -> beta0 = {beta0 * 1e9:.2f} ns/B"
    )


def _new_sweep(op: str, algorithm: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    mine: dict[str, Any] = {"op": op, "algorithm": algorithm, "seconds": 0.0, "rows": []}
    for r in rows:
        row = {k: r.get(k) for k in _ROW_KEYS}
        row["times_us"] = [r["time_us"]]
        row["ran"] = [_ran(r)]
        mine["rows"].append(row)
    return mine


def _ran(row: dict[str, Any]) -> str:
    """The algorithm a bench row ran (``auto:ring`` names what auto chose), and for auto
    the segment size it chose (``auto:ring/4M``)."""
    name = str(row.get("algorithm") or "?")
    seg = row.get("segment_bytes")
    return f"{name}/{fmt_size(seg)}" if name.startswith("auto:") and isinstance(seg, int) and seg > 0 else name


def _add_repeat(mine: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """A repeat's times joined to the first one's rows; ``time_us`` becomes their median."""
    by_size = {r["size"]: r for r in rows}
    for row in mine["rows"]:
        r = by_size.get(row["size"])
        if r is None:
            continue
        row["times_us"].append(r["time_us"])
        row.setdefault("ran", []).append(_ran(r))
        row["wrong"] = (row["wrong"] or 0) + (r.get("wrong") or 0)
        row["time_us"] = statistics.median(row["times_us"])


def sweep(run: Run, op: str, algorithm: str, repeat: int = 0) -> None:
    """One sweep of ``op`` with ``algorithm``; a repeat adds its times to the first one's
    rows (``time_us`` is then the median over repeats, each repeat in ``times_us``)."""
    a = run.args
    flags = ["--op", op, "--algorithm", algorithm, "-b", str(a.minbytes), "-e", str(a.maxbytes)]
    flags += ["-f", str(a.stepfactor), "-n", str(a.iters), "-w", str(a.warmup)]
    t = time.monotonic()
    rows = remote_bench(run, f"sweep-{op}-{algorithm}-{repeat}", flags)
    if a.statistic == "median":  # the median call of the slowest rank per call (netcoll.bench.remote)
        for r in rows:
            r["time_us"] = r["median_us"]
    wrong = sum(r.get("wrong") or 0 for r in rows)
    mine = next((sw for sw in run.result["sweeps"] if (sw["op"], sw["algorithm"]) == (op, algorithm)), None)
    if mine is None:
        mine = _new_sweep(op, algorithm, rows)
        run.result["sweeps"].append(mine)
    else:
        _add_repeat(mine, rows)
    mine["seconds"] = round(mine["seconds"] + time.monotonic() - t, 2)
    say(
        f"{op:<10} {algorithm:<8} {len(rows)} sizes in {time.monotonic() - t:5.1f} s"
        + (f" (repeat {repeat + 1})" if a.repeats > 1 else "")
        + ("" if not wrong else f"  ({wrong} WRONG elements)")
    )
