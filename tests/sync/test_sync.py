"""netcoll.sync: the Communicator as blocking calls (ranks on threads here;
Ctrl-C and interpreter exit in tests/sync/test_shutdown.py)."""

from __future__ import annotations

import inspect
import threading
from pathlib import Path

import numpy as np
import pytest

import netcoll
import netcoll.sync
from netcoll.comm import Communicator
from netcoll.errors import CollectiveCancelled, CommunicatorClosed, ConfigError, MismatchError
from netcoll.session import from_env
from netcoll.sync import SyncCommunicator

from .conftest import in_threads, sync_threads

pytestmark = pytest.mark.tcp

N = 3


def _data(rank: int) -> np.ndarray:
    return np.arange(6, dtype=np.float64).reshape(N, 2) * (rank + 1)


def test_every_collective_blocks_and_returns_the_result(coordinator: str) -> None:
    def rank_main(rank: int) -> dict[str, object]:
        x = _data(rank)
        with netcoll.sync.connect(coordinator, world_size=N, rank=rank) as comm:
            assert (comm.rank, comm.world_size, comm.group) == (rank, N, "default")
            out = {
                "all_reduce": comm.all_reduce(x, op="sum"),
                "broadcast": comm.broadcast(x if rank == 1 else None, root=1),
                "reduce": comm.reduce(x, op="max", root=2),
                "all_gather": comm.all_gather(x[0]),
                "gather": comm.gather(x[0], root=0),
                "scatter": comm.scatter(x if rank == 0 else None, root=0),
                "reduce_scatter": comm.reduce_scatter(x, op="sum"),
                "all_to_all": comm.all_to_all(x),
                "uneven": comm.all_to_all([np.full(rank + j, rank, np.int32) for j in range(N)]),
                "barrier": comm.barrier(),
            }
            if rank == 0:
                comm.send(x, 1, tag=3)
            elif rank == 1:
                out["recv"] = comm.recv(0, tag=3)
            out["links"] = comm.link_stats()
            return out

    got = in_threads(N, rank_main)
    xs = [_data(r) for r in range(N)]
    total = sum(xs)
    for r, out in enumerate(got):
        np.testing.assert_array_equal(out["all_reduce"], total)
        np.testing.assert_array_equal(out["broadcast"], xs[1])
        assert (out["reduce"] is None) == (r != 2)
        np.testing.assert_array_equal(out["all_gather"], np.stack([x[0] for x in xs]))
        assert (out["gather"] is None) == (r != 0)
        np.testing.assert_array_equal(out["scatter"], xs[0][r])
        np.testing.assert_array_equal(out["reduce_scatter"], total[r])
        np.testing.assert_array_equal(out["all_to_all"], np.stack([x[r] for x in xs]))
        assert [a.tolist() for a in out["uneven"]] == [[j] * (j + r) for j in range(N)]
        assert out["barrier"] is None
        assert sorted(out["links"]) == [k for k in range(N) if k != r]  # type: ignore[call-overload]
    np.testing.assert_array_equal(got[2]["reduce"], np.maximum.reduce(xs))
    np.testing.assert_array_equal(got[0]["gather"], np.stack([x[0] for x in xs]))
    np.testing.assert_array_equal(got[1]["recv"], xs[0])
    assert sync_threads() == []  # every loop thread ended with its `with` block


def test_async_op_returns_work_and_split_makes_sub_communicators(coordinator: str) -> None:
    def rank_main(rank: int) -> tuple[object, ...]:
        with netcoll.sync.connect(coordinator, world_size=N, rank=rank) as comm:
            works = [comm.all_reduce(np.array([rank, 1]), async_op=True) for _ in range(3)]
            assert all(isinstance(w, netcoll.Work) for w in works)
            results = [w.wait(30).tolist() for w in reversed(works)]
            sub = comm.split(rank % 2, key=-rank + 10)
            assert isinstance(sub, SyncCommunicator)
            sub_sum = sub.all_reduce(np.array([rank]))
            none = comm.split(None if rank == 0 else 1)
            return results, sub.rank, sub.world_size, sub_sum.tolist(), none is None

    got = in_threads(N, rank_main)
    assert [g[0] for g in got] == [[[3, 3]] * 3] * N
    assert [(g[1], g[2], g[3]) for g in got] == [(1, 2, [2]), (0, 1, [1]), (0, 2, [2])]
    assert [g[4] for g in got] == [True, False, False]


def test_threads_each_with_a_sub_communicator(coordinator: str) -> None:
    """Several threads of one rank, each on its own split: no order to agree on across threads."""

    def rank_main(rank: int) -> list[list[int]]:
        with netcoll.sync.connect(coordinator, world_size=2, rank=rank) as comm:
            subs = [comm.split(0) for _ in range(3)]
            results: list[list[int]] = [[] for _ in subs]

            def worker(i: int) -> None:
                for step in range(5):
                    results[i].append(int(subs[i].all_reduce(np.array([i * 100 + step]))[0]))  # type: ignore[union-attr]

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            return results

    expected = [[2 * (i * 100 + s) for s in range(5)] for i in range(3)]
    assert in_threads(2, rank_main) == [expected, expected]


def test_errors_are_the_async_apis_typed_errors(coordinator: str) -> None:
    def rank_main(rank: int) -> tuple[str, str]:
        with netcoll.sync.connect(coordinator, world_size=2, rank=rank, collective_timeout=30) as comm:
            with pytest.raises(ValueError, match="root"):
                comm.broadcast(np.zeros(2), root=5)  # checked before any byte is sent
            with pytest.raises(TypeError, match="async_op"):
                comm.barrier(async_op="yes")  # type: ignore[arg-type]
            with pytest.raises(MismatchError) as mismatch:
                comm.all_reduce(np.zeros(2 + rank))
            comm.barrier()  # the communicator stays usable
            if rank == 0:
                work = comm.recv(1, async_op=True)  # rank 1 sends nothing yet
                assert work.cancel()  # from this thread, not the loop's
                with pytest.raises(BaseException) as cancelled:
                    work.wait(30)
                got = type(cancelled.value).__name__
                comm.barrier()
            else:
                comm.barrier()  # rank 0 cancelled its recv before it entered the barrier
                with pytest.raises(CollectiveCancelled) as peer:
                    comm.send(np.ones(1), 0)  # the message that recv was for
                assert "cancelled on rank 0" in str(peer.value)  # its rank, not its place in the pair
                assert peer.value.ranks == (0,)
                got = "peer " + type(peer.value).__name__
            np.testing.assert_array_equal(comm.all_reduce(np.ones(1)), [2.0])
        with pytest.raises(CommunicatorClosed):
            comm.barrier()
        return type(mismatch.value).__name__, got

    assert in_threads(2, rank_main) == [
        ("MismatchError", "CancelledError"),
        ("MismatchError", "peer CollectiveCancelled"),
    ]


def test_signatures_mirror_the_communicator() -> None:
    """Every public Communicator call has a blocking twin with the same parameters plus async_op."""
    for name, method in inspect.getmembers(Communicator, inspect.isfunction):
        if name.startswith("_") or name in ("close",):
            continue
        twin = getattr(SyncCommunicator, name)
        ours = inspect.signature(twin).parameters
        theirs = inspect.signature(method).parameters
        extra = [p for p in ours if p not in theirs]
        assert [p for p in theirs if p not in ours] == [], name
        if name in ("split", "link_stats", "regroup"):  # communicators and stats: blocking only
            assert extra == [], name
        else:
            assert extra == ["async_op"], name
            assert ours["async_op"].kind is inspect.Parameter.KEYWORD_ONLY
            assert [(p.name, p.kind, p.default) for p in theirs.values()] == [
                (p.name, p.kind, p.default) for p in ours.values() if p.name != "async_op"
            ], name
            assert (method.__doc__ or "").strip().splitlines()[0] in (twin.__doc__ or ""), name


def test_connect_reads_the_environment(coordinator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETCOLL_COORDINATOR", coordinator)
    monkeypatch.setenv("NETCOLL_WORLD_SIZE", "2")
    monkeypatch.delenv("NETCOLL_RANK", raising=False)

    def rank_main(_: int) -> int:
        with netcoll.sync.connect() as comm:  # ranks assigned by the coordinator
            assert comm.medium == comm.communicator.medium in ("shm", "socket")  # agreed by connect()
            assert comm.agree_links() == comm.medium  # once agreed, the same answer at once
            return int(comm.all_reduce(np.array([comm.rank]))[0])

    assert in_threads(2, rank_main) == [1, 1]


def test_from_env_names_the_missing_variable() -> None:
    env = {"NETCOLL_COORDINATOR": "127.0.0.1:1", "NETCOLL_WORLD_SIZE": "4", "NETCOLL_RANK": "2"}
    assert from_env(None, None, None, env) == ("127.0.0.1:1", 4, 2)
    assert from_env("h:2", None, None, env) == ("h:2", 4, None)  # rank only with the address from env
    assert from_env(None, 8, 0, env) == ("127.0.0.1:1", 8, 0)
    for missing in ("NETCOLL_COORDINATOR", "NETCOLL_WORLD_SIZE"):
        with pytest.raises(ConfigError, match=missing):
            from_env(None, None, None, {k: v for k, v in env.items() if k != missing})
    for var, bad in (("NETCOLL_WORLD_SIZE", "0"), ("NETCOLL_WORLD_SIZE", "four"), ("NETCOLL_RANK", "-1")):
        with pytest.raises(ConfigError, match=var):
            from_env(None, None, None, {**env, var: bad})
    assert issubclass(ConfigError, netcoll.NetcollError) and issubclass(ConfigError, ValueError)


def test_connect_failure_leaves_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NETCOLL_COORDINATOR", raising=False)
    with pytest.raises(ConfigError, match="NETCOLL_COORDINATOR"):
        netcoll.sync.connect(world_size=2)
    with pytest.raises(netcoll.RendezvousTimeout, match=r"no coordinator at 127\.0\.0\.1:1 within 1s"):
        netcoll.sync.connect("127.0.0.1:1", world_size=2, timeout=1)  # nothing listens on port 1: tried until 1 s
    assert sync_threads() == []


def test_calls_from_the_loop_thread_are_refused(coordinator: str) -> None:
    with netcoll.sync.connect(coordinator, world_size=1) as comm:
        holder: list[BaseException] = []

        def on_loop() -> None:
            try:
                comm.barrier()
            except RuntimeError as exc:
                holder.append(exc)

        comm.loop.call_soon_threadsafe(on_loop)
        comm.barrier()  # runs after on_loop (calls are handled in order)
        assert holder and "deadlock" in str(holder[0])
        np.testing.assert_array_equal(comm.all_reduce(np.ones(3)), np.ones(3))


def test_loop_kinds(coordinator: str) -> None:
    def rank_main(rank: int) -> list[int]:
        with netcoll.sync.connect(coordinator, world_size=2, rank=rank, loop="spin") as comm:
            return comm.all_reduce(np.array([rank + 1])).tolist()  # type: ignore[no-any-return]

    assert in_threads(2, rank_main) == [[3], [3]]
    with pytest.raises(ValueError, match="unknown event loop"):
        netcoll.sync.connect(coordinator, world_size=2, loop="fast")
    assert sync_threads() == []


def test_the_error_that_ends_a_block_is_noted(
    coordinator: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NETCOLL_ERROR_FILE (set by netcoll run): the first error that ended a block, with its time."""
    import asyncio
    import json

    note = tmp_path / "rank0.json"
    monkeypatch.setenv("NETCOLL_ERROR_FILE", str(note))
    with pytest.raises(KeyError), netcoll.sync.connect(coordinator, world_size=1):
        raise KeyError("first")

    async def later() -> None:
        async with netcoll.connect(coordinator, world_size=1):
            raise ValueError("second")

    with pytest.raises(ValueError):
        asyncio.run(later())
    doc = json.loads(note.read_text())
    assert doc["error"] == "KeyError: 'first'" and doc["time"] > 0  # the first note stays
    note.unlink()
    with pytest.raises(ValueError):
        asyncio.run(later())
    assert json.loads(note.read_text())["error"] == "ValueError: second"
    with netcoll.sync.connect(coordinator, world_size=1):
        pass
    assert json.loads(note.read_text())["error"] == "ValueError: second"  # no error, no note


def test_compression_passes_through(coordinator: str) -> None:
    def rank_main(rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = np.random.default_rng(rank).standard_normal(3000)
        with netcoll.sync.connect(coordinator, world_size=N, rank=rank) as comm:
            with pytest.raises(ValueError, match="needs a float"):
                comm.all_reduce(np.ones(3, np.int32), compression="int8")
            before = sum(v["bytes_sent"] for v in comm.link_stats().values())
            got = comm.all_reduce(x, compression="int8")
            after = sum(v["bytes_sent"] for v in comm.link_stats().values())
            comm.all_reduce(x)
            plain = sum(v["bytes_sent"] for v in comm.link_stats().values()) - after
            assert after - before <= 0.30 * plain
            gathered = comm.all_gather(x, compression="fp16")
            return got, gathered, comm.broadcast(x if rank == 0 else None, compression="bf16")

    got = in_threads(N, rank_main)
    xs = np.stack([np.random.default_rng(r).standard_normal(3000) for r in range(N)])
    for out in got:
        assert np.array_equal(out[0], got[0][0]) and np.array_equal(out[1], got[0][1])
        assert np.array_equal(out[2], got[0][2])
    assert np.abs(got[0][0] - xs.sum(0)).max() <= 2 * N * np.abs(xs).max() / 254 * 1.01
