"""What a benchmark result depends on, recorded with it: the machine (CPU model, cores,
kernel), the date, the versions (Python, numpy, netcoll's git revision, torch, Open MPI,
mpi4py) and the load; and the one-line provenance every generated table carries.

Used by ``bench/compare.py`` when it measures (:func:`facts`) and by the report when it
renders, from the JSON alone (:func:`provenance`), so a re-render never looks at this machine.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the statistic of the sweep's ``time`` column, and of the 4-byte latency runs
STAT_SWEEP = "time per call = each rank's mean over its timed calls, then the maximum over ranks"
STAT_LATENCY = "each rank's median call, then the maximum over ranks"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def git_describe() -> str:
    """netcoll's short revision, with a mark when netcoll/ has uncommitted changes."""
    try:
        rev = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no", "--", "netcoll"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return (rev or "?") + (" + uncommitted changes in netcoll/" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def peer_versions() -> dict[str, str]:
    """torch, mpi4py, Open MPI (``mpirun --version``), uvloop: whichever are installed."""
    v: dict[str, str] = {}
    try:
        import torch

        v["torch"] = str(torch.__version__)
    except ImportError:
        pass
    try:
        import mpi4py

        v["mpi4py"] = str(mpi4py.__version__)
    except ImportError:
        pass
    if shutil.which("mpirun"):
        try:
            out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=30).stdout
            v["mpirun"] = out.splitlines()[0].strip() if out else "?"
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        v["uvloop"] = importlib.metadata.version("uvloop")  # (uvloop's stubs do not export __version__)
    except importlib.metadata.PackageNotFoundError:
        pass
    return v


def facts() -> dict[str, Any]:
    """This machine and these versions, now (for a run's ``meta``)."""
    import numpy

    import netcoll

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "netcoll": netcoll.__version__,
        "platform": platform.platform(),
        "hostname": platform.node(),
        **peer_versions(),
        "commit": git_describe(),
    }


def loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def cpu_busy(seconds: float = 1.0) -> float | None:
    """Fraction of all CPUs' time not idle over ``seconds`` (from /proc/stat), or None."""

    def snap() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + (v[4] if len(v) > 4 else 0)

    try:
        t0, i0 = snap()
        time.sleep(seconds)
        t1, i1 = snap()
    except (OSError, ValueError, IndexError):
        return None
    return round(1 - (i1 - i0) / max(t1 - t0, 1), 3)


def kernel(meta: dict[str, Any]) -> str:
    """The kernel release: recorded, or read out of ``platform`` (older results)."""
    if meta.get("kernel"):
        return str(meta["kernel"])
    plat = str(meta.get("platform", ""))
    parts = plat.split("-")
    return parts[1] if len(parts) > 2 and parts[0] == "Linux" else (plat or "?")


def open_mpi(meta: dict[str, Any]) -> str | None:
    """``mpirun (Open MPI) 4.1.4`` -> ``Open MPI 4.1.4``."""
    text: str | None = meta.get("mpirun")
    if not text:
        return None
    if "Open MPI" in text:
        return "Open MPI " + text.rsplit(" ", 1)[-1]
    return str(text)


def versions(meta: dict[str, Any]) -> str:
    parts = [
        f"Python {meta.get('python', '?')}",
        f"numpy {meta.get('numpy', '?')}",
        f"netcoll {meta.get('netcoll', '?')} at {meta.get('commit', '?')}",
    ]
    if meta.get("torch"):
        parts.append(f"torch {meta['torch']}")
    if open_mpi(meta):
        parts.append(str(open_mpi(meta)))
    if meta.get("mpi4py"):
        parts.append(f"mpi4py {meta['mpi4py']}")
    return ", ".join(parts)


def machine(meta: dict[str, Any]) -> str:
    return f"{meta.get('cpu', '?')}, {meta.get('nproc', '?')} cores, Linux {kernel(meta)}"


def rounds_clause(meta: dict[str, Any]) -> str:
    """How interleaved runs were combined, if there were several (``compare.py --rounds``)."""
    many = {n: r for n, r in (meta.get("rounds") or {}).items() if r > 1}
    if not many:
        return ""
    worlds = ", ".join(sorted(many, key=int))
    counts = ", ".join(str(r) for r in sorted(set(many.values())))
    return (
        f"; at {worlds} ranks, every value is the median run of {counts} interleaved runs "
        "(each implementation once per round, in rotated order; every run's value in bench/results.json)"
    )


def provenance(meta: dict[str, Any], statistic: str = STAT_SWEEP) -> str:
    """The line under every generated table: machine, date, versions, statistic."""
    return (
        f"_Machine: {machine(meta)}. Date: {meta.get('date', '?')}. Versions: {versions(meta)}. "
        f"Statistic: {statistic}{rounds_clause(meta)}._"
    )
