"""Folding over TCP (:mod:`netcoll.links.folding`): a large payload whose receive reduces is
read through one small piece buffer and reduced piece by piece, with the bits of the
in-memory transport (which never folds), whatever sizes the reads come in; smaller payloads,
and receives without a fold, land in their posted buffer as before; TLS links do the same."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netcoll.comm import Communicator
from netcoll.links import folding
from netcoll.links.factory import LinkConfig
from netcoll.links.folding import FoldPieces
from netcoll.links.tcp import TcpLink
from netcoll.mesh.certs import TlsConfig
from netcoll.ops import Fold, ReduceOp, reduce_to
from tests.support.groups import tcp_mesh
from tests.support.tlsca import issue, make_ca
from tests.support.worlds import memory_world

KIB = 1 << 10


def feed(pieces: FoldPieces, data: bytes, reads: list[int]) -> None:
    """Hand ``data`` to ``pieces`` as a socket would: reads of the given sizes into each room."""
    pos, k = 0, 0
    while pos < len(data):
        room = pieces.room()
        assert 0 < room.nbytes <= len(data) - pos
        n = min(room.nbytes, max(1, reads[k % len(reads)]) if reads else room.nbytes)
        room[:n] = data[pos : pos + n]
        pieces.took(n)
        pos, k = pos + n, k + 1


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["float32", "float64", "int16", "complex128", "uint8"]),
    st.integers(0, 3000),
    st.integers(16, 1000),
    st.lists(st.integers(1, 999), max_size=8),
    st.booleans(),
)
def test_pieces_fold_reads_of_any_size_with_the_bits_of_reduce_to(
    dtype: str, n: int, piece: int, reads: list[int], first: bool
) -> None:
    """Reads end anywhere, inside elements too; a piece is folded once full (whole
    elements: its size rounded down to the item size) or at the payload's end."""
    rng = np.random.default_rng(n)
    own = (rng.standard_normal(n) * 100).astype(dtype)
    incoming = (rng.standard_normal(n) * 100).astype(dtype)
    expected = np.empty_like(own)
    reduce_to(ReduceOp.SUM, expected, *((incoming, own) if first else (own, incoming)))
    out = np.zeros_like(own)
    fold = Fold(ReduceOp.SUM, out, own, incoming_first=first)
    if not FoldPieces.fits(fold, piece):
        return
    posted = memoryview(bytearray(b"\x07" * own.nbytes))
    pieces = FoldPieces(fold, memoryview(bytearray(piece)), posted)
    feed(pieces, incoming.tobytes(), reads)
    assert fold.complete and out.tobytes() == expected.tobytes()
    assert pieces.result is posted and bytes(posted) == b"\x07" * own.nbytes  # never written


def test_a_piece_smaller_than_an_element_does_not_fit() -> None:
    fold = Fold(ReduceOp.SUM, np.zeros(4, np.complex128), np.zeros(4, np.complex128))
    assert not FoldPieces.fits(fold, 8) and FoldPieces.fits(fold, 16)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the pieces FoldPieces folds (through :meth:`Fold.apply`)."""
    folded: list[int] = []
    took = FoldPieces.took

    def counting(self: FoldPieces, n: int) -> None:
        before = self.fold.done
        took(self, n)
        if self.fold.done != before:
            folded.append(self.fold.done - before)

    monkeypatch.setattr(FoldPieces, "took", counting)
    return folded


@pytest.mark.tcp
@pytest.mark.parametrize("kind", ["tcp", "tls"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16])
async def test_reductions_over_tcp_fold_large_payloads_as_read_with_the_same_bits(
    kind: str, dtype: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """all_reduce (ring and tree), reduce_scatter (ring and halving) and reduce (ring
    and tree) over TCP and TLS links fold every payload from ``socket_fold_min`` as it
    is read, through a piece smaller than the payload (whose size is no multiple of the
    item size), and give the very bits of the in-memory transport."""
    monkeypatch.setenv("NETCOLL_TRANSPORT", kind)
    monkeypatch.setattr(TcpLink, "socket_fold_min", 16 * KIB)
    monkeypatch.setattr(folding, "PIECE", 10 * KIB + 3)
    folded = _counting(monkeypatch)
    size, n = 3, 3 * 20_000 + 1  # uneven chunks
    rng = np.random.default_rng(11)
    xs = [(rng.standard_normal(n) * 1000).astype(dtype) for _ in range(size)]
    rows = [np.concatenate([x, x[: -n % size]]).reshape(size, -1) for x in xs]

    async def calls(c: Communicator) -> list[np.ndarray]:
        r, got = c.rank, []
        for algo in ("ring", "tree"):
            got.append(await c.all_reduce(xs[r], algorithm=algo))
            red = await c.reduce(xs[r], root=1, algorithm=algo)
            if r == 1:
                got.append(red)
        for algo in ("ring", "halving"):
            got.append(await c.reduce_scatter(rows[r], algorithm=algo))
        return got

    _, mem = memory_world(size)
    expected = await asyncio.gather(*(calls(c) for c in mem))
    assert folded == []  # in memory: nothing folded
    tls = TlsConfig(**issue(make_ca(tmp_path), tmp_path, "node")) if kind == "tls" else None
    async with tcp_mesh(size, configs=[LinkConfig(transport=kind)] * size, tls=tls) as ts:
        assert {s.kind for t in ts for s in t.link_stats().values()} == {kind}
        comms = [Communicator(t, segment_bytes=64 * KIB) for t in ts]
        try:
            got = await asyncio.wait_for(asyncio.gather(*(calls(c) for c in comms)), 60)
        finally:
            for c in comms:
                await c.close()
    for mine, theirs in zip(got, expected, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    item = np.dtype(dtype).itemsize
    assert folded and max(folded) == (10 * KIB + 3) // item * item  # a piece at a time


@pytest.mark.tcp
async def test_payloads_below_the_fold_size_land_in_their_posted_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below ``socket_fold_min`` (and always by default below 2 MiB) nothing is folded
    as it is read: the algorithm reduces what landed in its buffer, as before."""
    monkeypatch.setenv("NETCOLL_TRANSPORT", "tcp")
    folded = _counting(monkeypatch)
    x = np.arange(3 * 100_000, dtype=np.float32)  # 400 KB chunks
    async with tcp_mesh(3, configs=[LinkConfig(transport="tcp")] * 3) as ts:
        comms = [Communicator(t) for t in ts]
        try:
            ys = await asyncio.wait_for(asyncio.gather(*(c.all_reduce(x, algorithm="ring") for c in comms)), 30)
        finally:
            for c in comms:
                await c.close()
    assert all((y == 3 * x).all() for y in ys)
    assert folded == [] and TcpLink.socket_fold_min == 2 << 20
