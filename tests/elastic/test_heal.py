"""netcoll.elastic.heal in one process (in-memory links): joiners end with the live
members' state bit for bit, in place where they can; typed errors on every rank for no
live member, states that differ and slices that arrive corrupt twice; nothing moves
when nobody joined."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import netcoll
from netcoll.comm import Communicator
from netcoll.elastic import ChecksumMismatch, HealError, LayoutMismatch, NoSources, heal, healing, stream, transfer
from tests.elastic.states import fingerprint, live_state, stale_state
from tests.support import memory_world

#: small slices and chunks: the test states span many of both, and chunks that cross arrays
SMALL = {"slice_bytes": 20_000, "chunk_bytes": 7_000}


async def heal_world(
    n: int, joiners: int, states: list[Any] | None = None, **kw: Any
) -> tuple[list[Communicator], list[Any], list[Any]]:
    """Heal a fresh in-memory world of ``n`` ranks whose last ``joiners`` joined; (comms,
    the states passed, the results or exceptions) by rank."""
    _, comms = memory_world(n)
    for c in comms[n - joiners :]:
        c._joined = True
    if states is None:
        states = [stale_state() if c.joined else live_state() for c in comms]
    async with asyncio.timeout(60):
        got = await asyncio.gather(
            *(heal(c, s, **{**SMALL, **kw}) for c, s in zip(comms, states, strict=True)), return_exceptions=True
        )
    return comms, states, list(got)


@pytest.mark.parametrize(("n", "joiners"), [(2, 1), (3, 1), (3, 2), (4, 1), (4, 2)])
async def test_joiners_get_the_live_state_bit_for_bit(n: int, joiners: int) -> None:
    comms, states, got = await heal_world(n, joiners)
    want = fingerprint(live_state())
    for c, s, g in zip(comms, states, got, strict=True):
        assert not isinstance(g, BaseException), g
        assert fingerprint(g) == want, f"rank {c.rank}"
        if not c.joined:
            assert g is s  # a live member's own state, untouched
            continue
        assert g["step"] == 1000 and g["name"] == "run-a" and g["hooks"] == {} and "extra" not in g
        assert g["model"]["w"] is s["model"]["w"]  # right dtype and shape: filled in place
        assert g["optim"]["m"] is s["optim"]["m"]
        assert g["model"]["b"] is not s["model"]["b"] and g["model"]["b"].shape == (33,)  # wrong shape: replaced
        assert g["model"]["mask"].dtype == bool  # wrong dtype: replaced
        assert g["model"]["wt"].flags.c_contiguous  # a live member's Fortran-order array arrives in C order
        np.testing.assert_array_equal(g["model"]["wt"], live_state()["model"]["wt"])


async def test_every_live_member_sends_its_share() -> None:
    """Slices spread over the sources: at 4 ranks with 1 joiner each source sends about a third."""
    comms, _, got = await heal_world(4, 1, slice_bytes=4096, chunk_bytes=4096)
    assert not any(isinstance(g, BaseException) for g in got), got
    total = sum(a.nbytes for a in _arrays(live_state()))
    sent = [comms[r].link_stats()[3]["bytes_sent"] for r in range(3)]
    for r, b in enumerate(sent):
        assert total / 3 * 0.8 < b < total / 3 * 1.4, (r, sent, total)


def _arrays(node: Any) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for v in node.values():
        out += _arrays(v) if isinstance(v, dict) else [v] if isinstance(v, np.ndarray) else []
    return out


async def test_no_joiners_moves_no_state() -> None:
    comms, states, got = await heal_world(3, 0)
    assert [g is s for g, s in zip(got, states, strict=True)] == [True] * 3
    total = sum(a.nbytes for a in _arrays(live_state()))
    for c in comms:
        sent = sum(s["bytes_sent"] for s in c.link_stats().values())
        assert sent < 1024 < total, sent  # the one all_gather of a 48-byte row


async def test_a_joiner_with_an_empty_state() -> None:
    _, _, got = await heal_world(3, 1, states=[live_state(), live_state(), {}])
    assert fingerprint(got[2]) == fingerprint(live_state())


async def test_all_joiners_is_no_sources_on_every_rank() -> None:
    _, _, got = await heal_world(3, 3)
    assert all(isinstance(g, NoSources) for g in got), got


async def test_live_members_that_differ_fail_on_every_rank_naming_the_difference() -> None:
    other = live_state()
    other["model"]["w"] = np.zeros((65, 33), np.float32)
    _, _, got = await heal_world(4, 1, states=[live_state(), other, live_state(), {}])
    assert all(isinstance(g, LayoutMismatch) for g in got), got
    text = str(got[3])
    assert "ranks [0, 2]" in text and "ranks [1]" in text, text
    assert "model/w: array float32[64,33] against array float32[65,33]" in text, text


async def test_a_different_step_is_a_layout_mismatch() -> None:
    other = live_state()
    other["step"] = 999
    _, _, got = await heal_world(3, 1, states=[live_state(), other, {}])
    assert all(isinstance(g, LayoutMismatch) for g in got) and "differ at step: 1000 against 999" in str(got[0]), got


async def test_a_slice_corrupt_once_is_sent_again_by_the_next_source(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []

    def corrupt(slice_: int, source: int, chunk: np.ndarray) -> None:
        if slice_ == 1 and not seen:
            seen.append((slice_, source))
            chunk[0] ^= 0xFF
        elif slice_ == 1:
            seen.append((slice_, source))

    monkeypatch.setattr(transfer, "on_chunk", corrupt)
    _, _, got = await heal_world(4, 1)
    assert fingerprint(got[3]) == fingerprint(live_state()), got[3]
    assert seen[0] == (1, 1) and seen[-1] == (1, 2), seen  # slice 1: source 1, then the next one, rank 2


async def test_a_slice_corrupt_twice_fails_on_every_rank_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def corrupt(slice_: int, source: int, chunk: np.ndarray) -> None:
        if slice_ == 2:
            chunk[-1] ^= 1

    monkeypatch.setattr(transfer, "on_chunk", corrupt)
    _, _, got = await heal_world(4, 2)
    assert all(isinstance(g, ChecksumMismatch) for g in got), got
    err = got[0]
    assert isinstance(err, ChecksumMismatch)
    assert (err.slice, err.joiner, err.sources) == (2, 2, (0, 1)), err.__dict__
    assert "slice 2" in str(err) and "on rank 2 from rank 0 and again from rank 1" in str(err), err
    assert "(2 corrupt slice(s) in all)" in str(err)  # both joiners got it corrupt


async def test_a_corrupt_slice_with_one_source_is_retried_from_it(monkeypatch: pytest.MonkeyPatch) -> None:
    count = {"n": 0}

    def corrupt(slice_: int, source: int, chunk: np.ndarray) -> None:
        if slice_ == 0:
            count["n"] += 1
            chunk[:] = 0

    monkeypatch.setattr(transfer, "on_chunk", corrupt)
    _, _, got = await heal_world(2, 1)
    assert isinstance(got[1], ChecksumMismatch) and got[1].sources == (0,), got
    assert "from rank 0 and again from rank 0" in str(got[1])


async def test_bad_state_is_a_type_error_at_the_call() -> None:
    _, comms = memory_world(2)
    with pytest.raises(TypeError, match="state must be a mapping"):
        await heal(comms[0], [np.ones(3)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="opt/sched is of type object"):
        await heal(comms[0], {"opt": {"sched": object()}})
    with pytest.raises(TypeError, match="keys must be str"):
        await heal(comms[0], {"a": {1: np.ones(2)}})
    with pytest.raises(ValueError, match="chunk_bytes must be an int of at least 4096"):
        await heal(comms[0], {}, chunk_bytes=100)
    with pytest.raises(ValueError, match="timeout must be positive"):
        await heal(comms[0], {}, timeout=0)


async def test_a_joiner_that_is_never_served_times_out() -> None:
    """A live member that does not call heal: the others fail with the collective's timeout."""
    _, comms = memory_world(3)
    comms[2]._joined = True
    got = await asyncio.gather(
        heal(comms[0], live_state(), timeout=0.5), heal(comms[2], {}, timeout=0.5), return_exceptions=True
    )
    assert isinstance(got[0], netcoll.CollectiveTimeout) and got[0].ranks == (1,), got
    assert isinstance(got[1], netcoll.CollectiveError) and "rank 1" in str(got[1]), got


def test_heal_errors_are_netcoll_errors() -> None:
    for cls in (NoSources, LayoutMismatch, ChecksumMismatch):
        assert issubclass(cls, HealError) and issubclass(cls, netcoll.NetcollError)


async def test_torch_tensors_heal_in_place_and_arrive_as_tensors() -> None:
    torch = pytest.importorskip("torch")
    live = {
        "model": {
            "w": torch.arange(1000, dtype=torch.float32).reshape(10, 100),
            "h": torch.ones(7, dtype=torch.bfloat16),
        },
        "step": 5,
    }
    mine = torch.zeros(10, 100)
    states = [live, dict(live), {"model": {"w": mine}}]
    _, _, got = await heal_world(3, 1, states=states)
    g = got[2]
    assert not isinstance(g, BaseException), g
    assert g["model"]["w"] is mine and torch.equal(mine, live["model"]["w"])
    assert isinstance(g["model"]["h"], torch.Tensor) and g["model"]["h"].dtype == torch.bfloat16
    assert torch.equal(g["model"]["h"], live["model"]["h"]) and g["step"] == 5
    assert fingerprint(g) == fingerprint(live)


async def test_the_first_live_members_slice_sizes_are_used_on_every_rank() -> None:
    """A joiner passing other sizes (or none) still cuts the stream as the sources do."""
    _, comms = memory_world(3)
    comms[2]._joined = True
    async with asyncio.timeout(30):
        got = await asyncio.gather(
            heal(comms[0], live_state(), **SMALL),
            heal(comms[1], live_state(), slice_bytes=1 << 20, chunk_bytes=4096),
            heal(comms[2], stale_state()),
        )
    assert fingerprint(got[2]) == fingerprint(live_state())
    assert comms[0].link_stats()[2]["frames_sent"] > 4  # rank 0's small chunks: several messages


async def test_chunks_checked_in_worker_threads_heal_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "OFFLOAD", 0)  # every chunk through asyncio.to_thread
    _, _, got = await heal_world(4, 2)
    assert all(fingerprint(g) == fingerprint(live_state()) for g in got), got


async def test_a_chunk_of_the_wrong_size_is_a_bad_slice_and_is_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    read = stream.Stream.read

    def short(self: stream.Stream, a: int, b: int) -> np.ndarray:  # live members send chunk 0 a byte short
        return read(self, a, b)[:-1] if a == 0 else read(self, a, b)

    monkeypatch.setattr(stream.Stream, "read", short)
    states = [live_state(), live_state(), stale_state()]
    w = states[2]["model"]["w"]
    _, _, got = await heal_world(3, 1, states=states)
    assert all(isinstance(g, ChecksumMismatch) and g.slice == 0 for g in got), got
    assert not w.any()  # in slice 0: nothing of a slice is written once one of its chunks came short


async def test_the_first_live_members_checksum_choice_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """checksum=False on the first live member: nothing is checked (a corrupt chunk goes
    through), whatever the joiner passed; the rest of the state still heals."""

    done: list[int] = []

    def corrupt(slice_: int, source: int, chunk: np.ndarray) -> None:
        if not done:  # the first chunk: stream byte 0, model/b's first
            done.append(slice_)
            chunk[0] ^= 0xFF

    monkeypatch.setattr(transfer, "on_chunk", corrupt)
    _, comms = memory_world(3)
    comms[2]._joined = True
    async with asyncio.timeout(30):
        got = await asyncio.gather(
            heal(comms[0], live_state(), checksum=False, **SMALL),
            heal(comms[1], live_state(), **SMALL),
            heal(comms[2], stale_state(), checksum=True),
        )
    healed, want = got[2], live_state()
    assert healed["step"] == 1000 and fingerprint(healed) != fingerprint(want)
    assert healed["model"]["b"].view(np.uint8)[0] == want["model"]["b"].view(np.uint8)[0] ^ 0xFF
    healed["model"]["b"].view(np.uint8)[0] ^= 0xFF
    assert fingerprint(healed) == fingerprint(want)  # that byte only


@pytest.mark.parametrize("seed", range(12))
async def test_seeded_schedules_heal_the_same(seed: int) -> None:
    """Seeded worlds (2-4 ranks, 1 to all-but-one joiners, slice and chunk sizes) whose ranks
    enter heal after random delays and in random order; replay one with its seed."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 5))
    joiners = int(rng.integers(1, n))
    sizes = {"slice_bytes": int(rng.integers(4096, 40_000)), "chunk_bytes": int(rng.integers(4096, 20_000))}
    delays = rng.uniform(0, 0.02, n)
    _, comms = memory_world(n)
    for c in comms[n - joiners :]:
        c._joined = True

    async def one(c: Communicator) -> Any:
        await asyncio.sleep(float(delays[c.rank]))
        return await heal(c, stale_state() if c.joined else live_state(scale=3), **sizes)

    async with asyncio.timeout(60):
        got = await asyncio.gather(*(one(c) for c in rng.permutation(comms)))
    want = fingerprint(live_state(scale=3))
    assert all(fingerprint(g) == want for g in got), f"seed {seed}: {n} ranks, {joiners} joiners, {sizes}"


async def test_a_state_of_scalars_only_heals_with_the_layout_alone() -> None:
    live = {"step": 42, "sched": {"lr": 0.1, "name": "cosine"}, "empty": np.zeros((0, 3), np.float32)}
    _, _, got = await heal_world(3, 1, states=[live, dict(live), {"step": 0}])
    assert got[2]["step"] == 42 and got[2]["sched"] == {"lr": 0.1, "name": "cosine"}
    assert got[2]["empty"].shape == (0, 3) and got[2]["empty"].dtype == np.float32


async def test_a_layout_a_joiner_cannot_use_fails_every_rank_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(blob: bytes, *, sender: int) -> Any:
        raise HealError(f"rank {sender} sent a malformed state layout: test")

    monkeypatch.setattr(healing.lay, "decode", refuse)  # only joiners decode (no mismatch here)
    _, _, got = await heal_world(4, 1, timeout=30)
    assert isinstance(got[3], HealError) and "malformed state layout: test" in str(got[3]), got
    for g in got[:3]:
        assert type(g) is HealError and "rank(s) [3] could not use the state layout rank 0 sent" in str(g), got


async def test_joined_argument_makes_a_rank_a_joiner_whatever_its_communicator_says() -> None:
    """A joiner whose heal failed is a plain member of the next epoch (``comm.joined`` False):
    ``heal(..., joined=True)`` still fills it from the others instead of serving its state."""
    _, comms = memory_world(3)
    assert not any(c.joined for c in comms)
    states = [live_state(), live_state(), stale_state()]
    async with asyncio.timeout(60):
        got = await asyncio.gather(
            *(heal(c, s, joined=(c.rank == 2), **SMALL) for c, s in zip(comms, states, strict=True))
        )
    want = fingerprint(live_state())
    assert [fingerprint(g) for g in got] == [want] * 3
    assert got[0] is states[0] and got[2] is not states[2]
