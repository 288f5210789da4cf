"""Loss curves of compressed data-parallel training (issue 36.1): the training examples
(examples/training/ddp.py, the numpy MLP; examples/training/torch_ddp.py, torch DDP with
netcoll's compression hook) run under ``netcoll run`` on loopback with every codec, with and
without error feedback; each run's loss per step (``--losses``) is recorded.

Scenarios:

* ``ddp``: ddp.py, a new batch every step (SGD's own noise is large), 400 steps, lr 0.1;
* ``ddp_fullbatch``: ddp.py ``--batches 1``: full-batch gradient descent on one batch of 48
  samples, 3000 steps, lr 0.1: the loss falls by 15 orders of magnitude, until the
  gradients are smaller than what a codec resolves;
* ``torch_ddp``: torch_ddp.py, a new batch every step, SGD with momentum, 300 steps, lr 0.05.

``final`` is the example's own final loss (ddp.py: the loss of the next batch; torch_ddp.py:
of a held-out batch), ``reference`` the same training in one process, uncompressed.

    python3 bench/losscurves.py --json bench/losscurves-results.json   # about 10 minutes
    python3 bench/losscurves.py --render bench/losscurves-results.json [--plot docs/losscurves.png]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "training"
RANKS = 4
#: (codec, error feedback): "none" once (nothing to feed back)
SETTINGS: tuple[tuple[str, bool], ...] = (
    ("none", False),
    ("fp16", False),
    ("fp16", True),
    ("bf16", False),
    ("bf16", True),
    ("int8", False),
    ("int8", True),
)
SCENARIOS: dict[str, dict[str, Any]] = {
    "ddp": {"script": "ddp.py", "args": ["--steps", "400", "--lr", "0.1"]},
    "ddp_fullbatch": {"script": "ddp.py", "args": ["--steps", "3000", "--lr", "0.1", "--batches", "1"]},
    "torch_ddp": {"script": "torch_ddp.py", "args": ["--steps", "300", "--lr", "0.05"]},
}
#: at most this many points of a curve are kept (every k-th step, the last one included)
POINTS = 500


def name(codec: str, feedback: bool) -> str:
    return codec + ("+ef" if feedback else "")


def run(script: str, args: list[str], codec: str, feedback: bool) -> dict[str, Any]:
    """One run of ``script`` under ``netcoll run -n RANKS``: its ``--losses`` document."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "losses.json"
        cmd = [sys.executable, "-m", "netcoll", "run", "-n", str(RANKS), str(EXAMPLES / script), *args]
        cmd += ["--compression", codec, "--losses", str(out), *(["--error-feedback"] if feedback else [])]
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd[3:])} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        doc: dict[str, Any] = json.loads(out.read_text())
        return doc


def thin(losses: list[float]) -> tuple[int, list[float]]:
    """Every k-th loss (k so that at most POINTS remain) and k; the last one kept."""
    every = max(1, -(-len(losses) // POINTS))
    kept = losses[::every]
    if (len(losses) - 1) % every:
        kept.append(losses[-1])
    return every, [float(f"{v:.6g}") for v in kept]


def measure() -> dict[str, Any]:
    scenarios: dict[str, Any] = {}
    for label, scenario in SCENARIOS.items():
        runs: dict[str, Any] = {}
        for codec, feedback in SETTINGS:
            doc = run(scenario["script"], scenario["args"], codec, feedback)
            every, curve = thin(doc["loss"])
            runs[name(codec, feedback)] = {
                "steps": len(doc["loss"]),
                "every": every,
                "loss": curve,
                "final": doc["final"],
                "reference": doc["reference"],
            }
            print(f"[losscurves] {label} {name(codec, feedback)}: final {doc['final']:.4g}", file=sys.stderr)
        command = f"netcoll run -n {RANKS} examples/training/{scenario['script']} " + " ".join(scenario["args"])
        scenarios[label] = {"command": command, "runs": runs}
    meta = {"ranks": RANKS, "link": "tcp (loopback)", "python": platform.python_version()}
    return {"meta": meta, "scenarios": scenarios}


def loss_at(run: dict[str, Any], step: int) -> float:
    """The recorded loss of ``step`` (0-based; the last step if it was thinned away)."""
    every, curve = run["every"], run["loss"]
    if step == run["steps"] - 1:
        return float(curve[-1])
    return float(curve[min(step // every, len(curve) - 1)])


def _steps_shown(steps: int, every: int) -> list[int]:
    return sorted({0, *(every * round(steps * f / every) for f in (0.1, 0.5)), steps - 1})


def render(doc: dict[str, Any]) -> str:
    """docs/compression.md's tables (the training part) from a results document."""
    lines: list[str] = []
    for label, scenario in doc["scenarios"].items():
        runs = scenario["runs"]
        first = runs["none"]
        shown = _steps_shown(first["steps"], first["every"])
        base = first["final"]
        lines += [
            f"`{label}`: `{scenario['command']}` (`--compression` and `--error-feedback` as in the first column); "
            f"one process, uncompressed, ends at {first['reference']:.4g}:",
            "",
            "| setting | " + " | ".join(f"loss at step {s + 1}" for s in shown) + " | final loss | final / none's |",
            "| --- | " + " | ".join("---" for _ in shown) + " | --- | --- |",
        ]
        for setting, got in runs.items():
            cells = [f"{loss_at(got, s):.4g}" for s in shown]
            ratio = got["final"] / base
            apart = "" if setting == "none" else f"{ratio:.4f}" if ratio < 10 else f"{ratio:.0f}"
            lines.append(f"| {setting} | " + " | ".join(cells) + f" | {got['final']:.4g} | {apart} |")
        lines.append("")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: str) -> bool:
    """One column per scenario: the loss against step (log scale; 20-step moving averages
    where every step draws a new batch), and below it each setting's loss over none's at the
    same step. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[losscurves] no plot: matplotlib is not installed", file=sys.stderr)
        return False
    scenarios = doc["scenarios"]
    fig, axes = plt.subplots(2, len(scenarios), figsize=(5 * len(scenarios), 7), squeeze=False)
    for col, (label, scenario) in enumerate(scenarios.items()):
        _panels(axes[0][col], axes[1][col], label, scenario)
    fig.tight_layout()
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)
    return True


def _panels(top: Any, ratio: Any, label: str, scenario: dict[str, Any]) -> None:
    import numpy as np

    smooth = "--batches" not in scenario["command"]
    base = np.asarray(scenario["runs"]["none"]["loss"], float)
    for i, (setting, got) in enumerate(scenario["runs"].items()):
        y = np.asarray(got["loss"], float)
        x = np.arange(len(y)) * got["every"] + 1
        x[-1] = got["steps"]
        style = {"color": f"C{(i + 1) // 2}", "lw": 1.1, "label": setting}
        dashes = "-" if setting == "none" or setting.endswith("+ef") else "--"
        if smooth:
            top.plot(x[19:], np.convolve(y, np.ones(20) / 20, mode="valid"), dashes, **style)
        else:
            top.plot(x, y, dashes, **style)
        ratio.plot(x, y / base, dashes, **style)
    top.set_yscale("log")
    top.set_title(label + (" (20-step moving average)" if smooth else ""), fontsize=9)
    top.set_ylabel("loss")
    top.legend(fontsize=7)
    ratio.set_yscale("log")
    ratio.set_title(f"{label}: loss / none's loss, step by step", fontsize=9)
    ratio.set_xlabel("step")
    ratio.set_ylabel("ratio")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="PATH", help="write the results there (else print them)")
    ap.add_argument("--render", metavar="PATH", help="print the docs' tables of a results file and exit")
    ap.add_argument("--plot", metavar="PNG", help="with --render: draw the curves there too")
    ns = ap.parse_args(argv)
    if ns.render:
        doc = json.loads(Path(ns.render).read_text())
        sys.stdout.write(render(doc))
        if ns.plot:
            plot(doc, ns.plot)
        return 0
    text = json.dumps(measure(), indent=1) + "\n"
    if ns.json:
        Path(ns.json).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
