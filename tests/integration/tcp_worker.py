"""One rank as its own OS process, for the TCP tests (tests/integration/test_tcp_processes.py).

    python tests/integration/tcp_worker.py ADDRESS WORLD_SIZE SCENARIO INDEX

Joins at ADDRESS from source address 127.0.0.(INDEX+2) (standing in for a
separate host), runs SCENARIO, and prints one JSON line: {"ok": true, ...} or
{"ok": false, "error": type, "message": text, "ranks": [...]}. Exit code 0
either way (a crash is a test failure in the parent).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time

import numpy as np

import netcoll
from netcoll.ops import BFLOAT16, reduce_reference


def data(rank: int, count: int, dtype: object) -> np.ndarray:
    rng = np.random.default_rng(rank)
    return rng.integers(-8, 9, size=count).astype(dtype)


async def grid(comm: netcoll.Communicator) -> dict[str, object]:
    n, r = comm.world_size, comm.rank
    checked = 0
    for count in (0, 1, 7, 1000, 2**20 + 3):
        for dtype in (np.float32, np.int64, BFLOAT16) if count < 2**20 else (np.float32,):
            xs = [data(k, count, dtype) for k in range(n)]
            for algorithm in ("auto", "ring", "tree"):
                y = await comm.all_reduce(xs[r], algorithm=algorithm)
                assert np.array_equal(y, reduce_reference("sum", xs)), ("all_reduce", count, dtype, algorithm)
                checked += 1
            ymax = await comm.all_reduce(xs[r], op="max")
            assert np.array_equal(ymax, reduce_reference("max", xs))
            b = await comm.broadcast(xs[1 % n] if r == 1 % n else None, root=1 % n)
            assert np.array_equal(b, xs[1 % n]) and b.dtype == xs[0].dtype
            red = await comm.reduce(xs[r], root=n - 1)
            assert (red is None) == (r != n - 1)
            if red is not None:
                assert np.array_equal(red, reduce_reference("sum", xs))
            ag = await comm.all_gather(xs[r])
            assert np.array_equal(ag, np.stack(xs))
            g = await comm.gather(xs[r], root=0)
            assert (g is None) == (r != 0) and (g is None or np.array_equal(g, np.stack(xs)))
            full = np.stack([data(k + 10, count, dtype) for k in range(n)])
            s = await comm.scatter(full if r == 0 else None, root=0)
            assert np.array_equal(s, full[r])
            mats = [np.stack([data(k * n + j, count, dtype) for j in range(n)]) for k in range(n)]
            rs = await comm.reduce_scatter(mats[r])
            assert np.array_equal(rs, reduce_reference("sum", mats)[r])
            a2a = await comm.all_to_all(mats[r])
            assert np.array_equal(a2a, np.stack([mats[j][r] for j in range(n)]))
            checked += 8
    await comm.barrier()
    if n > 1:
        await comm.send(np.arange(r * 10, r * 10 + 5), (r + 1) % n, tag=3)
        got = await comm.recv((r - 1) % n, tag=3)
        assert list(got) == list(range(((r - 1) % n) * 10, ((r - 1) % n) * 10 + 5))
    return {"checked": checked}


async def die(comm: netcoll.Communicator) -> dict[str, object]:
    """The last rank dies in the middle of a large all_reduce; others must fail fast."""
    x = np.ones(8 * 2**20, np.float32)
    await comm.all_reduce(x[:10])
    if comm.rank == comm.world_size - 1:
        asyncio.get_running_loop().call_later(0.05, os._exit, 3)
    t0 = time.monotonic()
    for _ in range(1000):
        await comm.all_reduce(x, timeout=3600)  # far beyond the test's limit: only the lost peer may end it
    return {"elapsed": time.monotonic() - t0}


async def timeout(comm: netcoll.Communicator) -> dict[str, object]:
    """The last rank never calls; the others time out naming it. The last rank
    stays in the group until the test says the others are done (a line on
    stdin, see ``run_ranks(release_last=True)``)."""
    if comm.rank != comm.world_size - 1:
        await comm.all_reduce(np.ones(10), timeout=1.0)
    else:
        await asyncio.to_thread(sys.stdin.readline)
    return {}


async def mismatch(comm: netcoll.Communicator) -> dict[str, object]:
    shape = 10 if comm.rank != 1 else 11
    await comm.all_reduce(np.ones(shape), timeout=20)
    return {}


#: the rates the "weighted" scenario's calibration is told (by rank): rank 2 (of 3 or more) 4x slower
TOLD_RATES = (1e9, 1e9, 0.25e9, 1e9, 1e9)


def tell_rates() -> None:
    """The "weighted" scenario: the cost model on, its calibration told a machine
    (tests/support/calibration.py) whose rank 2 is 4x slower, whatever this one is."""
    import pytest

    from tests.support.calibration import tell_calibration

    os.environ["NETCOLL_COST_MODEL"] = "1"
    tell_calibration(pytest.MonkeyPatch(), rates=TOLD_RATES)


async def weighted(comm: netcoll.Communicator) -> dict[str, object]:
    """An 8 MiB auto all_reduce (the weighted one, for the told rates) and a forced one."""
    n, r = comm.world_size, comm.rank
    xs = [data(k, 2**21 + 3, np.float32) for k in range(n)]
    want = reduce_reference("sum", xs)
    y = await comm.all_reduce(xs[r])
    chose = comm.model_stats["choices"]["all_reduce"]["algorithm"]
    z = await comm.all_reduce(xs[r] * 2, algorithm="weighted")
    assert np.array_equal(y, want) and np.array_equal(z, 2 * want)
    params = comm._engine.tuner.current()
    return {
        "algorithm": chose,
        "rates": list(params.rates) if params else [],
        "bits": hashlib.sha256(y.tobytes() + z.tobytes()).hexdigest(),
    }


SCENARIOS = {"grid": grid, "die": die, "timeout": timeout, "mismatch": mismatch, "weighted": weighted}


async def main() -> None:
    address, world_size, scenario, index = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    token = os.environ.get("NETCOLL_TEST_TOKEN")
    result: dict[str, object]
    if scenario == "weighted":
        tell_rates()
    try:
        async with netcoll.connect(
            address, world_size=world_size, local_host=f"127.0.0.{index + 2}", token=token, timeout=30
        ) as comm:
            result = {"ok": True, "rank": comm.rank, **(await SCENARIOS[scenario](comm))}
    except netcoll.NetcollError as exc:
        result = {
            "ok": False,
            "error": type(exc).__name__,
            "message": str(exc),
            "ranks": list(getattr(exc, "ranks", ())),
        }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
