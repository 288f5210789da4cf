"""TLS against plain TCP on one machine (issue 36.3): all_reduce bus bandwidth of a
local cluster (``netcoll.bench.local``: a coordinator and N rank processes on
127.0.0.1) with every link forced to ``tcp``, then to ``tls`` (mutual TLS with a
throwaway CA made here), alternately, ``--reps`` times; a cell is the median over
the repetitions of the sweep's busbw (each rank's mean over its timed calls, the
slowest rank), and the ratio is tls / tcp of the medians.

    python3 bench/tls.py                                    # 1, 16, 64 MiB; 2 and 4 ranks; 5 reps
    python3 bench/tls.py --json bench/tls-results.json      # record (replaces the run of its --label)
    python3 bench/tls.py --render bench/tls-results.json    # the docs' table, from the JSON alone

``--label`` names the run in the JSON (default ``current``): measuring another
checkout (``PYTHONPATH=/other/checkout:$PWD python3 bench/tls.py --label before``)
puts its figures beside these. Needs ``cryptography`` (the ``test`` extra) for the CA.
Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from bench import machine
from netcoll.bench.common import SweepConfig
from netcoll.bench.local import run_local
from netcoll.sizes import format_size, parse_size

KINDS = ("tcp", "tls")
STATISTIC = (
    "busbw of one sweep row (time per call = each rank's mean over its timed calls, then the slowest rank); "
    "median over the repetitions, tcp and tls runs alternating; ratio = median tls / median tcp"
)


def make_pki(directory: str) -> dict[str, str]:
    """A throwaway CA and one certificate for every process: ``NETCOLL_TLS_*`` values."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)

    def cert(subject: str, issuer: str, public: Any, signer: Any, ca: bool) -> x509.Certificate:
        def name(cn: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

        builder = x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
        builder = builder.public_key(public).serial_number(x509.random_serial_number())
        builder = builder.not_valid_before(start).not_valid_after(end)
        builder = builder.add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    paths = {name: os.path.join(directory, f"{name}.pem") for name in ("ca", "cert", "key")}
    pem = serialization.Encoding.PEM
    with open(paths["ca"], "wb") as f:
        f.write(cert("bench ca", "bench ca", ca_key.public_key(), ca_key, True).public_bytes(pem))
    with open(paths["cert"], "wb") as f:
        f.write(cert("bench node", "bench ca", key.public_key(), ca_key, False).public_bytes(pem))
    fd = os.open(paths["key"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return {"NETCOLL_TLS_CERT": paths["cert"], "NETCOLL_TLS_KEY": paths["key"], "NETCOLL_TLS_CA": paths["ca"]}


def sweep_once(kind: str, ranks: int, cfg: SweepConfig, pki: dict[str, str], limit: float) -> dict[int, float]:
    """One local cluster with every link ``kind``: size -> busbw (GB/s)."""
    saved = {k: os.environ.get(k) for k in ("NETCOLL_TRANSPORT", *pki)}
    os.environ["NETCOLL_TRANSPORT"] = kind
    for k, v in pki.items():
        if kind == "tls":
            os.environ[k] = v
        else:
            os.environ.pop(k, None)
    try:
        result = asyncio.run(run_local(cfg, ranks, limit=limit))
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old
    return {int(row["size"]): float(row["busbw"]) for row in result["rows"] if row.get("wrong") in (0, None)}


def measure(sizes: list[int], ranks: list[int], reps: int, iters: int, warmup: int, limit: float) -> dict[str, Any]:
    """Every (ranks, kind) sweep ``reps`` times, alternating kinds; the cells and their samples."""
    samples: dict[tuple[int, str, int], list[float]] = {}
    cfg = SweepConfig(
        ops=["all_reduce"], minbytes=min(sizes), maxbytes=max(sizes), stepfactor=4, iters=iters, warmup=warmup
    ).validate()
    with tempfile.TemporaryDirectory(prefix="netcoll-bench-tls-") as d:
        pki = make_pki(d)
        for rep in range(reps):
            for p in ranks:
                for kind in KINDS if rep % 2 == 0 else tuple(reversed(KINDS)):
                    got = sweep_once(kind, p, cfg, pki, limit)
                    for size in sizes:
                        if size in got:
                            samples.setdefault((p, kind, size), []).append(got[size])
                    print(
                        f"rep {rep} ranks {p} {kind}: "
                        + ", ".join(f"{format_size(s)} {got.get(s, 0):.3f}" for s in sizes)
                    )
    cells = []
    for p in ranks:
        for size in sizes:
            med = {k: statistics.median(samples.get((p, k, size), [0.0])) for k in KINDS}
            cells.append(
                {
                    "ranks": p,
                    "bytes": size,
                    "tcp_gbs": round(med["tcp"], 3),
                    "tls_gbs": round(med["tls"], 3),
                    "ratio": round(med["tls"] / med["tcp"], 2) if med["tcp"] else None,
                    "tcp_samples": [round(x, 3) for x in samples.get((p, "tcp", size), [])],
                    "tls_samples": [round(x, 3) for x in samples.get((p, "tls", size), [])],
                }
            )
    return {"cells": cells}


def render(path: str) -> str:
    """The docs' table (Markdown) of every run in a ``--json`` file."""
    with open(path) as f:
        data = json.load(f)
    lines = [
        "| run | ranks | size | tcp busbw (GB/s) | tls busbw (GB/s) | tls / tcp |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    notes = []
    for label, run in data["runs"].items():
        for c in run["cells"]:
            ratio = "" if c["ratio"] is None else f"{c['ratio']:.2f}"
            figures = f"{c['tcp_gbs']:.2f} | {c['tls_gbs']:.2f} | {ratio}"
            lines.append(f"| {label} | {c['ranks']} | {format_size(c['bytes'])} | {figures} |")
        m = run["machine"]
        notes.append(
            f"{label}: {run['date']}, netcoll {m.get('commit', '?')}, {m.get('nproc')} CPUs ({m.get('cpu')}), "
            f"Python {m.get('python')}, {run.get('openssl', '?')}, {run['reps']} repetitions of "
            f"{run['iters']} timed calls, load {run.get('load_before')}"
        )
    lines.append("")
    lines.append("_" + "; ".join(notes) + f". Statistic: {data['statistic']}._")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="1M,16M,64M", help="all_reduce sizes (default 1M,16M,64M)")
    ap.add_argument("--ranks", default="2,4", help="world sizes (default 2,4)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each sweep (default 5)")
    ap.add_argument("--iters", type=int, default=5, help="timed calls per size (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls per size first (default 2)")
    ap.add_argument("--limit", type=float, default=600.0, help="seconds one sweep may take")
    ap.add_argument("--label", default="current", help="the run's name in the JSON (default current)")
    ap.add_argument("--json", help="record the run in this file (replacing a run of the same --label)")
    ap.add_argument("--render", metavar="JSON", help="print a --json file as the docs' table, and stop")
    ns = ap.parse_args()
    if ns.render:
        print(render(ns.render))
        return
    import ssl

    sizes = sorted(parse_size(s) for s in ns.sizes.split(","))
    ranks = [int(r) for r in ns.ranks.split(",")]
    load = machine.loadavg()
    started = time.time()
    run = measure(sizes, ranks, ns.reps, ns.iters, ns.warmup, ns.limit)
    run.update(
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=machine.facts(),
        openssl=ssl.OPENSSL_VERSION,
        reps=ns.reps,
        iters=ns.iters,
        warmup=ns.warmup,
        load_before=load,
        elapsed_s=round(time.time() - started, 1),
        command=" ".join(["python3", "bench/tls.py", *sys.argv[1:]]),
    )
    if ns.json:
        data: dict[str, Any] = {"statistic": STATISTIC, "runs": {}}
        if os.path.exists(ns.json):
            with open(ns.json) as f:
                data = json.load(f)
        data["statistic"] = STATISTIC
        data["runs"][ns.label] = run
        with open(ns.json, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
    for c in run["cells"]:
        figures = f"tcp {c['tcp_gbs']:.3f} tls {c['tls_gbs']:.3f} GB/s, ratio {c['ratio']}"
        print(f"{c['ranks']} ranks {format_size(c['bytes'])}: {figures}")


if __name__ == "__main__":
    main()
