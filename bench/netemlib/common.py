"""What every part of the netem benchmark shares: constants, the exceptions that end a run
early, ``say`` (its one way to print a line), ``tail`` (the end of a child's log), and the
units: the delay, rate and size arguments (tc's spellings) and how sizes and times are
printed. Nothing but the standard library."""

from __future__ import annotations

import argparse
import math
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "ncX"
#: what each collective's sweep runs (``auto`` last); the fixed algorithms of netcoll.algorithms.ALGORITHMS
DEFAULT_ALGORITHMS = {
    "all_reduce": ("ring", "tree", "doubling", "allpairs", "halving", "auto"),
    "all_gather": ("ring", "doubling", "auto"),
    "broadcast": ("tree", "ring", "auto"),
}
DEFAULT_SEGMENT_BYTES = 4 << 20  # netcoll.algorithms._scratch.DEFAULT_SEGMENT_BYTES
COORD_PORT = 29400
CLEANUP_RESERVE_S = 20.0  # of --limit, kept for stopping processes and deleting namespaces


class Skip(Exception):
    """The machine does not allow what this needs: say why, exit 0."""


class Interrupted(Exception):
    """SIGINT / SIGTERM / SIGHUP."""


class OutOfTime(Exception):
    """--limit reached."""


def say(msg: str) -> None:
    print(f"netem: {msg}", flush=True)


def tail(path: str, n: int = 6) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:]) or "(empty log)"


# -- units ----------------------------------------------------------------------------------------
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6, "µs": 1e-6, "ns": 1e-9}
_RATE_UNITS = {
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
}


def parse_delay(text: str) -> float:
    """``200us``, ``1.5ms``, ``0`` -> seconds (tc's units)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zµ]*)\s*", text.lower())
    if not m or (m.group(2) and m.group(2) not in _TIME_UNITS):
        raise argparse.ArgumentTypeError(f"bad delay {text!r}: use e.g. 200us, 1ms, 0")
    value = float(m.group(1)) * _TIME_UNITS.get(m.group(2) or "s", 1.0)
    if value > 1.0:
        raise argparse.ArgumentTypeError(f"delay {text!r} is over 1 s")
    return value


def parse_rate(text: str) -> float:
    """``1gbit``, ``100mbit``, ``125mbps`` -> bits per second (tc's units: bps = bytes/s)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", text.lower())
    if not m or m.group(2) not in _RATE_UNITS:
        raise argparse.ArgumentTypeError(f"bad rate {text!r}: use e.g. 1gbit, 100mbit, 10gbit")
    value = float(m.group(1)) * _RATE_UNITS[m.group(2)]
    if not 1e5 <= value <= 1e12:
        raise argparse.ArgumentTypeError(f"rate {text!r} outside 100kbit..1tbit")
    return value


def parse_size(text: str) -> int:
    """``4``, ``4K``, ``4KiB``, ``16M``, ``1G``: powers of 1024, ``4KB``, ``16MB``: powers of
    1000, as netcoll's sizes (no netcoll import here, so the "not allowed here" path needs
    nothing but Python)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(|b|k|kb|kib|m|mb|mib|g|gb|gib)\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 4, 4K, 64KiB, 16M")
    unit = m.group(2)
    binary = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit[:1]]
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}[unit[0]] if len(unit) == 2 else binary  # KB, MB, GB: SI
    return int(float(m.group(1)) * scale)


def fmt_size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_us(us: float | None) -> str:
    if us is None or not math.isfinite(us):
        return "—"
    return f"{us / 1000:.2f} ms" if us >= 10_000 else f"{us:.0f} µs"


def tc_time(seconds: float) -> str:
    return f"{round(seconds * 1e6)}us"


def tc_rate(bits: float) -> str:
    return f"{round(bits)}bit"
