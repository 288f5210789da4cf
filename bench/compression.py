"""What compression costs in accuracy and saves in bytes (issue 36.1): each codec's error
against a float64 reference and the bytes on the links (``comm.link_stats()``'s
``bytes_sent``) relative to the same call uncompressed, over an in-process world.

Data (float32, one array per rank):

* ``normal``: standard normal, 1 Mi elements per rank;
* ``student_t3``: Student's t with 3 degrees of freedom (heavy-tailed: rare large
  values widen an int8 block's scale), 1 Mi elements per rank;
* ``mlp_grads``: the gradients of examples/training/mlp.py's model, each rank on its
  shard of every step's batch while training (SGD, every step's averaged gradient
  applied), all steps' gradients of one rank concatenated.

Errors are of ``all_reduce(op="sum")`` (every contribution encoded, the reduced shards
encoded again) and of ``all_gather`` (one encoding), against the sum (the inputs) in
float64: the largest absolute error over the largest magnitude of the reference, and the
RMS error over the reference's RMS.

    python3 bench/compression.py                       # prints the JSON
    python3 bench/compression.py --json bench/compression-results.json
    python3 bench/compression.py --render bench/compression-results.json   # the docs' tables
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

from netcoll.comm import Communicator
from netcoll.compression import Compression
from netcoll.mesh.inprocess import MemoryHub

CODECS: tuple[Compression, ...] = ("none", "fp16", "bf16", "int8")
COLLECTIVES = ("all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast")
ROOT = Path(__file__).resolve().parents[1]


def _mlp() -> Any:
    spec = importlib.util.spec_from_file_location("mlp", ROOT / "examples" / "training" / "mlp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mlp_grads(ranks: int, lr: float = 0.05) -> list[np.ndarray]:
    """Every rank's gradients over a training run of the example MLP (float32)."""
    m = _mlp()
    p = m.init_params()
    per_rank: list[list[np.ndarray]] = [[] for _ in range(ranks)]
    for step in range(m.STEPS):
        x, y = m.batch(step)
        gs = [m.grads(p, *m.shard([x, y], r, ranks)) for r in range(ranks)]
        for r in range(ranks):
            per_rank[r].append(m.flatten(gs[r]))
        mean = sum(m.flatten(g) for g in gs) / ranks
        p = m.unflatten(m.flatten(p) - lr * mean, p)
    return [np.concatenate(g).astype(np.float32) for g in per_rank]


def datasets(ranks: int, n: int) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(36)
    return {
        "normal": [rng.standard_normal(n).astype(np.float32) for _ in range(ranks)],
        "student_t3": [rng.standard_t(3, n).astype(np.float32) for _ in range(ranks)],
        "mlp_grads": mlp_grads(ranks),
    }


def _errors(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    diff = got.astype(np.float64) - want
    scale = float(np.abs(want).max()) or 1.0
    rms = float(np.sqrt(np.mean(want**2))) or 1.0
    return {"max_abs_rel": float(np.abs(diff).max()) / scale, "rms_rel": float(np.sqrt(np.mean(diff**2))) / rms}


async def _run(comms: list[Communicator], name: str, xs: list[np.ndarray], codec: Compression) -> list[Any]:
    def one(c: Communicator) -> Any:
        x = xs[c.rank]
        if name == "all_reduce":
            return c.all_reduce(x, compression=codec)
        if name == "reduce":
            return c.reduce(x, compression=codec)
        if name == "reduce_scatter":
            return c.reduce_scatter(x.reshape(len(comms), -1), compression=codec)
        if name == "all_gather":
            return c.all_gather(x, compression=codec)
        return c.broadcast(x if c.rank == 0 else None, compression=codec)

    return list(await asyncio.gather(*(one(c) for c in comms)))


def _sent(comms: list[Communicator]) -> int:
    return sum(int(v["bytes_sent"]) for c in comms for v in c.link_stats().values())


async def measure(ranks: int, n: int) -> dict[str, Any]:
    hub = MemoryHub(ranks)
    comms = [Communicator(m) for m in hub.meshes]
    errors: dict[str, Any] = {}
    for label, xs in datasets(ranks, n).items():
        wide = np.stack([x.astype(np.float64) for x in xs])
        errors[label] = {"elements": int(xs[0].size), "all_reduce": {}, "all_gather": {}}
        for codec in CODECS:
            got = await _run(comms, "all_reduce", xs, codec)
            assert all(np.array_equal(g, got[0]) for g in got)  # bit-identical on every rank
            errors[label]["all_reduce"][codec] = _errors(got[0], wide.sum(0))
            got = await _run(comms, "all_gather", xs, codec)
            errors[label]["all_gather"][codec] = _errors(got[0], wide)
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    ratios: dict[str, Any] = {}
    for name in COLLECTIVES:
        sent = {}
        for codec in CODECS:
            before = _sent(comms)
            await _run(comms, name, [x] * ranks, codec)
            sent[codec] = _sent(comms) - before
        ratios[name] = {codec: sent[codec] / sent["none"] for codec in CODECS}
    return {
        "meta": {
            "ranks": ranks,
            "elements_per_rank": n,
            "dtype": "float32",
            "links": "memory (in-process; bytes_sent counts payload bytes, int8 scales included, not frame headers)",
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
        "errors": errors,
        "bytes_ratio": ratios,
    }


def render(doc: dict[str, Any]) -> str:
    """The docs' tables (docs/compression.md) from a results document."""
    meta = doc["meta"]
    lines = [
        f"Bytes sent over the links, relative to the same call uncompressed ({meta['ranks']} ranks, "
        f"{meta['elements_per_rank'] * 4 >> 20} MiB of float32 per rank):",
        "",
        "| collective | fp16 | bf16 | int8 |",
        "| --- | --- | --- | --- |",
    ]
    for name, row in doc["bytes_ratio"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.3f}" for c in CODECS[1:]) + " |")
    lines += [
        "",
        f"Error against float64 ({meta['ranks']} ranks; max: largest absolute error / largest |reference|; "
        "rms: RMS error / RMS of the reference):",
        "",
        "| data | call | none (max / rms) | fp16 (max / rms) | bf16 (max / rms) | int8 (max / rms) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for label, per in doc["errors"].items():
        for call in ("all_reduce", "all_gather"):
            cells = [f"{per[call][c]['max_abs_rel']:.1e} / {per[call][c]['rms_rel']:.1e}" for c in CODECS]
            lines.append(f"| {label} ({per['elements']} el.) | {call} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--elements", type=int, default=1 << 20, help="per rank, normal and student_t3 (default 1Mi)")
    ap.add_argument("--json", metavar="PATH", help="write the results there")
    ap.add_argument("--render", metavar="PATH", help="print the docs' tables of a results file and exit")
    ns = ap.parse_args(argv)
    if ns.render:
        sys.stdout.write(render(json.loads(Path(ns.render).read_text())))
        return 0
    doc = asyncio.run(measure(ns.ranks, ns.elements))
    text = json.dumps(doc, indent=2) + "\n"
    if ns.json:
        Path(ns.json).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
