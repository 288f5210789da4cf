"""A coordinator and N ``netcoll.connect`` ranks in ONE event loop over real
loopback TCP (each rank from its own 127.0.0.x address): the collective set,
several groups at one coordinator, concurrent collectives, sub-groups, bad
clients on a rank's peer port, deadlines and cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import netcoll
from netcoll import CollectiveAborted, CollectiveTimeout, Communicator, PeerLost
from netcoll.mesh import auth, tcpmesh
from netcoll.ops import BFLOAT16, reduce_reference
from netcoll.wire import FrameDecoder, Kind, encode_header
from tests.support import REPO

pytestmark = pytest.mark.tcp


@contextlib.asynccontextmanager
async def world(
    n: int, *, coord: netcoll.Coordinator | None = None, group: str = "default", first_host: int = 2, **kw: Any
) -> AsyncIterator[list[Communicator]]:
    """``n`` connected ranks (sorted by rank) at ``coord`` (or a fresh coordinator)."""
    async with contextlib.AsyncExitStack() as stack:
        if coord is None:
            coord = await stack.enter_async_context(netcoll.Coordinator(token=kw.get("token")))

        async def one(i: int) -> Communicator:
            return await stack.enter_async_context(
                netcoll.connect(
                    coord.address, world_size=n, group=group, local_host=f"127.0.0.{first_host + i}", timeout=15, **kw
                )
            )

        async with asyncio.timeout(20):
            comms = await asyncio.gather(*(one(i) for i in range(n)))
        yield sorted(comms, key=lambda c: c.rank)


async def each(
    comms: list[Communicator],
    fn: Callable[[Communicator], Awaitable[Any]],
    *,
    limit: float = 30.0,
    settled: bool = False,
) -> list[Any]:
    async with asyncio.timeout(limit):
        return list(await asyncio.gather(*(fn(c) for c in comms), return_exceptions=settled))


def data(seed: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.asarray(np.random.default_rng(seed).integers(-8, 9, size=shape).astype(dtype))


async def collective_set(c: Communicator) -> int:
    """Every collective once per dtype, small sizes, checked against numpy."""
    n, r = c.world_size, c.rank
    checks = 0
    for dtype in (np.float32, np.int64, BFLOAT16):
        for count in (0, 5, 3000):
            xs = [data(k, (count,), dtype) for k in range(n)]
            for algorithm in ("auto", "ring", "tree", "doubling"):
                y = await c.all_reduce(xs[r], algorithm=algorithm)
                assert np.array_equal(y, reduce_reference("sum", xs)), (algorithm, dtype, count)
            assert np.array_equal(await c.all_reduce(xs[r], op="max"), reduce_reference("max", xs))
            root = n - 1
            b = await c.broadcast(xs[root] if r == root else None, root=root)
            assert b.dtype == xs[0].dtype and np.array_equal(b, xs[root])
            red = await c.reduce(xs[r], root=root)
            assert (red is None) == (r != root) and (red is None or np.array_equal(red, reduce_reference("sum", xs)))
            assert np.array_equal(await c.all_gather(xs[r]), np.stack(xs))
            g = await c.gather(xs[r], root=0)
            assert (g is None) == (r != 0) and (g is None or np.array_equal(g, np.stack(xs)))
            full = np.stack([data(50 + k, (count,), dtype) for k in range(n)])
            assert np.array_equal(await c.scatter(full if r == 0 else None), full[r])
            mats = [np.stack([data(k * n + j, (count,), dtype) for j in range(n)]) for k in range(n)]
            assert np.array_equal(await c.reduce_scatter(mats[r]), reduce_reference("sum", mats)[r])
            assert np.array_equal(await c.all_to_all(mats[r]), np.stack([mats[j][r] for j in range(n)]))
            checks += 13
    # uneven ("v") variants
    lists = [[data(i * n + j, (i + j, 2), np.float64) for j in range(n)] for i in range(n)]
    got = await c.all_to_all(lists[r])
    assert all(np.array_equal(got[j], lists[j][r]) for j in range(n))
    mine = data(r, (r + 1,), np.int32)
    every = [data(k, (k + 1,), np.int32) for k in range(n)]
    assert all(np.array_equal(a, b) for a, b in zip(await c.all_gather(mine, uneven=True), every, strict=True))
    g = await c.gather(mine, root=n - 1, uneven=True)
    assert (g is None) == (r != n - 1)
    assert g is None or all(np.array_equal(a, b) for a, b in zip(g, every, strict=True))
    s = await c.scatter([data(k, (k, 3), np.float32) for k in range(n)] if r == 0 else None)
    assert np.array_equal(s, data(r, (r, 3), np.float32))
    rs = await c.reduce_scatter([data(r * 10 + j, (j + 2,), np.int64) for j in range(n)])
    assert np.array_equal(rs, sum(data(i * 10 + r, (r + 2,), np.int64) for i in range(n)))
    await c.barrier()
    if n > 1:
        await c.send(np.arange(r, r + 4), (r + 1) % n, tag=5)
        assert list(await c.recv((r - 1) % n, tag=5)) == list(range((r - 1) % n, (r - 1) % n + 4))
    return checks + 6


@pytest.mark.parametrize("n", [1, 2, 5])
async def test_collective_set_over_tcp(n: int) -> None:
    async with world(n, segment_bytes=4096) as comms:
        assert [c.rank for c in comms] == list(range(n))
        res = await each(comms, collective_set, limit=60)
        assert all(r == res[0] > 0 for r in res)


async def test_several_groups_at_one_coordinator() -> None:
    async with netcoll.Coordinator() as coord:

        async def group_run(name: str, n: int, first: int) -> list[Any]:
            async with world(n, coord=coord, group=name, first_host=first) as comms:
                return await each(comms, lambda c: c.all_reduce(np.full(100, c.rank + 1, np.int64)))

        a, b = await asyncio.gather(group_run("a", 2, 2), group_run("b", 3, 10))
    assert all((y == 3).all() for y in a) and len(a) == 2
    assert all((y == 6).all() for y in b) and len(b) == 3


async def test_concurrent_collectives_on_one_group() -> None:
    async with world(4, segment_bytes=8192) as comms:

        async def body(c: Communicator) -> list[Any]:
            xs = [np.full(5000 * (i + 1), c.rank + i, np.float64) for i in range(5)]
            return await asyncio.gather(
                *(c.all_reduce(x) for x in xs),
                c.all_gather(np.array([c.rank] * 3)),
                c.all_reduce(np.ones(300_000, np.float32), algorithm="ring"),
            )

        res = await each(comms, body)
    for r in res:
        for i in range(5):
            assert r[i].shape == (5000 * (i + 1),) and (r[i] == sum(k + i for k in range(4))).all()
        assert (r[5][:, 0] == [0, 1, 2, 3]).all()
        assert (r[6] == 4).all()


async def test_split_over_tcp() -> None:
    async with world(5) as comms:

        async def body(c: Communicator) -> tuple[int, int, int, int]:
            sub = await c.split(c.rank % 2, key=c.rank)
            assert sub is not None
            y = await sub.all_reduce(np.array([c.rank], np.int64))
            g = await sub.all_gather(np.array([c.rank]))
            back = await c.all_reduce(np.array([1]))  # the parent still works alongside
            return sub.rank, sub.world_size, int(y[0]), int(back[0]) + 0 * int(g.sum())

        res = await each(comms, body)
    assert res == [(0, 3, 6, 5), (0, 2, 4, 5), (1, 3, 6, 5), (1, 2, 4, 5), (2, 3, 6, 5)]


# -- bad clients on a rank's peer port ---------------------------------------------------------


async def raw_client(
    address: tuple[str, int], script: Callable[[dict[str, Any]], list[bytes]], *, limit: float
) -> list[tuple[Kind, dict[str, Any]]]:
    """Connect, read the CHALLENGE, send ``script(challenge_header)``, and return
    every frame received until the server closes the connection."""
    reader, writer = await asyncio.open_connection(*address)
    decoder = FrameDecoder()
    frames: list[tuple[Kind, dict[str, Any]]] = []
    try:
        async with asyncio.timeout(limit):
            while not frames:
                chunk = await reader.read(65536)
                assert chunk, "closed before the CHALLENGE"
                frames += [(f.kind, f.header) for f in decoder.feed(chunk)]
            assert frames[0][0] == Kind.CHALLENGE
            for piece in script(frames[0][1]):
                writer.write(piece)
            await writer.drain()
            while chunk := await reader.read(65536):  # until EOF: the server must close
                frames += [(f.kind, f.header) for f in decoder.feed(chunk)]
    finally:
        writer.close()
    return frames


def hello(challenge: dict[str, Any], *, token: str | None, session: str, rank: int) -> list[bytes]:
    mine = auth.new_nonce()
    header: dict[str, Any] = {"role": "peer", "nonce": mine, "session": session, "rank": rank, "size": 3}
    if token is not None:
        header["proof"] = auth.proof(token, "hello", challenge["nonce"], mine)
    return [encode_header(Kind.HELLO, header)]


def error_frame(frames: list[tuple[Kind, dict[str, Any]]]) -> dict[str, Any]:
    kinds = [k for k, _ in frames]
    assert Kind.ERROR in kinds and Kind.WELCOME not in kinds, frames
    return frames[kinds.index(Kind.ERROR)][1]


async def test_bad_clients_on_the_peer_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcpmesh, "SESSION_WAIT", 1.0)
    token = "s3cret"
    async with world(3, token=token) as comms:
        target = comms[1]
        address = target.transport.listener.address
        session = target.transport.session  # type: ignore[attr-defined]

        garbage = raw_client(address, lambda ch: [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 4], limit=5)
        wrong = raw_client(address, lambda ch: hello(ch, token="wrong", session=session, rank=2), limit=5)
        no_proof = raw_client(address, lambda ch: hello(ch, token=None, session=session, rank=2), limit=5)
        bad_rank = raw_client(address, lambda ch: hello(ch, token=token, session=session, rank=0), limit=5)
        dup = raw_client(address, lambda ch: hello(ch, token=token, session=session, rank=2), limit=5)
        # an authenticated HELLO for a session this rank does not run: refused once the
        # listener has waited (SESSION_WAIT) for that session to be registered
        unknown = raw_client(address, lambda ch: hello(ch, token=token, session="no-such-session", rank=2), limit=6)
        bad = asyncio.gather(garbage, wrong, no_proof, bad_rank, dup, unknown)

        async def keep_working(c: Communicator) -> int:  # the ranks keep running collectives meanwhile
            done = 0
            while True:
                y = await c.all_reduce(np.full(1000, c.rank, np.float32), timeout=10)
                assert (y == 3).all()
                done += 1
                # stop together: a rank that saw the clients finish alone would leave the
                # others waiting in a collective it never joins
                stop = await c.all_reduce(np.array([bad.done()], np.int32), op="max", timeout=10)
                if stop[0]:
                    return done
                await asyncio.sleep(0.05)

        counts = await each(comms, keep_working, limit=20)
        f_garbage, f_wrong, f_no_proof, f_bad_rank, f_dup, f_unknown = await bad
        assert min(counts) > 0
        assert error_frame(f_garbage)["type"] == "ProtocolError"
        assert error_frame(f_wrong)["type"] == "AuthenticationError"
        assert "wrong token" in error_frame(f_wrong)["message"]
        assert error_frame(f_no_proof)["type"] == "AuthenticationError"
        assert error_frame(f_bad_rank)["type"] == "RendezvousError"
        assert "already linked" in error_frame(f_dup)["message"]
        assert error_frame(f_unknown)["type"] == "RendezvousError"
        assert "no-such-session" in error_frame(f_unknown)["message"]
        # and after all that, every rank still works, links intact
        res = await each(comms, lambda c: c.all_gather(np.array([c.rank])))
        assert all((r.ravel() == [0, 1, 2]).all() for r in res)


async def test_unauthenticated_client_cannot_send_big_frames() -> None:
    """Before the handshake only small header-only frames are accepted: a
    HELLO-sized prefix announcing a 1 GiB payload is refused, not allocated."""
    async with world(2) as comms:
        address = comms[0].transport.listener.address

        def big(ch: dict[str, Any]) -> list[bytes]:
            head = encode_header(
                Kind.HELLO, {"role": "peer", "nonce": b"x" * 16, "session": "s", "rank": 1}, payload_len=1 << 30
            )
            return [head]

        frames = await raw_client(address, big, limit=5)
        assert error_frame(frames)["type"] == "ProtocolError"
        res = await each(comms, lambda c: c.all_reduce(np.ones(3)))
        assert all((r == 2).all() for r in res)


# -- deadlines and cancellation ---------------------------------------------------------------


async def test_deadline_names_the_rank_that_never_called() -> None:
    async with world(3) as comms:
        gave_up: list[int] = []
        others_gave_up = asyncio.Event()

        async def body(c: Communicator) -> Any:
            if c.rank == 2:  # calls nothing until both others have given up on it
                await others_gave_up.wait()
                return "late"
            try:
                await c.all_reduce(np.ones(10), timeout=0.5)
            except (CollectiveTimeout, CollectiveAborted) as exc:
                return exc
            finally:
                gave_up.append(c.rank)
                if len(gave_up) == 2:
                    others_gave_up.set()
            return "no error"

        res = await each(comms, body)
        assert res[2] == "late"
        for exc in res[:2]:
            assert isinstance(exc, (CollectiveTimeout, CollectiveAborted)), exc
            assert "rank 2" in str(exc), exc
        assert any(isinstance(exc, CollectiveTimeout) and exc.ranks == (2,) for exc in res[:2]), res
        # the late rank's call fails because it was told, not by a deadline of its own (an hour away)
        with pytest.raises(CollectiveAborted) as info:
            await asyncio.wait_for(comms[2].all_reduce(np.ones(10), timeout=3600), 30)
        assert "timeout" in str(info.value) and ("rank 0" in str(info.value) or "rank 1" in str(info.value))
        res = await each(comms, lambda c: c.all_reduce(np.ones(10)))
        assert all((r == 3).all() for r in res)


async def test_cancelled_collective_aborts_everywhere_and_group_recovers() -> None:
    async with world(3) as comms:
        x = np.ones(200_000, np.float32)
        # deadlines an hour away: whatever ends these collectives during the test is the cancel
        task0 = asyncio.ensure_future(comms[0].all_reduce(x, timeout=3600))
        task1 = asyncio.ensure_future(comms[1].all_reduce(x, timeout=3600))
        await asyncio.sleep(0.2)  # both are running, waiting for rank 2 (which never calls)
        assert not task0.done() and not task1.done()
        task0.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task0
        with pytest.raises((CollectiveAborted, PeerLost)) as info:
            await asyncio.wait_for(task1, 30)
        assert "cancel" in str(info.value) and "rank 0" in str(info.value)
        # rank 2 reaches the cancelled collective late: it is told (its own deadline is an hour away)
        with pytest.raises(CollectiveAborted) as info:
            await asyncio.wait_for(comms[2].all_reduce(x, timeout=3600), 30)
        assert "cancel" in str(info.value) and "rank 0" in str(info.value)
        # the communicator still works for the next collectives on every rank
        res = await each(comms, lambda c: c.all_reduce(x))
        assert all((r == 3).all() for r in res)
        res = await each(comms, lambda c: c.broadcast(np.arange(5) if c.rank == 1 else None, root=1))
        assert all((r == np.arange(5)).all() for r in res)


async def test_cancel_mid_transfer_then_recover() -> None:
    """Cancel one rank while a large ring all_reduce is streaming on every rank."""
    async with world(3, segment_bytes=64 * 1024) as comms:
        x = np.ones(4 * 2**20, np.float32)  # 16 MiB
        tasks = [asyncio.ensure_future(c.all_reduce(x, algorithm="ring", timeout=30)) for c in comms]
        await asyncio.sleep(0.02)
        tasks[1].cancel()
        res = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        assert isinstance(res[1], asyncio.CancelledError)
        for r in (res[0], res[2]):  # either it finished before the cancel, or it was aborted
            assert isinstance(r, (CollectiveAborted, np.ndarray)), r
        res = await each(comms, lambda c: c.all_reduce(np.full(1000, 2.0)))
        assert all((r == 6).all() for r in res)


@pytest.mark.slow
async def test_broadcast_256_mib_over_tcp() -> None:
    async with world(3) as comms:
        x = np.arange(64 * 2**20, dtype=np.uint32)  # 256 MiB
        # within the collective's own deadline (a CollectiveTimeout otherwise), as it was meant to be used
        res = await each(comms, lambda c: c.broadcast(x if c.rank == 0 else None, root=0, timeout=60), limit=120)
        for r in res[1:]:
            assert r.dtype == x.dtype and r.shape == x.shape and np.array_equal(r, x)


# -- the examples (the README's first command runs examples/local_cluster.py) ------------------

EXAMPLES = str(REPO / "examples")


async def run_example(*args: str, limit: float = 60) -> tuple[int, str, str]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(EXAMPLES), os.environ.get("PYTHONPATH")]))
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        async with asyncio.timeout(limit):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode, out.decode(), err.decode()  # type: ignore[return-value]


async def test_local_cluster_example() -> None:
    rc, out, err = await run_example(os.path.join(EXAMPLES, "local_cluster.py"), "--ranks", "3")
    assert rc == 0, out + err
    assert "all checks passed: 3 ranks" in out, out
    for name in (
        "all_reduce sum float32",
        "broadcast",
        "reduce_scatter",
        "all_to_all (uneven list)",
        "send / recv",
        "barrier",
        "all_reduce bit-identical",
    ):
        assert any(line.startswith(name) and " OK " in line + " " for line in out.splitlines()), (name, out)
    assert "all_reduce 16 MiB" in out


async def test_embedded_example() -> None:
    rc, out, err = await run_example(os.path.join(EXAMPLES, "embedded.py"))
    assert rc == 0, out + err
    assert out.strip() == "[1.5 1.5 1.5]", out


async def test_send_on_a_link_the_peer_is_closing_is_peer_lost() -> None:
    """Between the peer's EOF (our side starts closing) and the link's loss
    being reported, a send must fail as PeerLost, not as some other error."""
    async with world(2) as comms:
        t0 = comms[0].transport
        assert isinstance(t0, tcpmesh.TcpMesh)
        link = t0.links[1]
        link.transport.close()  # what an EOF from the peer does here
        header = {"g": "x", "q": 0, "f": "f", "s": 0, "c": 0}
        for payload in (memoryview(b"tiny"), memoryview(bytearray(1 << 20))):  # the write and writev paths
            with pytest.raises(PeerLost) as info:
                await t0.send(1, Kind.DATA, header, payload)
            assert info.value.ranks == (1,)
        # the same race one level down: the link object itself raises a ConnectionError
        with pytest.raises(ConnectionError):
            await link.send(Kind.DATA, header, memoryview(bytearray(1 << 20)))
