"""The scaling section of docs/benchmarks.md: time against ranks for fixed sizes and against
size per world size, measured next to the alpha-beta formulas fitted to the same data
(:mod:`bench.scaling`), with the fitted alpha and beta and how well each model fits."""

from __future__ import annotations

from typing import Any

from bench import scaling
from bench.labels import IMPLS, label_across
from bench.machine import STAT_SWEEP, provenance
from bench.scaling import ALPHA as A
from bench.scaling import BETA as B
from bench.scaling import PLAIN, SHARED
from netcoll.bench.common import OPS
from netcoll.sizes import format_size

KEY_SIZES = (64 << 10, 1 << 20, 16 << 20, 64 << 20)
STAT_FIT = STAT_SWEEP + "; model: least squares on the relative error over every world size and size > 0"


def ordered(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [runs[k] for k in sorted(runs, key=int)]


def _impls(runs: list[dict[str, Any]]) -> list[str]:
    return [i for i in IMPLS if any(run["impls"].get(i) for run in runs)]


def sizes_of(op: str, runs: list[dict[str, Any]]) -> list[int]:
    """The key sizes (64 KiB … 64 MiB) that were run, else the four largest sizes that were."""
    have = sorted({r["requested"] for run in runs for rows in run["impls"].values() for r in rows if r["op"] == op})
    return [s for s in KEY_SIZES if s in have] or have[-4:]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def _algorithms(rows: list[dict[str, Any]]) -> str:
    return ", ".join(dict.fromkeys(scaling.algorithm_of(r) for r in rows if r["size"] > 0))


def fits_table(runs: list[dict[str, Any]], fits: dict[tuple[str, str], dict[str, scaling.Fit]]) -> list[str]:
    L = [
        f"| implementation | collective | algorithms (formula) | {A} (µs) | 1/{B} (GB/s) | RMS rel. error: {A}-{B} "
        f"| {A}-{B} shared | better fit |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for (impl, op), fs in fits.items():
        rows = [r for run in runs for r in run["impls"].get(impl, []) if r["op"] == op]
        algos = _algorithms(rows)
        formulas = "; ".join(f"{a}: {scaling.FORMULAS[(op, a)][0]}" for a in algos.split(", ") if a)
        b = scaling.best(fs)
        err = {m: f"{fs[m].rel_rms:.0%}" if m in fs else "—" for m in scaling.MODELS}
        inv_beta = f"{1e-9 / b.beta:.2f}" if b.beta > 0 else "∞"
        L.append(
            f"| {label_across(impl, runs)} | {op} | {formulas} | {b.alpha * 1e6:.0f} | {inv_beta} "
            f"| {err[PLAIN]} | {err[SHARED]} | {b.model} |"
        )
    return L


def vs_ranks(
    op: str,
    runs: list[dict[str, Any]],
    fits: dict[tuple[str, str], dict[str, scaling.Fit]],
    cores: int,
    sizes: list[int] | None = None,
) -> list[str]:
    """Rows implementation × size, columns world sizes: measured ms / model ms."""
    impls = _impls(runs)
    L = [
        "| implementation | size | " + " | ".join(f"{run['world_size']} ranks" for run in runs) + " |",
        "| --- | ---: |" + " ---: |" * len(runs),
    ]
    for impl in impls:
        fs = fits.get((impl, op))
        for s in sizes if sizes is not None else sizes_of(op, runs):
            cells = []
            for run in runs:
                r = next((x for x in run["impls"].get(impl, []) if x["op"] == op and x["requested"] == s), None)
                if r is None or r["size"] == 0:
                    cells.append("—")
                    continue
                model = f" / {_ms(scaling.best(fs).predict(r, cores))}" if fs else ""
                cells.append(_ms(r["time_us"] * 1e-6) + model)
            if any(c != "—" for c in cells):
                L.append(f"| {label_across(impl, runs)} | {format_size(s)} | " + " | ".join(cells) + " |")
    return L


def per_world_size(op: str, runs: list[dict[str, Any]], cores: int) -> list[str]:
    """alpha and beta fitted within each world size (plain alpha-beta): how they grow with P."""
    impls = _impls(runs)
    L = [
        "| implementation | " + " | ".join(f"{run['world_size']} ranks: {A} µs, 1/{B} GB/s" for run in runs) + " |",
        "| --- |" + " ---: |" * len(runs),
    ]
    for impl in impls:
        cells = []
        for run in runs:
            f = scaling.fit([r for r in run["impls"].get(impl, []) if r["op"] == op], PLAIN, cores)
            cells.append("—" if f is None else f"{f.alpha * 1e6:.0f}, {1e-9 / f.beta:.2f}" if f.beta > 0 else "—")
        L.append(f"| {label_across(impl, runs)} | " + " | ".join(cells) + " |")
    return L


def section(runs_by_n: dict[str, dict[str, Any]], meta: dict[str, Any], plot: str | None) -> list[str]:
    runs = ordered(runs_by_n)
    if len(runs) < 2:
        return []
    cores = int(meta.get("nproc") or 1)
    ops = [op for op in OPS if any(r["op"] == op for run in runs for rows in run["impls"].values() for r in rows)]
    fits = scaling.fit_all(runs, cores, ops)
    shared = sum(1 for fs in fits.values() if scaling.best(fs).model == SHARED)
    ps = ", ".join(str(run["world_size"]) for run in runs)
    L = [
        "",
        f"### Scaling: {ps} ranks",
        "",
        f"Time per call against the world size `P` and the size `n`, next to the {A}-{B} formula of the algorithm "
        "that ran (netcoll's rows name it; for Gloo and MPI the textbook large-message algorithm is assumed: "
        "ring all_reduce/all_gather/reduce_scatter, binomial-tree broadcast/reduce, pairwise all_to_all, direct "
        f"gather/scatter). `t = a(P)·{A} + b(P, n)·{B}`, {A} the cost of a dependent message step and {B} of a byte "
        "(reductions included), fitted by least squares on the relative error over every world size and size "
        f"of one implementation and collective. **{A}-{B} shared** multiplies the formula by max(1, P / {cores}): "
        f"with more rank processes than the {cores} cores, every step waits for its share of a core. "
        f"It fits better than the plain formula for {shared} of {len(fits)} (implementation, collective) pairs.",
    ]
    if plot:
        L += ["", f"![time per call against ranks and against size, with the fitted formulas]({plot})"]
    if any(op == "all_reduce" for _, op in fits):
        L += ["", "**all_reduce: time per call (ms), measured / fitted model**", ""]
        L += vs_ranks("all_reduce", runs, fits, cores)
        L += ["", provenance(meta, STAT_FIT)]
        every = sorted(
            {r["requested"] for run in runs for rs in run["impls"].values() for r in rs if r["op"] == "all_reduce"}
        )
        L += [
            "",
            "<details><summary>all_reduce at every size: time per call (ms), measured / fitted model</summary>",
            "",
        ]
        L += [*vs_ranks("all_reduce", runs, fits, cores, every), "", provenance(meta, STAT_FIT), "", "</details>"]
        L += ["", f"**all_reduce: {A} and {B} fitted within each world size** (plain {A}-{B})", ""]
        L += per_world_size("all_reduce", runs, cores)
        L += ["", provenance(meta, STAT_FIT.replace("every world size", "one world size"))]
    L += ["", f"**Fitted {A}, {B} and how well each model fits** (RMS of the relative error)", ""]
    L += fits_table(runs, fits)
    L += ["", provenance(meta, STAT_FIT)]
    others = [op for op in ops if op != "all_reduce"]
    if others:
        L += ["", "<details><summary>The other collectives: time per call (ms), measured / fitted model</summary>"]
        for op in others:
            L += ["", f"**{op}**", "", *vs_ranks(op, runs, fits, cores)]
        L += ["", provenance(meta, STAT_FIT), "", "</details>"]
    return L
