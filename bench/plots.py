"""The plots of docs/benchmarks.md, from the results alone: busbw against size per world size
(``<stem>-<P>ranks.png``) and the scaling figure (``<stem>-scaling.png``: all_reduce time
against ranks at fixed sizes, and against size per world size, with the fitted alpha-beta model).
PNGs carry no software or date metadata, so a re-render of the same JSON gives the same bytes."""

from __future__ import annotations

import os
import sys
from typing import Any

from bench import report_scaling, scaling
from bench.labels import label, label_across, present
from bench.report import runs_of, short
from bench.scaling import ALPHA as A
from bench.scaling import BETA as B
from netcoll.bench.common import OPS

STYLE = {
    "netcoll-tcp": {"color": "C3", "marker": "o"},
    "netcoll": {"color": "C1", "marker": "D"},
    "gloo": {"color": "C0", "marker": "s"},
    "mpi": {"color": "C2", "marker": "^"},
    "mpi-sm": {"color": "C4", "marker": "v"},
}
SIZE_COLORS = ("C0", "C1", "C2", "C3", "C4", "C5")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[compare] no plots: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return None
    plt.rcParams["svg.hashsalt"] = "netcoll"
    return plt


def _save(fig: Any, path: str) -> None:
    fig.savefig(path, dpi=90, metadata={"Software": None})


def _size_ticks(ax: Any, lo: int, hi: int) -> None:
    ticks = [t for t in (4**k for k in range(17)) if lo <= t <= hi][::2] or [lo]
    ax.set_xticks(ticks)
    ax.set_xticklabels([short(t) for t in ticks], fontsize=7)


def busbw(plt: Any, results: dict[str, Any], out_dir: str, stem: str) -> dict[str, str]:
    """One PNG per world size: busbw against size, one panel per collective."""
    made: dict[str, str] = {}
    for n_str, run in runs_of(results).items():
        impls = present(run)
        ops = [op for op in OPS if any(r["op"] == op for i in impls for r in run["impls"][i])]
        if not ops:
            continue
        cols = min(4, len(ops))
        nrows = (len(ops) + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
        sizes = [r["size"] for i in impls for r in run["impls"][i] if r["size"] > 0] or [4]
        for ax, op in zip(axes.flat, ops, strict=False):
            for impl in impls:
                pts = [(r["size"], r["busbw"]) for r in run["impls"][impl] if r["op"] == op and r["size"] > 0]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, [max(y, 1e-5) for y in ys], ms=3, lw=1.2, label=label(impl, run), **STYLE[impl])
            ax.set_title(op, fontsize=10)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            _size_ticks(ax, min(sizes), max(sizes))
            ax.tick_params(axis="y", labelsize=7)
        for ax in axes.flat[len(ops) :]:
            ax.axis("off")
        for ax in axes[:, 0]:
            ax.set_ylabel("busbw (GB/s)")
        for ax in axes[-1, :]:
            ax.set_xlabel("size (bytes)")
        axes.flat[0].legend(fontsize=7)
        fig.suptitle(
            f"bus bandwidth, {n_str} rank processes on one {results['meta'].get('nproc', '?')}-core machine",
            fontsize=11,
        )
        fig.tight_layout()
        name = f"{stem}-{n_str}ranks.png"
        _save(fig, os.path.join(out_dir, name))
        plt.close(fig)
        made[n_str] = name
    return made


def scaling_figure(plt: Any, results: dict[str, Any], out_dir: str, stem: str, op: str = "all_reduce") -> str | None:
    """all_reduce per implementation: time against P at fixed sizes (left) and against size per P
    (right); markers measured, dashed lines the fitted alpha-beta model at the same points."""
    runs = report_scaling.ordered(runs_of(results))
    if len(runs) < 2:
        return None
    cores = int(results["meta"].get("nproc") or 1)
    impls = list(dict.fromkeys(i for run in runs for i in present(run)))
    fits = scaling.fit_all(runs, cores, [op])
    impls = [i for i in impls if (i, op) in fits]
    if not impls:
        return None
    fig, axes = plt.subplots(len(impls), 2, figsize=(10, 3.3 * len(impls)), squeeze=False)
    for (left, right), impl in zip(axes, impls, strict=True):
        f = scaling.best(fits[(impl, op)])
        rows = [r for run in runs for r in run["impls"].get(impl, []) if r["op"] == op and r["size"] > 0]
        for c, s in zip(SIZE_COLORS, report_scaling.sizes_of(op, runs), strict=False):
            pts = sorted(
                (r["world_size"], r["time_us"] * 1e-3, f.predict(r, cores) * 1e3) for r in rows if r["requested"] == s
            )
            if pts:
                ps, meas, mod = zip(*pts, strict=True)
                left.plot(ps, meas, "o-", color=c, ms=4, lw=1, label=short(s))
                left.plot(ps, mod, "--", color=c, lw=1)
        for c, run in zip(SIZE_COLORS, runs, strict=False):
            pts = sorted(
                (r["size"], r["time_us"] * 1e-3, f.predict(r, cores) * 1e3)
                for r in rows
                if r["world_size"] == run["world_size"]
            )
            if pts:
                ns, meas, mod = zip(*pts, strict=True)
                right.plot(ns, meas, "o", color=c, ms=3, label=f"P={run['world_size']}")
                right.plot(ns, mod, "--", color=c, lw=1)
        left.set_xscale("log", base=2)
        left.set_xticks([run["world_size"] for run in runs])
        left.set_xticklabels([str(run["world_size"]) for run in runs])
        right.set_xscale("log", base=2)
        _size_ticks(right, min(r["size"] for r in rows), max(r["size"] for r in rows))
        for ax in (left, right):
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_ylabel("ms per call")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        name = label_across(impl, runs)
        fit_text = f"{f.model}: {A}={f.alpha * 1e6:.0f} µs, 1/{B}={1e-9 / f.beta:.2f} GB/s" if f.beta > 0 else f.model
        left.set_title(f"{name} {op}: time vs ranks (dashed: {fit_text})", fontsize=9)
        right.set_title(f"{name} {op}: time vs size per world size", fontsize=9)
    axes[-1, 0].set_xlabel("ranks P")
    axes[-1, 1].set_xlabel("size (bytes)")
    fig.tight_layout()
    name = f"{stem}-scaling.png"
    _save(fig, os.path.join(out_dir, name))
    plt.close(fig)
    return name


def plot_all(results: dict[str, Any], out_dir: str, stem: str) -> dict[str, str]:
    """Every plot of the doc; returns world size (str) or ``"scaling"`` -> file name."""
    plt = _pyplot()
    if plt is None:
        return {}
    made = busbw(plt, results, out_dir, stem)
    sc = scaling_figure(plt, results, out_dir, stem)
    if sc:
        made["scaling"] = sc
    return made
