"""``python -m netcoll.bench.versus``: ``algorithm="auto"`` against every fixed
algorithm, cell by cell (collective × size), on a local cluster.

Each round runs the sweep once with ``auto`` and once per algorithm of the
collective (fresh rank processes each time, so every run calibrates anew);
rounds interleave the runs (in reverse order every other round) so a burst of
noise on a shared machine hits them alike, and each cell keeps the best
(minimum) time over the rounds. ``auto`` learns from traffic as it goes (see
docs/algorithms.md, "Cost model"), so its first cells include that learning. The table
shows what ``auto`` chose (algorithm, segment size), its predicted and
measured time, the best fixed algorithm and its time, and ``auto / best``;
a cell's *time* is ``ok`` when that ratio is at most ``1 + --tolerance``.
The last column, *choice*, is the time of the algorithm ``auto`` chose, in
its own fixed run, over the best fixed time (``!``: above the tolerance):
the choice without the noise between two runs. Exit status 1 if any cell's
time is not ok.

With ``--interleave`` everything runs in one group instead: each size runs a block of
``-n`` calls of ``auto`` and of every fixed algorithm in turn, ``--rounds`` times, the
order reversed every other round, and a cell's time is the statistic over all its calls.
Then the algorithms share the machine's state and its drift, call for call, where separate
groups a minute apart may not; ``auto`` with the cost model also learns from the fixed
algorithms' calls there.

Example: ``python -m netcoll.bench.versus all_reduce --ranks 4 -b 4K -e 64M --rounds 3``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from .. import collectives
from ..sizes import parse_size
from .common import SweepConfig
from .local import run_local

Cell = tuple[str, int]  # (collective, size)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m netcoll.bench.versus", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("ops", nargs="?", default="all_reduce", help="collective(s), comma-separated (default all_reduce)")
    p.add_argument("-b", "--minbytes", default="4K", help="smallest size (default 4K)")
    p.add_argument("-e", "--maxbytes", default="16M", help="largest size (default 16M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-n", "--iters", type=int, default=10)
    p.add_argument("-w", "--warmup", type=int, default=3)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2, help="interleaved repetitions; each cell keeps its best")
    p.add_argument("--tolerance", type=float, default=0.10, help="auto may be this much slower (default 0.10)")
    p.add_argument(
        "--statistic",
        choices=("mean", "median"),
        default="mean",
        help="a cell's time: the mean per call (what a user gets, stalls included) or the median (default mean)",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="one group for everything: each size runs a block of -n calls of auto and of every fixed "
        "algorithm in turn, --rounds times (reversed every other round); a cell's time is the statistic over "
        "all its calls (default: a fresh group per algorithm and round, each cell its best round)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the cells as JSON")
    return p


def _runs(ops: list[str]) -> list[str]:
    """``auto`` and every fixed algorithm of any of ``ops``."""
    names = {a for op in ops for a in collectives.get(op).algorithms if a != "auto"}
    return ["auto", *sorted(names)]


def _config(ns: argparse.Namespace, ops: list[str], **what: Any) -> SweepConfig:
    """The sweep of the command line (unchecked: ``versus`` times, it does not verify), with ``what``."""
    sizes = {"minbytes": parse_size(ns.minbytes), "maxbytes": parse_size(ns.maxbytes), "stepfactor": ns.stepfactor}
    return SweepConfig(ops=ops, **sizes, iters=ns.iters, warmup=ns.warmup, check=False, **what)


async def _sweep(ns: argparse.Namespace, ops: list[str], algorithm: str) -> list[dict[str, Any]]:
    # an algorithm a collective lacks runs "auto" there: those rows are not that algorithm's
    result = await run_local(_config(ns, ops, algorithm=algorithm), ns.ranks)
    return [r for r in result["rows"] if algorithm == "auto" or r["algorithm"] == algorithm]


async def _interleaved(ns: argparse.Namespace, ops: list[str]) -> dict[Cell, dict[str, dict[str, Any]]]:
    """``--interleave``: one group, every algorithm alternating within each size (one row each)."""
    cfg = _config(ns, ops, alternate=_runs(ops), rounds=ns.rounds)
    cells: dict[Cell, dict[str, dict[str, Any]]] = {}
    for row in (await run_local(cfg, ns.ranks))["rows"]:
        if ns.statistic == "median":
            row["time_us"] = row["median_us"]
        name = "auto" if row["algorithm"].startswith("auto") else row["algorithm"]
        cells.setdefault((row["op"], row["size"]), {})[name] = row
    return cells


async def collect(ns: argparse.Namespace) -> dict[Cell, dict[str, dict[str, Any]]]:
    """cell -> run name -> the best row of that run over the rounds."""
    ops = [o.strip() for o in ns.ops.split(",") if o.strip()]
    if ns.interleave:
        return await _interleaved(ns, ops)
    cells: dict[Cell, dict[str, dict[str, Any]]] = {}
    for i in range(ns.rounds):
        names = _runs(ops)
        for name in names if i % 2 == 0 else reversed(names):  # auto first, then last: fair to both
            for row in await _sweep(ns, ops, name):
                if ns.statistic == "median":
                    row["time_us"] = row["median_us"]
                runs = cells.setdefault((row["op"], row["size"]), {})
                if name not in runs or row["time_us"] < runs[name]["time_us"]:
                    runs[name] = row
    return cells


def table(cells: dict[Cell, dict[str, dict[str, Any]]], tolerance: float) -> tuple[list[dict[str, Any]], str]:
    """The rows of the comparison and their text. Two verdicts per cell: *time*
    (``auto``'s own run against the best fixed one: what a user gets, noise
    of two separate runs included) and *choice* (the algorithm ``auto``
    settled on, timed as a fixed run, against the best fixed one: the quality
    of the choice alone)."""
    out, lines = [], []
    head = f"{'op':<15}{'size':>10}  {'auto chose':<22}{'pred us':>10}{'auto us':>10}  {'best fixed':<10}"
    lines.append(head + f"{'best us':>10}{'ratio':>7}  time  {'choice':>6}")
    for (op, size), runs in sorted(cells.items()):
        auto = runs.get("auto")
        fixed = {k: v for k, v in runs.items() if k != "auto"}
        if auto is None or not fixed:
            continue
        best_name, best = min(fixed.items(), key=lambda kv: kv[1]["time_us"])
        ratio = auto["time_us"] / best["time_us"]
        seg = auto.get("segment_bytes") or 0
        algo = auto["algorithm"].removeprefix("auto:")
        chose = f"{algo}/{seg >> 10}K"
        pred = auto.get("predicted_us")
        ok = ratio <= 1 + tolerance
        mine = fixed.get(algo)
        choice = None if mine is None else mine["time_us"] / best["time_us"]
        cell = {"op": op, "size": size, "auto": chose, "predicted_us": pred, "auto_us": auto["time_us"]}
        cell.update(best=best_name, best_us=best["time_us"], ratio=ratio, ok=ok)
        cell.update(choice_ratio=choice, choice_ok=choice is not None and choice <= 1 + tolerance)
        cell["fixed_us"] = {k: v["time_us"] for k, v in fixed.items()}
        out.append(cell)
        pred_text = "-" if pred is None else f"{pred:.0f}"
        choice_text = "-" if choice is None else f"{choice:.2f}{'' if cell['choice_ok'] else '!'}"
        lines.append(
            f"{op:<15}{size:>10}  {chose:<22}{pred_text:>10}{auto['time_us']:>10.0f}  {best_name:<10}"
            f"{best['time_us']:>10.0f}{ratio:>7.2f}  {'ok  ' if ok else 'SLOW'}  {choice_text:>6}"
        )
    n = len(out)
    lines.append(
        f"within {tolerance:.0%} of the best fixed algorithm: time {sum(c['ok'] for c in out)} of {n} cells, "
        f"choice {sum(c['choice_ok'] for c in out)} of {n} (the same algorithm as the best: "
        f"{sum(c['auto'].split('/')[0] == c['best'] for c in out)})"
    )
    return out, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    cells = asyncio.run(collect(ns))
    rows, text = table(cells, ns.tolerance)
    print(text)
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
