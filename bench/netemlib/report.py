"""The results: the JSON file, the text table (measured / predicted per size, crossovers) and
the plot (time vs size per collective, measured solid, predicted dashed, crossovers marked;
needs matplotlib, without it says so). ``--from-json`` redraws both from an earlier JSON."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from bench.netemlib.common import fmt_size, fmt_us, say

Sweeps = list[dict[str, Any]]


def _by_op(result: dict[str, Any]) -> dict[str, Sweeps]:
    by_op: dict[str, Sweeps] = {}
    for sw in result.get("sweeps", []):
        by_op.setdefault(sw["op"], []).append(sw)
    return by_op


def ran(row: dict[str, Any]) -> str:
    """What ``auto`` ran in a row, over its repeats (``ring``, ``ring/1 MiB`` with a segment size
    other than the default, ``tree|ring`` when repeats differed)."""
    ran = [str(n) for n in row.get("ran") or []]
    names = [n.removeprefix("auto:").removesuffix("/4 MiB") for n in ran if n.startswith("auto:")]
    return "|".join(dict.fromkeys(names)) or "?"  # (4 MiB: the default segment size, not shown)


def auto_against_best(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per collective and size: ``auto``'s time, what it ran, the fastest fixed algorithm and
    auto's time over it (issue 12, goal 3: within 10 %)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for op, sweeps in _by_op(result).items():
        auto = next((s for s in sweeps if s["algorithm"] == "auto"), None)
        fixed = [s for s in sweeps if s["algorithm"] != "auto"]
        if auto is None or not fixed:
            continue
        for row in auto["rows"]:
            times = [(r["time_us"], s["algorithm"]) for s in fixed for r in s["rows"] if r["size"] == row["size"]]
            if not times or not row.get("time_us"):
                continue
            best_us, best = min(times)
            cell = {"size": row["size"], "auto_us": row["time_us"], "ran": ran(row), "best": best}
            out.setdefault(op, []).append({**cell, "best_us": best_us, "ratio": row["time_us"] / best_us})
    return out


def _auto_lines(result: dict[str, Any], op: str) -> list[str]:
    cells = auto_against_best(result).get(op, [])
    if not cells:
        return []
    within = sum(c["ratio"] <= 1.10 for c in cells)
    worst = max(cells, key=lambda c: c["ratio"])
    return [
        f"  auto ({result.get('auto_by', 'fixed table')}) within 10 % of the best fixed algorithm at "
        f"{within} of {len(cells)} sizes; worst {worst['ratio']:.2f}x at {fmt_size(worst['size'])} "
        f"({worst['ran']} against {worst['best']})"
    ]


def _op_table(result: dict[str, Any], op: str, sweeps: Sweeps) -> list[str]:
    algs = [s["algorithm"] for s in sweeps]
    sizes = sorted({r["size"] for s in sweeps for r in s["rows"]})
    lines = [f"\n{op}, {result['ranks']} ranks: measured / predicted (per call); auto: measured (what it ran)"]
    lines.append(f"{'size':>9} | " + " | ".join(f"{a:^23}" for a in algs))
    for size in sizes:
        cells = []
        for s in sweeps:
            r = next((r for r in s["rows"] if r["size"] == size), None)
            if r is None:
                cells.append(f"{'':23}")
            elif s["algorithm"] == "auto":
                cells.append(f"{fmt_us(r['time_us']):>10} {ran(r)[:12]:<12}")
            else:
                cells.append(f"{fmt_us(r['time_us']):>10} / {fmt_us(r.get('predicted_us')):<10}")
        lines.append(f"{fmt_size(size):>9} | " + " | ".join(cells))
    lines += _auto_lines(result, op)
    cx = result.get("crossovers", {}).get(op, {})
    for kind in ("measured_crossovers", "predicted_crossovers", "predicted_crossovers_cpu_model"):
        items = cx.get(kind) or []
        text = ", ".join(f"{c['from']}→{c['to']} at {fmt_size(c['at'])}" for c in items) or "none in range"
        lines.append(f"  {kind.replace('_', ' ')}: {text}")
    return lines


def text_table(result: dict[str, Any]) -> str:
    lines = []
    for op, sweeps in _by_op(result).items():
        lines += _op_table(result, op, sweeps)
    return "\n".join(lines)


def xs_all(sweeps: Sweeps) -> list[int]:
    return [r["size"] for sw in sweeps for r in sw["rows"] if r["size"] > 0] or [1]


def _plot_curves(ax: Any, sweeps: Sweeps, colors: list[str]) -> None:
    for i, sw in enumerate(sweeps):
        rows = [r for r in sw["rows"] if r["size"] > 0]
        xs = [r["size"] for r in rows]
        c = "black" if sw["algorithm"] == "auto" else colors[i % len(colors)]
        ax.plot(xs, [r["time_us"] for r in rows], "o-", color=c, label=f"{sw['algorithm']} measured", ms=4)
        if sw["algorithm"] != "auto":
            ys = [r["predicted_us"] for r in rows]
            ax.plot(xs, ys, "--", color=c, alpha=0.8, label=f"{sw['algorithm']} predicted")


def _mark_crossovers(ax: Any, cx: dict[str, Any], sweeps: Sweeps) -> None:
    ymax = max(r["time_us"] for sw in sweeps for r in sw["rows"])
    ymin = min(
        min(r["time_us"], r.get("predicted_us") or r["time_us"]) for sw in sweeps for r in sw["rows"] if r["size"]
    )
    marks = [("pred", "grey", "--", c) for c in cx.get("predicted_crossovers", [])]
    marks += [("meas", "red", ":", c) for c in cx.get("measured_crossovers", [])]
    for k, (kind, color, ls, c) in enumerate(marks):
        ax.axvline(c["at"], color=color, ls=ls, lw=1.0)
        y = ymax * (ymin / ymax) ** (0.04 + 0.1 * (k % 6))  # stagger the labels down the log axis
        text = f" {kind} {c['from']}→{c['to']} {fmt_size(c['at'])}"
        ax.text(c["at"], y, text, fontsize=7, va="top", color=color)


def _plot_op(ax: Any, result: dict[str, Any], op: str, sweeps: Sweeps, colors: list[str]) -> None:
    _plot_curves(ax, sweeps, colors)
    _mark_crossovers(ax, result.get("crossovers", {}).get(op, {}), sweeps)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [x for x in (4 << (2 * k) for k in range(16)) if min(xs_all(sweeps)) <= x <= max(xs_all(sweeps))]
    ax.set_xticks(ticks, [fmt_size(t) for t in ticks], fontsize=8)
    ax.set_xlabel("size")
    ax.set_ylabel("time per call (µs)")
    ax.set_title(f"{op}, {result['ranks']} ranks: measured (solid) and predicted (dashed)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left")


def _suptitle(result: dict[str, Any]) -> str:
    shaping = result["shaping"]
    rate: float = result.get("rate_bits_per_s") or 0.0  # None when unshaped (not shown then)
    link = (
        f"netem {result['delay_applied_s'] * 1e6:.0f} µs + {rate / 1e9:g} Gbit/s"
        if shaping == "netem"
        else f"tbf {rate / 1e9:g} Gbit/s + {result['delay_applied_s'] * 1e6:.0f} µs by netcoll's delay line"
        if shaping == "tbf+line"
        else f"tbf {rate / 1e9:g} Gbit/s, delay not emulated"
        if shaping == "tbf"
        else "unshaped veths"
    )
    m = result.get("model", {})
    return (
        f"netcoll over an emulated network ({link})\npredicted: alpha = {m.get('alpha_s', 0) * 1e6:.0f} µs, "
        f"beta = {m.get('beta_s_per_byte', 0) * 1e9:.2f} ns/B; crossovers: grey = predicted, red = measured"
    )


def plot(result: dict[str, Any], path: str) -> str | None:
    """time vs size per collective, measured (solid) and predicted (dashed), crossovers marked.
    Returns why it was skipped, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib)"
    by_op = _by_op(result)
    if not by_op:
        return "no measurements"
    fig, axes = plt.subplots(len(by_op), 1, figsize=(11, 5.2 * len(by_op)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (op, sweeps) in zip(axes[:, 0], by_op.items(), strict=True):
        _plot_op(ax, result, op, sweeps, colors)
    fig.suptitle(_suptitle(result), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def replot(args: argparse.Namespace) -> int:
    """``--from-json``: the table and the plot of an earlier run again; runs nothing."""
    with open(args.from_json) as f:
        result = json.load(f)
    print(text_table(result))
    if not args.no_plot:
        png = args.plot or os.path.splitext(args.from_json)[0] + ".png"
        why = plot(result, png)
        say(f"plot skipped: {why}" if why else f"plot written to {png}")
    return 0


def write(result: dict[str, Any], args: argparse.Namespace) -> None:
    """The JSON (``--json``), the table, and the plot unless ``--no-plot`` or nothing was measured."""
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    result["auto_against_best"] = auto_against_best(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(text_table(result))
    say(f"results written to {args.json}")
    if not args.no_plot and result["sweeps"]:
        png = args.plot or os.path.splitext(args.json)[0] + ".png"
        why = plot(result, png)
        say(f"plot skipped: {why}; the JSON and the table above have everything" if why else f"plot written to {png}")
