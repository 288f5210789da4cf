"""Printing results: the nccl-tests table, JSON, a terminal progress bar and plots.

The table keeps nccl-tests' exact layout (``src/common.cu``) so scripts that
parse nccl-tests output parse this too. netcoll measures out-of-place calls
only; the in-place columns are kept for layout and print ``N/A``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable
from typing import IO, Any

from ..sizes import format_size
from .common import OPS


def _time_str(us: float) -> str:
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def preamble(meta: dict[str, Any]) -> list[str]:
    """nccl-tests' first lines: the run's parameters and one line per rank."""
    cfg = meta["config"]
    lines = [
        f"# nThread 1 nGpus 1 minBytes {cfg['minbytes']} maxBytes {cfg['maxbytes']} "
        f"step: {cfg['stepfactor']}(factor) warmup iters: {cfg['warmup']} iters: {cfg['iters']} "
        f"agg iters: 1 validation: {int(bool(cfg['check']))} graph: 0",
        "#",
        f"# netcoll {meta.get('netcoll', '')}: {meta.get('world_size')} rank processes over "
        f"{meta.get('transport', 'tcp')}, event loop {meta.get('loop', 'asyncio')}, "
        f"algorithm {cfg.get('algorithm', 'auto')}",
        "# Using devices",
    ]
    for r in meta.get("ranks", []):
        lines.append(
            f"#  Rank {r['rank']:2d} Group  0 Pid {r['pid']:6d} on {str(r['host'])[:10]:>10s} "
            f"device {r['rank']:2d} [0x00] cpu, tcp"
        )
    lines.append("#")
    return lines


def header(op: str | None = None) -> list[str]:
    """The column header (exactly nccl-tests'), after a ``# Collective test`` line."""
    lines = [f"# Collective test starting: {op}"] if op else []
    lines += [
        f"# {'':>10s}  {'':>12s}  {'':>8s}  {'':>6s}  {'':>6s}"
        "           out-of-place                       in-place          ",
        f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}"
        f"  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s} {'#wrong':>6s}"
        f"  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s} {'#wrong':>6s}",
        f"# {'(B)':>10s}  {'(elements)':>12s}  {'':>8s}  {'':>6s}  {'':>6s}"
        f"  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>5s}"
        f"  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {'':>5s}",
    ]
    return lines


def format_row(row: dict[str, Any]) -> str:
    """One data line; in-place columns print N/A (not measured)."""
    wrong = "N/A" if row.get("wrong") is None else f"{row['wrong']:5g}"
    return (
        f"{row['size']:12d}  {row['count']:12d}  {row['type']:>8s}  {row['redop']:>6s}  {row['root']:6d}"
        f"  {_time_str(row['time_us'])}  {row['algbw']:6.2f}  {row['busbw']:6.2f}  {wrong:>5s}"
        f"  {'N/A':>7s}  {'N/A':>6s}  {'N/A':>6s}  {'N/A':>5s}"
    )


def avg_busbw(rows: Iterable[dict[str, Any]]) -> float:
    rows = list(rows)
    return sum(r["busbw"] for r in rows) / len(rows) if rows else 0.0


def footer(rows: list[dict[str, Any]]) -> list[str]:
    wrong = sum(r["wrong"] or 0 for r in rows)
    return [
        f"# Out of bounds values : {wrong} {'FAILED' if wrong else 'OK'}",
        f"# Avg bus bandwidth    : {avg_busbw(rows):g} ",
        "#",
    ]


def format_table(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The whole report (one header/rows/footer block per collective)."""
    lines = preamble(meta)
    ops = [op for op in OPS if any(r["op"] == op for r in rows)]
    for op in ops:
        mine = [r for r in rows if r["op"] == op]
        lines += header(op)
        lines += [format_row(r) for r in mine]
        lines += footer(mine)
    return "\n".join(lines) + "\n"


class LiveTable:
    """Prints the table as rows arrive (header when the collective changes)."""

    def __init__(self, out: IO[str], progress: Progress | None = None) -> None:
        self.out, self.progress = out, progress
        self.op: str | None = None
        self.rows: list[dict[str, Any]] = []

    def _write(self, lines: list[str]) -> None:
        if self.progress is not None:
            self.progress.clear()
        self.out.write("\n".join(lines) + "\n")
        self.out.flush()

    def start(self, meta_like: dict[str, Any]) -> None:
        self._write(preamble(meta_like))

    def row(self, row: dict[str, Any]) -> None:
        lines: list[str] = []
        if row["op"] != self.op:
            if self.op is not None:
                lines += footer(self.rows)
            self.op, self.rows = row["op"], []
            lines += header(self.op)
        self.rows.append(row)
        lines.append(format_row(row))
        self._write(lines)

    def finish(self) -> None:
        if self.op is not None:
            self._write(footer(self.rows))


class Progress:
    """A one-line progress bar on a terminal's stderr (nothing when not a TTY)."""

    def __init__(self, total: int, stream: IO[str] | None = None, width: int = 28) -> None:
        self.total, self.width = max(total, 1), width
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.what = ""
        self.t0 = time.monotonic()
        self.shown = False

    @staticmethod
    def wanted(stream: IO[str] | None = None) -> bool:
        stream = stream if stream is not None else sys.stderr
        try:
            return stream.isatty() and os.environ.get("TERM") != "dumb"
        except (AttributeError, ValueError):
            return False

    def on_event(self, ev: dict[str, Any]) -> None:
        if ev.get("event") == "start":
            self.what = f"{ev['op']} {format_size(ev['size'])}"
        elif ev.get("event") == "row":
            self.done += 1
        self.draw()

    def draw(self) -> None:
        filled = int(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.monotonic() - self.t0
        self.stream.write(f"\r\x1b[K[{bar}] {self.done}/{self.total} {elapsed:5.0f}s {self.what}")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def to_json(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """``{"meta": {...}, "rows": [row, ...]}``; ``wrong`` is null when unchecked."""
    return json.dumps({"meta": {**meta, "avg_busbw": avg_busbw(rows)}, "rows": rows}, indent=1, default=str)


class PlotUnavailable(RuntimeError):
    """``--plot`` without matplotlib installed."""


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (an optional extra: imported by name, so
    type checking does not need it installed)."""
    import importlib

    try:
        importlib.import_module("matplotlib").use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib, which is not installed: python3 -m pip install matplotlib"
        ) from None
    return plt


def plot(rows: list[dict[str, Any]], path: str, *, title: str = "") -> None:
    """Two panels, log-log: bus bandwidth and time per call against size, one line per collective."""
    plt = require_matplotlib()
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.6))
    for op in OPS:
        mine = [r for r in rows if r["op"] == op and r["size"] > 0]
        if not mine:
            continue
        xs = [r["size"] for r in mine]
        ax_bw.plot(xs, [max(r["busbw"], 1e-6) for r in mine], marker="o", ms=3, label=op)
        ax_t.plot(xs, [r["time_us"] for r in mine], marker="o", ms=3, label=op)
    for ax, ylabel in ((ax_bw, "bus bandwidth (GB/s)"), (ax_t, "time per call (µs)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        _size_ticks(ax, [r["size"] for r in rows if r["size"] > 0])
    ax_bw.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _size_ticks(ax: Any, sizes: list[int]) -> None:
    if not sizes:
        return
    lo, hi = int(math.log2(min(sizes))), math.ceil(math.log2(max(sizes)))
    step = max(2, (hi - lo) // 8 + 1)
    ticks = [2**k for k in range(lo, hi + 1, step)]
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_size(t).replace(" ", "") for t in ticks], fontsize=8)
