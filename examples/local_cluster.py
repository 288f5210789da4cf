#!/usr/bin/env python3
"""A local netcoll cluster doing real collectives: a coordinator in this
process and N rank processes on this machine, over loopback TCP.

    python3 examples/local_cluster.py --ranks 4

Each rank is its own OS process (this script with ``--worker``) that joins
from its own loopback address (127.0.0.2, 127.0.0.3, ... standing in for
separate hosts; plain 127.0.0.1 where the OS has no such aliases), runs every
collective once on real data, checks the result against numpy, and times a
1 MiB and a 16 MiB all_reduce. The summary has one line per collective.
Exit status 0 when every check passed on every rank, else 1 (2 for bad
arguments, 130 on Ctrl-C). Every rank process is killed on every way out.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

SCRIPT = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(SCRIPT))
sys.path.insert(0, ROOT)  # the netcoll next to this script, installed or not

try:
    import netcoll
    from netcoll.ops import reduce_reference
except KeyboardInterrupt:  # Ctrl-C while still importing
    sys.exit(130)

MAX_RANKS = 64


# ---------------------------------------------------------------------------- worker (one rank)


def data(seed: int, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """Deterministic test data every rank can compute for every other rank."""
    return np.random.default_rng(seed).integers(-8, 9, size=shape).astype(dtype)


class Checks:
    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    async def run(self, name: str, call: Callable[[], Awaitable[Any]], check: Callable[[Any], bool]) -> Any:
        t0 = time.perf_counter()
        out = await call()
        ms = (time.perf_counter() - t0) * 1e3
        ok = bool(check(out))
        self.results.append({"name": name, "ok": ok, "ms": ms})
        return out


async def collectives(comm: netcoll.Communicator) -> tuple[list[dict[str, Any]], str]:
    n, r = comm.world_size, comm.rank
    c = Checks()
    xs = [data(k, (1000,)) for k in range(n)]
    y = await c.run(
        "all_reduce sum float32",
        lambda: comm.all_reduce(xs[r]),
        lambda y: np.array_equal(y, reduce_reference("sum", xs)),
    )
    digest = hashlib.sha256(y.tobytes()).hexdigest()  # the parent checks it is the same on every rank
    fs = [data(k, (333, 3), np.float64) for k in range(n)]
    await c.run(
        "all_reduce avg float64",
        lambda: comm.all_reduce(fs[r], op="avg"),
        lambda y: np.allclose(y, reduce_reference("avg", fs)),
    )
    ints = [data(k, (5000,), np.int32) for k in range(n)]
    await c.run(
        "all_reduce max int32",
        lambda: comm.all_reduce(ints[r], op="max"),
        lambda y: np.array_equal(y, reduce_reference("max", ints)),
    )
    root = n - 1
    await c.run(
        "broadcast",
        lambda: comm.broadcast(xs[root] if r == root else None, root=root),
        lambda b: b.dtype == xs[root].dtype and np.array_equal(b, xs[root]),
    )
    await c.run(
        "reduce",
        lambda: comm.reduce(ints[r], op="sum", root=0),
        lambda y: (y is None) == (r != 0) and (y is None or np.array_equal(y, reduce_reference("sum", ints))),
    )
    await c.run("all_gather", lambda: comm.all_gather(xs[r]), lambda y: np.array_equal(y, np.stack(xs)))
    await c.run(
        "gather",
        lambda: comm.gather(xs[r], root=root),
        lambda y: (y is None) == (r != root) and (y is None or np.array_equal(y, np.stack(xs))),
    )
    table = np.stack([data(100 + k, (10, 10)) for k in range(n)])
    await c.run(
        "scatter", lambda: comm.scatter(table if r == 0 else None, root=0), lambda y: np.array_equal(y, table[r])
    )
    mats = [np.stack([data(1000 + k * n + j, (256,)) for j in range(n)]) for k in range(n)]
    await c.run(
        "reduce_scatter",
        lambda: comm.reduce_scatter(mats[r]),
        lambda y: np.array_equal(y, reduce_reference("sum", mats)[r]),
    )
    await c.run(
        "all_to_all",
        lambda: comm.all_to_all(mats[r]),
        lambda y: np.array_equal(y, np.stack([mats[j][r] for j in range(n)])),
    )
    # uneven sizes, as lists
    lists = [[data(2000 + i * n + j, (i + j + 1, 2)) for j in range(n)] for i in range(n)]
    await c.run(
        "all_to_all (uneven list)",
        lambda: comm.all_to_all(lists[r]),
        lambda y: all(np.array_equal(y[j], lists[j][r]) for j in range(n)),
    )
    mine = [data(3000 + k, (k + 1,)) for k in range(n)]
    await c.run(
        "all_gather (uneven)",
        lambda: comm.all_gather(mine[r], uneven=True),
        lambda y: all(np.array_equal(a, b) for a, b in zip(y, mine, strict=True)),
    )
    await c.run(
        "reduce_scatter (uneven list)",
        lambda: comm.reduce_scatter([data(4000 + r * n + j, (j + 3,), np.int64) for j in range(n)]),
        lambda y: np.array_equal(y, sum(data(4000 + i * n + r, (r + 3,), np.int64) for i in range(n))),
    )
    if n > 1:

        async def ring_p2p() -> np.ndarray:
            await comm.send(xs[r], (r + 1) % n, tag=1)
            return await comm.recv((r - 1) % n, tag=1)

        await c.run("send / recv", ring_p2p, lambda y: np.array_equal(y, xs[(r - 1) % n]))
    await c.run("barrier", comm.barrier, lambda y: y is None)

    async def split() -> Any:
        sub = await comm.split(r % 2, key=r)
        return await sub.all_reduce(np.array([r], np.int64))  # type: ignore[union-attr]

    await c.run("split + all_reduce", split, lambda y: int(y[0]) == sum(k for k in range(n) if k % 2 == r % 2))
    return c.results, digest


async def bench(comm: netcoll.Communicator) -> list[dict[str, Any]]:
    out = []
    for mib, iters in ((1, 10), (16, 4)):
        x = np.ones(mib * 2**20 // 4, np.float32)
        await comm.all_reduce(x)  # warm up (links, buffers)
        times = []
        for _ in range(iters):
            await comm.barrier()
            t0 = time.perf_counter()
            y = await comm.all_reduce(x)
            times.append(time.perf_counter() - t0)
        ok = bool((y == comm.world_size).all())
        out.append({"mib": mib, "ms": statistics.median(times) * 1e3, "ok": ok})
    return out


def watch_parent() -> None:
    """Exit when the parent goes away (its end of our stdin closes), so a rank
    never outlives the cluster script, however that ended."""

    def watch() -> None:
        try:
            sys.stdin.buffer.read()
        except Exception:  # noqa: BLE001 - whatever ended the read, the parent is gone
            pass
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


async def worker(args: argparse.Namespace, me: dict[str, Any]) -> dict[str, Any]:
    async with netcoll.connect(
        args.coordinator,
        world_size=args.ranks,
        local_host=args.host,
        timeout=args.timeout,
        collective_timeout=args.timeout,
    ) as comm:
        me["rank"] = comm.rank
        results, digest = await collectives(comm)
        timings = await bench(comm)
        await comm.barrier()
        return {"ok": True, "rank": comm.rank, "results": results, "digest": digest, "bench": timings}


def worker_main(args: argparse.Namespace) -> int:
    watch_parent()
    me: dict[str, Any] = {}
    try:
        result = asyncio.run(worker(args, me))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - reported to the parent as this rank's result
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", **me}
    print(json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------- the cluster (parent)


def loopback_hosts(n: int) -> list[str]:
    """127.0.0.2, 127.0.0.3, ... when this OS routes all of 127/8 to loopback
    (Linux does; macOS needs aliases), else 127.0.0.1 for everyone."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
        return [f"127.0.0.{i + 2}" for i in range(n)]
    except OSError:
        return ["127.0.0.1"] * n


class ClusterError(Exception):
    pass


async def run_cluster(n: int, timeout: float) -> list[dict[str, Any]]:
    hosts = loopback_hosts(n)
    procs: list[asyncio.subprocess.Process] = []
    try:
        async with netcoll.Coordinator(host="127.0.0.1") as coord:
            print(
                f"coordinator on {coord.address}; starting {n} rank processes "
                f"({hosts[0]}{' .. ' + hosts[-1] if n > 1 and hosts[-1] != hosts[0] else ''})",
                flush=True,
            )
            for i in range(n):
                procs.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable,
                        SCRIPT,
                        "--worker",
                        "--coordinator",
                        coord.address,
                        "--ranks",
                        str(n),
                        "--host",
                        hosts[i],
                        "--timeout",
                        str(timeout),
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                    )
                )

            async def finish(i: int, p: asyncio.subprocess.Process) -> dict[str, Any]:
                out, err = await asyncio.gather(p.stdout.read(), p.stderr.read())  # type: ignore[union-attr]
                await p.wait()
                lines = out.decode(errors="replace").strip().splitlines()
                try:
                    res = json.loads(lines[-1]) if lines else {}
                except ValueError:
                    res = {}
                if not res:
                    tail = err.decode(errors="replace").strip()[-2000:]
                    res = {
                        "ok": False,
                        "error": f"exited with status {p.returncode} without a result" + (f":\n{tail}" if tail else ""),
                    }
                res["process"] = f"process {i} ({hosts[i]}" + (f", rank {res['rank']})" if "rank" in res else ")")
                return res

            tasks = [asyncio.ensure_future(finish(i, p)) for i, p in enumerate(procs)]
            try:
                deadline = time.monotonic() + timeout + 10
                pending: set[asyncio.Future[dict[str, Any]]] = set(tasks)
                failed = False
                while pending:
                    done, pending = await asyncio.wait(
                        pending, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
                    )
                    if not done:
                        break
                    if not failed and any(not t.result().get("ok") for t in done):
                        # the others will fail soon (told by netcoll) or hang: give them a moment,
                        # so the report shows every rank's view, the root cause included
                        failed, deadline = True, min(deadline, time.monotonic() + 2.0)
                finished = [t.result() for t in tasks if t.done()]
                errors = [f"  {r['process']}: {r.get('error')}" for r in finished if not r.get("ok")]
                errors += [
                    f"  process {i} ({hosts[i]}): no result (still running; killed)"
                    for i, t in enumerate(tasks)
                    if not t.done()
                ]
                if errors:
                    what = "failed" if failed else f"did not finish within {timeout + 10:g}s"
                    raise ClusterError(f"the cluster {what}:\n" + "\n".join(errors))
                return finished
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for p in procs:  # every way out: success, failure, timeout, Ctrl-C
            if p.returncode is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 5)
            except (TimeoutError, asyncio.CancelledError):
                pass


def summarize(results: list[dict[str, Any]], elapsed: float) -> bool:
    n = len(results)
    by_rank = sorted(results, key=lambda r: r["rank"])
    ok = True
    names = [c["name"] for c in by_rank[0]["results"]]
    width = max(len(s) for s in names) + 2
    print(f"\n{'collective':<{width}}result  time (slowest of {n} ranks)")
    for k, name in enumerate(names):
        rows = [r["results"][k] for r in by_rank]
        good = all(row["ok"] for row in rows)
        bad = [r["rank"] for r, row in zip(by_rank, rows, strict=True) if not row["ok"]]
        ok &= good
        print(
            f"{name:<{width}}{'OK' if good else 'FAIL':<8}{max(row['ms'] for row in rows):8.2f} ms"
            + (f"   wrong result on ranks {bad}" if bad else "")
        )
    same = len({r["digest"] for r in by_rank}) == 1
    ok &= same
    print(
        f"{'all_reduce bit-identical':<{width}}{'OK' if same else 'FAIL':<8}"
        f"{'' if same else '   ranks disagree on the bits of the result'}"
    )
    print()
    for k, b in enumerate(by_rank[0]["bench"]):
        ms = max(r["bench"][k]["ms"] for r in by_rank)
        good = all(r["bench"][k]["ok"] for r in by_rank)
        ok &= good
        nbytes = b["mib"] * 2**20
        algbw = nbytes / (ms / 1e3) / 1e9
        busbw = algbw * 2 * (n - 1) / n
        print(
            f"all_reduce {b['mib']:>2} MiB float32: {ms:8.2f} ms   algbw {algbw:6.2f} GB/s   "
            f"busbw {busbw:6.2f} GB/s   {'OK' if good else 'FAIL'}"
        )
    print(f"\n{'all checks passed' if ok else 'SOME CHECKS FAILED'}: {n} ranks, {elapsed:.1f} s")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ranks", type=int, default=4, help="number of rank processes (default 4)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds for rendezvous and each collective")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", help=argparse.SUPPRESS)
    ap.add_argument("--host", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)
    if not 1 <= args.ranks <= MAX_RANKS:
        ap.error(f"--ranks must be between 1 and {MAX_RANKS}")
    if not args.timeout > 0:
        ap.error("--timeout must be positive")
    t0 = time.monotonic()
    try:
        results = asyncio.run(run_cluster(args.ranks, args.timeout))
    except KeyboardInterrupt:
        print("\ninterrupted; rank processes stopped", file=sys.stderr)
        return 130
    except ClusterError as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        return 1
    return 0 if summarize(results, time.monotonic() - t0) else 1


if __name__ == "__main__":
    sys.exit(main())
