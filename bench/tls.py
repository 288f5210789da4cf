"""TLS against plain TCP on one machine (issue 36.3): all_reduce of a local cluster
(a coordinator here and N rank processes on 127.0.0.1) with every link forced to
``tcp``, then to ``tls`` (mutual TLS with a throwaway CA made here), alternately,
``--reps`` times. Per size each rank times ``--iters`` calls after ``--warmup``,
and measures its CPU time (user + system) over them: bus bandwidth from the
slowest rank's mean call, CPU per call as the mean over ranks. A cell is the
median over the repetitions; the ratios are tls / tcp of bus bandwidth, and
tcp / tls of CPU per call (what bus bandwidth would give where the ranks fill
the cores and nothing else runs: CPU time is far less disturbed by other
processes on a shared machine than wall time).

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
import resource
import statistics
import sys
import tempfile
import time
from typing import Any

from bench import machine
from netcoll.sizes import format_size, parse_size

KINDS = ("tcp", "tls")
STATISTIC = (
    "busbw from the slowest rank's mean over its timed calls, CPU per call (user + system) the mean over ranks; "
    "each the median over the repetitions, tcp and tls clusters alternating; "
    "ratios: tls / tcp of busbw, tcp / tls of CPU per call"
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


async def _rank(address: str, world: int, rank: int, sizes: list[int], iters: int, warmup: int) -> None:
    """One rank (``--worker``): per size, time ``iters`` all_reduce calls and their CPU
    time, check the result, print one JSON line."""
    import numpy as np

    import netcoll

    async with netcoll.connect(address, world_size=world, rank=rank, timeout=60) as comm:
        for size in sizes:
            x = np.ones(size // 4, np.float32)
            for _ in range(warmup):
                await comm.all_reduce(x)
            await comm.barrier()
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(iters):
                out = await comm.all_reduce(x)
            seconds = (time.perf_counter() - t0) / iters
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / iters
            right = bool(np.all(out == world))
            kinds = sorted({str(s["kind"]) for s in comm.link_stats().values()})
            print(json.dumps({"size": size, "seconds": seconds, "cpu": cpu, "right": right, "kinds": kinds}))
            await comm.barrier()


async def _cluster(kind: str, ranks: int, args: list[str], env: dict[str, str], limit: float) -> list[dict[str, Any]]:
    """A coordinator here and ``ranks`` worker processes; every rank's lines."""
    import netcoll
    from netcoll.mesh.certs import TlsConfig

    tls = TlsConfig(env["NETCOLL_TLS_CERT"], env["NETCOLL_TLS_KEY"], env["NETCOLL_TLS_CA"]) if kind == "tls" else None
    procs: list[asyncio.subprocess.Process] = []
    try:
        async with netcoll.Coordinator(host="127.0.0.1", tls=tls) as coord:
            for r in range(ranks):
                argv = ["-m", "bench.tls", "--worker", coord.address, str(ranks), str(r), *args]
                procs.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable, *argv, cwd=machine.ROOT, env=env, stdout=asyncio.subprocess.PIPE
                    )
                )
            outs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), limit)
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed over {kind} (exit codes {[p.returncode for p in procs]})")
    lines = [json.loads(line) for out, _ in outs for line in out.decode().splitlines() if line.startswith("{")]
    if any(not line["right"] or line["kinds"] != [kind] for line in lines):
        raise RuntimeError(f"a wrong result, or links other than {kind}: {lines}")
    return lines


def cluster_once(
    kind: str, ranks: int, sizes: list[int], iters: int, warmup: int, pki: dict[str, str], limit: float
) -> dict[int, tuple[float, float]]:
    """One local cluster with every link ``kind``: size -> (busbw GB/s, CPU ms per call)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_TLS_")}
    env.update(NETCOLL_TRANSPORT=kind, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if kind == "tls":
        env.update(pki)
    args = [",".join(map(str, sizes)), str(iters), str(warmup)]
    lines = asyncio.run(_cluster(kind, ranks, args, env, limit))
    got = {}
    for size in sizes:
        mine = [line for line in lines if line["size"] == size]
        slowest = max(line["seconds"] for line in mine)
        busbw = size / slowest * 2 * (ranks - 1) / ranks / 1e9
        got[size] = (busbw, 1e3 * statistics.fmean(line["cpu"] for line in mine))
    return got


def negotiated(pki: dict[str, str]) -> str:
    """The TLS version and cipher suite two netcoll contexts of ``pki`` agree on
    (a handshake over a Unix socket pair here)."""
    import socket
    import threading

    from netcoll.mesh.certs import TlsConfig

    config = TlsConfig(pki["NETCOLL_TLS_CERT"], pki["NETCOLL_TLS_KEY"], pki["NETCOLL_TLS_CA"])
    a, b = socket.socketpair()
    server = config.server_context().wrap_socket(a, server_side=True, do_handshake_on_connect=False)
    client = config.client_context().wrap_socket(b, do_handshake_on_connect=False)
    with server, client:
        server.settimeout(30)
        client.settimeout(30)
        peer = threading.Thread(target=client.do_handshake)
        peer.start()
        server.do_handshake()
        peer.join()
        cipher = server.cipher()
    return f"{cipher[1]} {cipher[0]}" if cipher else "?"


def measure(sizes: list[int], ranks: list[int], reps: int, iters: int, warmup: int, limit: float) -> dict[str, Any]:
    """Every (ranks, kind) cluster ``reps`` times, alternating kinds; the cells and
    their samples, and the cipher suite the TLS links negotiate."""
    bus: dict[tuple[int, str, int], list[float]] = {}
    cpu: dict[tuple[int, str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="netcoll-bench-tls-") as d:
        pki = make_pki(d)
        cipher = negotiated(pki)
        for rep in range(reps):
            for p in ranks:
                for kind in KINDS if rep % 2 == 0 else tuple(reversed(KINDS)):
                    got = cluster_once(kind, p, sizes, iters, warmup, pki, limit)
                    for size, (b, c) in got.items():
                        bus.setdefault((p, kind, size), []).append(b)
                        cpu.setdefault((p, kind, size), []).append(c)
                    figures = ", ".join(f"{format_size(s)} {b:.3f} GB/s {c:.1f} ms" for s, (b, c) in got.items())
                    print(f"rep {rep} ranks {p} {kind}: {figures}", flush=True)
    cells = []
    for p in ranks:
        for size in sizes:
            mb = {k: statistics.median(bus[(p, k, size)]) for k in KINDS}
            mc = {k: statistics.median(cpu[(p, k, size)]) for k in KINDS}
            cells.append(
                {
                    "ranks": p,
                    "bytes": size,
                    "tcp_gbs": round(mb["tcp"], 3),
                    "tls_gbs": round(mb["tls"], 3),
                    "ratio": round(mb["tls"] / mb["tcp"], 2),
                    "tcp_cpu_ms": round(mc["tcp"], 2),
                    "tls_cpu_ms": round(mc["tls"], 2),
                    "cpu_ratio": round(mc["tcp"] / mc["tls"], 2),
                    "tcp_samples": [round(x, 3) for x in bus[(p, "tcp", size)]],
                    "tls_samples": [round(x, 3) for x in bus[(p, "tls", size)]],
                    "tcp_cpu_samples": [round(x, 2) for x in cpu[(p, "tcp", size)]],
                    "tls_cpu_samples": [round(x, 2) for x in cpu[(p, "tls", size)]],
                }
            )
    return {"cells": cells, "cipher": cipher}


def render(path: str) -> str:
    """The docs' table (Markdown) of every run in a ``--json`` file."""
    with open(path) as f:
        data = json.load(f)
    lines = [
        "| run | ranks | size | busbw tcp | busbw tls | tls / tcp | CPU per call tcp | CPU per call tls | tcp / tls |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes = []
    for label, run in data["runs"].items():
        for c in run["cells"]:
            bus = f"{c['tcp_gbs']:.2f} GB/s | {c['tls_gbs']:.2f} GB/s | **{c['ratio']:.2f}**"
            cpu = f"{c['tcp_cpu_ms']:.1f} ms | {c['tls_cpu_ms']:.1f} ms | **{c['cpu_ratio']:.2f}**"
            lines.append(f"| {label} | {c['ranks']} | {format_size(c['bytes'])} | {bus} | {cpu} |")
        m = run["machine"]
        notes.append(
            f"{label}: {run['date']}, {m.get('nproc')} CPUs ({m.get('cpu')}), Python {m.get('python')}, "
            f"{run.get('openssl', '?')}, "
            + (f"{run['cipher']}, " if "cipher" in run else "")
            + f"{run['reps']} repetitions of {run['iters']} timed calls "
            f"(load average {run.get('load_before')} before)"
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
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)  # ADDRESS WORLD RANK SIZES ITERS WARMUP
    ns = ap.parse_args()
    if ns.worker:
        address, world, rank, sizes_csv, iters, warmup = ns.worker
        sizes_w = [int(x) for x in sizes_csv.split(",")]
        asyncio.run(_rank(address, int(world), int(rank), sizes_w, int(iters), int(warmup)))
        return
    if ns.render:
        print(render(ns.render))
        return
    import ssl

    import netcoll

    sizes = sorted(parse_size(s) for s in ns.sizes.split(","))
    ranks = [int(r) for r in ns.ranks.split(",")]
    load = machine.loadavg()
    started = time.time()
    run = measure(sizes, ranks, ns.reps, ns.iters, ns.warmup, ns.limit)
    run.update(
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=machine.facts(),
        openssl=ssl.OPENSSL_VERSION,
        netcoll_from=os.path.dirname(os.path.dirname(os.path.abspath(netcoll.__file__))),
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
        figures = f"tcp {c['tcp_gbs']:.3f} tls {c['tls_gbs']:.3f} GB/s, ratio {c['ratio']}; cpu ratio {c['cpu_ratio']}"
        print(f"{c['ranks']} ranks {format_size(c['bytes'])}: {figures}")


if __name__ == "__main__":
    main()
