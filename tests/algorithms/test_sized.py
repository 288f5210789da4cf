"""The broadcast whose root chooses the tree or the chain (``sized``): every rank ends with the
root's bytes whichever the root chose, whatever each non-root passed, each non-root following
the root's shape (its parent in that shape, at that shape's step), and no receive is left
posted; a size mismatch still fails at once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from netcoll.algorithms import sized
from netcoll.algorithms.tree import binomial_tree
from netcoll.errors import MismatchError
from netcoll.mesh.channel import Channel
from tests.support import MakeGroup


def follow(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[int | None, int]]:
    """Record, per group rank, whom it received from and at which step (the shape it ran)."""
    followed: dict[int, tuple[int | None, int]] = {}
    real = sized.relay

    async def spy(ch: Channel, src: int | None, *args: Any, **kw: Any) -> Any:
        followed[ch.rank] = (src, kw["step"])
        return await real(ch, src, *args, **kw)

    monkeypatch.setattr(sized, "relay", spy)
    return followed


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize(("P", "count", "segment_bytes"), [(3, 10, 1 << 20), (4, 1000, 256), (5, 37, 8), (8, 0, 64)])
async def test_every_rank_gets_the_roots_bytes_by_the_roots_choice(
    make_group: MakeGroup, monkeypatch: pytest.MonkeyPatch, chain: bool, P: int, count: int, segment_bytes: int
) -> None:
    group = await make_group(P)
    followed = follow(monkeypatch)
    data = np.arange(count, dtype=np.float32) * 1.5
    for root in sorted({0, P - 1, P // 2}):
        followed.clear()

        async def body(ch: Channel, root: int = root) -> tuple[np.ndarray, dict[str, Any]]:
            if ch.rank == root:
                out = await sized.broadcast(ch, data, root, {"k": 1}, segment_bytes=segment_bytes, chain=chain)
            else:  # some non-roots pass a buffer, the others None; a non-root's `chain` is ignored
                buf = np.zeros(count, np.float32) if ch.rank % 2 else None
                out = await sized.broadcast(ch, buf, root, segment_bytes=segment_bytes, chain=not chain)
            assert ch.op.posted == {}  # the receive from the parent of the other shape was withdrawn
            return out

        for r, (got, meta) in enumerate(await group.run(body)):
            assert got.tobytes() == data.tobytes(), (chain, P, root, r)
            assert meta == {"k": 1, "nbytes": data.nbytes}
            v = (r - root) % P
            if v == 0:
                assert followed[r] == (None, 1 if chain else 0)
            elif chain:
                assert followed[r] == ((r - 1) % P, 1)
            else:
                parent = binomial_tree(P, v)[0]
                assert parent is not None and followed[r] == ((parent + root) % P, 0)


async def test_two_ranks_run_the_tree(make_group: MakeGroup) -> None:
    group = await make_group(2)
    data = np.arange(7, dtype=np.int16)

    async def body(ch: Channel) -> np.ndarray:
        got, _ = await sized.broadcast(ch, data if ch.rank == 1 else None, 1, chain=True)
        return got

    assert all(g.tobytes() == data.tobytes() for g in await group.run(body))


@pytest.mark.parametrize("chain", [False, True])
async def test_a_size_mismatch_fails_at_once(make_group: MakeGroup, chain: bool) -> None:
    group = await make_group(4)

    async def body(ch: Channel) -> Any:
        if ch.rank == 0:
            return await sized.broadcast(ch, np.zeros(10, np.uint8), 0, segment_bytes=4, chain=chain)
        if ch.rank == 3:
            with pytest.raises(MismatchError):
                await sized.broadcast(ch, np.zeros(12, np.uint8), 0, segment_bytes=4)
            return None
        return await sized.broadcast(ch, None, 0, segment_bytes=4)

    results = await group.run(body, timeout=5)
    assert results[1][0].tobytes() == bytes(10)


async def test_the_plan_lets_the_root_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    """Communicator.broadcast with ``algorithm="sized"`` over 4 ranks and no cost model: the
    root's verdict is the table's (the chain from 16 MiB, lowered here), everyone follows, and
    a non-root passing None or a buffer gets the array either way; every rank's stats name the
    shape that ran ("ring" for the chain)."""
    from netcoll.selection import table
    from tests.support import run_world

    monkeypatch.setattr(table, "BROADCAST_CHAIN_MIN_BYTES", 4096)
    followed = follow(monkeypatch)
    for n, step in ((100, 0), (5000, 1)):  # below and above the (lowered) threshold: the tree, the chain
        x = np.arange(n, dtype=np.float64)

        async def one(c: Any, x: np.ndarray = x) -> tuple[np.ndarray, str]:
            buf = x if c.rank == 2 else (np.empty_like(x) if c.rank == 1 else None)
            got = await c.broadcast(buf, root=2, algorithm="sized")
            return got, c.model_stats["choices"]["broadcast"]["algorithm"]

        for got, algo in await run_world(4, one):
            np.testing.assert_array_equal(got, x)
            assert algo == ("ring" if step else "tree")
        assert {r: st for r, (_, st) in followed.items()} == dict.fromkeys(range(4), step)  # all follow the root


async def test_with_the_model_auto_is_sized_and_the_root_asks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a group has the cost model's parameters, a broadcast's ``auto`` is ``sized``
    and the root runs the shape the model predicts faster for the size."""
    from netcoll.selection import cost, tuner
    from tests.support import run_world

    slow = cost.Params(alpha=4e-4, overhead=1e-5, beta=8e-9, gamma=1e-10, solo=8e-9)  # 1 Gbit/s, 400 µs
    followed = follow(monkeypatch)
    monkeypatch.setattr(tuner.Tuner, "params_at", lambda self, seq: slow)  # the group's agreed parameters
    for n, step in ((1 << 10, 0), (1 << 22, 1)):  # 8 KiB: the tree; 32 MiB: the chain
        x = np.ones(n, dtype=np.float64)

        async def one(c: Any, x: np.ndarray = x) -> str:
            got = await c.broadcast(x if c.rank == 0 else None, root=0)
            np.testing.assert_array_equal(got, x)
            return str(c.model_stats["choices"]["broadcast"]["algorithm"])

        assert await run_world(4, one) == ["ring" if step else "tree"] * 4
        assert {r: st for r, (_, st) in followed.items()} == dict.fromkeys(range(4), step)
