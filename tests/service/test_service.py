"""The rank service in one event loop over real loopback TCP: a Coordinator
with the JobService, RankDaemons, and the Client. (With real processes and the
CLI: test_cli.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import netcoll
from netcoll.links import shm
from netcoll.ops import reduce_reference
from netcoll.service import Client, JobService
from netcoll.service.jobs import COLLECTIVES, JobSpec, generate_input, parse_size, verify
from tests.support.services import Cluster, service

pytestmark = pytest.mark.tcp


@contextlib.asynccontextmanager
async def cluster(n: int, **kw: Any) -> AsyncIterator[tuple[Cluster, Client]]:
    """``n`` rank daemons and a client at a fresh coordinator (``kw``: its options)."""
    async with service(n, coordinator=kw) as running:
        yield running


async def test_every_collective_generated_and_verified() -> None:
    async with cluster(3) as (_, client):
        for op in COLLECTIVES:
            for dtype in ("float32", "int64", "bfloat16"):
                rec = await client.run(op, size="64KiB", dtype=dtype, iters=2, warmup=1, root=2 % 3)
                assert rec["state"] == "succeeded", rec
                assert rec["world_size"] == 3 and len(rec["timings"]) == 3
                # the kind of link each rank used to each other rank shows in the job's stats
                # (shared memory: the daemons are on one host; tcp where it has no /dev/shm)
                kind = "shm" if shm.possible() else "tcp"
                assert rec["links"] == {str(r): {str(p): kind for p in range(3) if p != r} for r in range(3)}
                assert rec["verified"] is (None if op == "barrier" else True)
                if op != "barrier":
                    assert rec["busbw"] > 0 and rec["time_s"] > 0


async def test_inline_arrays_every_collective() -> None:
    n = 3
    xs = [np.arange(6, dtype=np.float64).reshape(2, 3) * (r + 1) for r in range(n)]
    mats = [np.arange(n * 4, dtype=np.int32).reshape(n, 4) + 10 * r for r in range(n)]
    async with cluster(n) as (_, client):
        rec = await client.run("all_reduce", inputs=xs, reduce_op="max")
        np.testing.assert_array_equal(rec["result"], reduce_reference("max", xs))
        rec = await client.run("broadcast", inputs=xs[0], root=1)
        np.testing.assert_array_equal(rec["result"], xs[0])
        rec = await client.run("reduce", inputs=xs, root=2)
        np.testing.assert_array_equal(rec["result"], sum(xs))
        rec = await client.run("all_gather", inputs=xs)
        np.testing.assert_array_equal(rec["result"], np.stack(xs))
        rec = await client.run("gather", inputs=xs, root=1)
        np.testing.assert_array_equal(rec["result"], np.stack(xs))
        rec = await client.run("scatter", inputs=mats[0], root=0)
        for r in range(n):
            np.testing.assert_array_equal(rec["result"][r], mats[0][r])
        rec = await client.run("reduce_scatter", inputs=mats)
        for r in range(n):
            np.testing.assert_array_equal(rec["result"][r], sum(mats)[r])
        rec = await client.run("all_to_all", inputs=mats)
        for r in range(n):
            np.testing.assert_array_equal(rec["result"][r], np.stack([mats[j][r] for j in range(n)]))


async def test_named_buffers() -> None:
    async with cluster(2) as (_, client):
        await client.put("w", [np.full(4, 1.5), np.full(4, 2.5)])
        got = await client.get("w")
        assert [g.tolist() for g in got] == [[1.5] * 4, [2.5] * 4]
        rec = await client.run("all_reduce", data="buffer", input="w", output="sum")
        assert rec["state"] == "succeeded" and rec["result"].tolist() == [4.0] * 4
        assert [g.tolist() for g in await client.get("sum")] == [[4.0] * 4] * 2
        await client.delete("w")
        rec = await client.run("all_reduce", data="buffer", input="w")
        assert rec["state"] == "failed" and "no buffer 'w'" in rec["error"]
        with pytest.raises(KeyError):
            await client.get("w")


async def test_killed_daemon_fails_job_then_new_epoch_then_join() -> None:
    async with cluster(4) as (c, client):
        first = await client.run("all_reduce", size="1KiB")
        jid = await client.submit("all_reduce", size="32MiB", iters=200)
        async with asyncio.timeout(20):
            while (await client.job(jid))["state"] != "running":
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        victim = c.daemons[1].member_id
        async with asyncio.timeout(30):  # every step bounded, so a stuck one names itself
            await c.kill(1)
        rec = await client.wait(jid, timeout=30)
        assert rec["state"] == "failed"
        assert victim in rec["error"] and "was lost" in rec["error"], rec["error"]
        nxt = await client.run("all_reduce", size="1MiB", timeout=30)
        assert nxt["state"] == "succeeded" and nxt["world_size"] == 3 and nxt["epoch"] > first["epoch"]
        assert victim not in [r["member_id"] for r in nxt["ranks"]]
        c.add(1)
        await c.ready(client, 4)
        again = await client.run("all_gather", size="4KiB", timeout=30)
        assert again["state"] == "succeeded" and again["world_size"] == 4 and again["verified"]


async def test_world_size_wait_and_deadline() -> None:
    async with cluster(2) as (c, client):
        rec = await client.run("all_reduce", size="1KiB", world_size=3, deadline=0.5)
        assert rec["state"] == "failed" and "waited" in rec["error"] and "ready:" in rec["error"]
        jid = await client.submit("all_reduce", size="1KiB", world_size=3, deadline=20)
        await asyncio.sleep(0.2)
        c.add(1)
        rec = await client.wait(jid, timeout=30)
        assert rec["state"] == "succeeded" and rec["world_size"] == 3
        two = await client.run("broadcast", size="1KiB", world_size=2)
        assert two["state"] == "succeeded" and two["world_size"] == 2


async def test_cancel_queued_and_running() -> None:
    async with cluster(2) as (_, client):
        long = await client.submit("all_reduce", size="16MiB", iters=100_000)
        queued = await client.submit("barrier")
        rec = await client.cancel(queued)
        assert rec["state"] == "cancelled"
        async with asyncio.timeout(20):
            while (await client.job(long))["state"] != "running":
                await asyncio.sleep(0.02)
        await client.cancel(long)
        rec = await client.wait(long, timeout=30)
        assert rec["state"] == "cancelled", rec
        after = await client.run("all_reduce", size="1KiB")
        assert after["state"] == "succeeded"


async def test_progress_stream() -> None:
    async with cluster(2) as (_, client):
        jid = await client.submit("all_reduce", size="4MiB", iters=30)
        events = [e async for e in client.progress(jid)]
        assert events[-1]["topic"] == "done" and events[-1]["state"] == "succeeded"
        assert any(e["topic"] == "progress" for e in events) or events[-1]["progress"]["iteration"] == 30


async def test_rank_hints_are_honoured() -> None:
    async with netcoll.Coordinator() as coord:
        svc = JobService(coord)
        svc.start()
        c = Cluster(coord, svc)
        for hint in (2, 0, 1):
            c.add(1, rank_hint=hint)
        try:
            async with Client(coord.address) as client:
                await c.ready(client, 3)
                rec = await client.run("barrier")
                by_rank = {r["member_id"]: r["rank"] for r in rec["ranks"]}
                assert [by_rank[d.member_id] for d in c.daemons] == [2, 0, 1]
        finally:
            for d in c.daemons:
                d.request_stop()
            await asyncio.gather(*c.tasks, return_exceptions=True)
            await svc.close()


async def test_bad_requests_get_clear_errors_and_service_continues() -> None:
    async with cluster(2) as (_, client):
        rpc = client.rpc
        assert rpc is not None
        for spec, word in (
            ({"op": "all_reduceX"}, "op"),
            ({"op": "all_reduce", "dtype": "object"}, "dtype"),
            ({"op": "all_reduce", "dtype": "int32", "reduce_op": "avg"}, "avg"),
            ({"op": "all_reduce", "size": 1 << 40}, "exceeds"),
            ({"op": "all_reduce", "bogus": 1}, "bogus"),
        ):
            with pytest.raises((ValueError, TypeError)) as info:
                await rpc.call("submit", {"spec": spec})
            assert word in str(info.value), info.value
        with pytest.raises(ValueError):
            await rpc.call(
                "submit",
                {
                    "spec": {"op": "all_reduce", "data": "inline"},
                    "inputs": {"mode": "same", "arrays": [{"dtype": "<f4", "shape": [4], "nbytes": 16}]},
                },
                b"short",
            )
        with pytest.raises(KeyError):
            await client.wait(12345)
        host, port = client.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)) * 4)
        await writer.drain()
        await asyncio.wait_for(reader.read(), 5)  # the coordinator answers with an error and closes
        writer.close()
        rec = await client.run("all_reduce", size="1KiB")
        assert rec["state"] == "succeeded"


async def test_token_protects_the_job_service() -> None:
    async with cluster(2, token="t0k") as (c, client):
        rec = await client.run("all_reduce", size="1KiB")
        assert rec["state"] == "succeeded"
        with pytest.raises(netcoll.AuthenticationError):
            async with Client(c.coord.address, token="wrong"):
                pass


def test_job_spec_and_sizes() -> None:
    from netcoll import sizes

    assert parse_size is sizes.parse_size  # one size grammar: the job model's is netcoll.sizes'
    assert parse_size("64MiB") == 64 << 20 and parse_size("1G") == 1 << 30 and parse_size("4k") == 4096
    with pytest.raises(ValueError, match="not a size: 'lots'"):
        parse_size("lots")
    spec = JobSpec(op="all_reduce", size="1MiB", dtype="float16")
    assert spec.count == 1 << 19
    assert JobSpec(op="all_gather", size="1.5M").size == 3 << 19
    with pytest.raises(ValueError, match="not a size"):
        JobSpec(op="all_gather", size="1.5 parsecs")
    with pytest.raises(TypeError):
        JobSpec(op="all_reduce", dtype="int8", reduce_op="avg")


def test_job_spec_takes_its_collectives_and_algorithms_from_the_registry() -> None:
    from netcoll.collectives import NAMES, REGISTRY

    assert COLLECTIVES == NAMES
    for name, coll in REGISTRY.items():
        for algorithm in coll.algorithms:
            assert JobSpec(op=name, algorithm=algorithm).collective is coll
        with pytest.raises(ValueError, match=f"{name} has no algorithm 'nope'"):
            JobSpec(op=name, algorithm="nope")
    with pytest.raises(ValueError, match="unknown op 'allreduce'"):
        JobSpec(op="allreduce")
    assert JobSpec(op="put", output="w", data="inline").collective is None


@pytest.mark.parametrize("op", [n for n in COLLECTIVES if n != "barrier"])
def test_generated_job_data_verifies_and_catches_corruption(op: str) -> None:
    """The job service's generator and verifier are the registry's: what every rank
    would hold after a correct run verifies on every rank, a flipped element does not."""
    from netcoll.ops import reduce_reference

    n, spec = 3, JobSpec(op=op, size="12KiB", dtype="int32", reduce_op="max", root=1)
    full = [generate_input(spec.model_copy(update={"root": r}), r, n) for r in range(n)]  # every rank's data
    red = reduce_reference("max", full) if spec.collective and spec.collective.takes_op else None
    want = {
        "all_reduce": lambda r: red,
        "reduce": lambda r: red if r == 1 else None,
        "broadcast": lambda r: full[1],
        "all_gather": lambda r: np.stack(full),
        "gather": lambda r: np.stack(full) if r == 1 else None,
        "scatter": lambda r: full[1][r],
        "reduce_scatter": lambda r: red[r],
        "all_to_all": lambda r: np.stack([full[j][r] for j in range(n)]),
    }[op]
    for r in range(n):
        assert verify(spec, r, n, want(r)) == (True, 0), (op, r)
    y = want(1).copy()
    y.reshape(-1)[5] += 1
    assert verify(spec, 1, n, y) == (False, 1)


async def test_daemon_cancels_its_job_when_the_coordinator_goes() -> None:
    coord = netcoll.Coordinator()
    await coord.start()
    svc = JobService(coord)
    svc.start()
    c = Cluster(coord, svc)
    c.add(2)
    try:
        async with Client(coord.address) as client:
            await c.ready(client, 2)
            jid = await client.submit("all_reduce", size="1MiB", iters=100_000)
            async with asyncio.timeout(20):
                while (await client.job(jid))["state"] != "running":
                    await asyncio.sleep(0.02)
        await svc.close()
        await coord.close()
        async with asyncio.timeout(10):
            while any(d.current_job is not None or d.registered for d in c.daemons):
                await asyncio.sleep(0.05)
        assert all(d.jobs_failed == 1 for d in c.daemons)
    finally:
        for d in c.daemons:
            d.request_stop()
        await asyncio.wait_for(asyncio.gather(*c.tasks, return_exceptions=True), 10)


@pytest.mark.parametrize(
    "op", ["all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "reduce_scatter", "all_to_all"]
)
async def test_job_iterations_reuse_the_first_result_buffer(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's calls after the first write into the first call's result (no
    allocation per iteration) and the last result still verifies."""
    import netcoll.service.runner as runner
    from tests.support import run_world

    spec = JobSpec(op=op, size=4096, iters=3, warmup=2, root=1)
    seen: dict[int, list[int]] = {}
    real = runner.call

    async def spy(comm, s, x, out=None, timeout=None):  # type: ignore[no-untyped-def]
        y = await real(comm, s, x, out, timeout)
        seen.setdefault(comm.rank, []).append(0 if y is None else id(y))
        return y

    monkeypatch.setattr(runner, "call", spy)

    async def rank(c):  # type: ignore[no-untyped-def]
        x = generate_input(spec, c.rank, c.world_size)
        y, timings, _ = await runner.run_collective(c, spec, x)
        return verify(spec, c.rank, c.world_size, y), len(timings)

    res = await run_world(3, rank)
    assert all(ok for (ok, _), _n in res) and all(n == 3 for _, n in res), res
    for r, ids in seen.items():
        assert len(ids) == 5 and len(set(ids)) == 1, (r, ids)  # one result object for all five calls
