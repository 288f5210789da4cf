"""The shared-memory link's parts without sockets: ring bookkeeping (sans-IO),
segments in a temporary directory (create, attach, refuse), and the settings."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import pytest

from netcoll.errors import ProtocolError
from netcoll.links import shmring
from netcoll.links.factory import LinkConfig
from netcoll.links.lane import LANE_SPAN
from netcoll.links.shmring import RingReader, RingWriter, Segment, ShmRefused

KIB = 1 << 10
MIB = 1 << 20


# --------------------------------------------------------------------------- rings, sans-IO


def test_writer_places_pieces_in_order_and_skips_to_the_start_instead_of_wrapping() -> None:
    w = RingWriter(1000)
    assert w.piece == 250
    assert [w.place(200), w.place(250), w.place(250), w.place(250)] == [0, 200, 450, 700]
    assert w.place(250) is None  # 950 + 250 would wrap: skip to 1000, but 1250 - 0 > 1000
    assert w.released(450)
    assert w.place(250) == 1000  # at offset 0 of the next lap; 950..999 are skipped
    assert w.place(200) == 1250
    assert w.place(10) is None  # 1460 - 450 > 1000
    assert not w.released(450)  # nothing new
    assert not w.released(400)  # older than what was heard (a CREDIT in the lane overtook it): nothing
    assert w.place(10) is None and w.freed == 450
    with pytest.raises(ProtocolError, match="outside"):
        w.released(1501)  # more than was ever placed
    with pytest.raises(ProtocolError, match="outside"):
        w.released(-1)
    for bad in (True, "1", None, 1.0):
        with pytest.raises(ProtocolError):
            w.released(bad)


def test_reader_checks_every_piece_before_touching_the_ring() -> None:
    r = RingReader(1000)
    assert r.take([0, 250]) == (0, 250)
    assert r.take([250, 100]) == (250, 100)
    for bad, why in (
        ([349, 10], "expected 350"),  # out of order
        ([351, 10], "expected 350"),
        ([350, 251], "outside"),  # more than a quarter
        ([350, 0], "outside"),
        ([350, -5], "outside"),
        ([1000, 10], "outside"),  # a skip to the next lap, beyond what was given back
        ("x", "malformed"),
        ([350], "malformed"),
        ([350, True], "malformed"),
        ([350.0, 10], "malformed"),
        ([350, 10, 1], "malformed"),
    ):
        with pytest.raises(ProtocolError, match=why):
            r.take(bad)
    assert r.tail == 350  # refused pieces consume nothing


def test_reader_refuses_a_piece_that_would_overwrite_space_not_given_back() -> None:
    r = RingReader(1000)
    for pos in range(0, 1000, 250):
        r.take([pos, 250])  # (no report: the writer was never told it may reuse anything)
    with pytest.raises(ProtocolError, match="outside"):
        r.take([1000, 10])
    assert r.report() == 1000
    assert r.take([1000, 10]) == (0, 10)


def test_reader_gives_space_back_a_quarter_ring_at_a_time() -> None:
    r = RingReader(1000)
    r.take([0, 100])
    assert r.report() is None
    r.take([100, 149])
    assert r.report() is None
    r.take([249, 1])
    assert r.report() == 250 and r.reported == 250
    r.take([250, 250])
    r.take([500, 240])
    assert r.report() == 740
    r.take([1000, 250])  # skips 740..999: they count as consumed
    assert r.tail == 1250 and r.report() == 1250


@pytest.mark.parametrize("seed", range(5))
def test_a_writer_always_gets_room_once_the_reader_caught_up(seed: int) -> None:
    """No "I am waiting" message is needed: pieces of at most a quarter ring and
    reports every quarter ring always leave room once every piece is read."""
    rnd = random.Random(seed)
    size = 64 * KIB
    w, r = RingWriter(size), RingReader(size)
    ring = bytearray(size)
    inflight: list[tuple[int, int, int]] = []  # (pos, n, tag)
    for tag in range(5000):
        n = rnd.randint(1, w.piece)
        pos = w.place(n)
        if pos is None:  # the reader catches up with everything sent, its reports arrive
            for p, m, t in inflight:
                off, got = r.take([p, m])
                assert got == m and ring[off : off + m] == bytes([t % 251]) * m
                upto = r.report()
                if upto is not None:
                    w.released(upto)
            inflight.clear()
            pos = w.place(n)
            assert pos is not None, (tag, n, w.head, w.freed)
        off = pos % size
        assert off + n <= size
        ring[off : off + n] = bytes([tag % 251]) * n
        inflight.append((pos, n, tag))


# --------------------------------------------------------------------------- segments


def test_segment_is_private_mapped_by_the_peer_and_unlinked(tmp_path: Path) -> None:
    made = Segment.create(64 * KIB, str(tmp_path))
    try:
        path = Path(made.path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.stat().st_size == 4096 + 2 * 64 * KIB + 2 * LANE_SPAN
        assert shmring.NAME.match(path.name) and path.name.startswith(f"netcoll-{os.getpid()}-")
        offer = made.offer()
        assert set(offer) == {"name", "nonce", "size"} and len(offer["nonce"]) == 16
        peer = Segment.attach(offer, str(tmp_path))
        try:
            made.tx[:5] = b"hello"
            peer.tx[-3:] = b"bye"
            assert bytes(peer.rx[:5]) == b"hello" and bytes(made.rx[-3:]) == b"bye"
            peer.unlink()
            assert not path.exists()
            made.unlink()  # again: no error
            made.tx[5:7] = b"!!"  # still mapped after the unlink
            assert bytes(peer.rx[:7]) == b"hello!!"
        finally:
            peer.close()
    finally:
        made.close()
        made.close()  # idempotent
    assert list(tmp_path.iterdir()) == []


def test_attach_refuses_what_the_peer_did_not_make(tmp_path: Path) -> None:
    made = Segment.create(64 * KIB, str(tmp_path))
    try:
        good = made.offer()
        other = tmp_path / "elsewhere"
        other.mkdir()
        for offer, why in (
            (dict(good, nonce=b"\0" * 16), "nonce"),
            (dict(good, size=128 * KIB), "not a segment"),
            (dict(good, name="../../etc/passwd"), "bad segment name"),
            (dict(good, name="netcoll-1-" + "0" * 32), "cannot open"),
            (dict(good, nonce="text"), "nonce"),
            (dict(good, size=100), "ring size"),
            ({"name": good["name"]}, "nonce"),
            ("not a map", "malformed"),
        ):
            with pytest.raises(ShmRefused, match=why):
                Segment.attach(offer, str(tmp_path))
        with pytest.raises(ShmRefused, match="cannot open"):  # another host / IPC namespace
            Segment.attach(good, str(other))
        link = tmp_path / ("netcoll-2-" + "1" * 32)
        link.symlink_to(made.path)
        with pytest.raises(ShmRefused, match="cannot open"):  # never follows a link
            Segment.attach(dict(good, name=link.name), str(tmp_path))
        link.unlink()
    finally:
        made.unlink()
        made.close()
    assert [p.name for p in tmp_path.iterdir()] == ["elsewhere"]


def test_a_segment_that_cannot_be_made_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        Segment.create(64 * KIB, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="multiple of 4 KiB"):
        Segment.create(64 * KIB + 1, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_making_a_segment_removes_files_left_by_a_rank_that_died_in_its_handshake(tmp_path: Path) -> None:
    stale = tmp_path / ("netcoll-99-" + "a" * 32)
    fresh = tmp_path / ("netcoll-98-" + "b" * 32)
    other = tmp_path / "netcoll-not-ours"
    for path in (stale, fresh, other):
        path.write_bytes(b"x")
    old = stale.stat().st_mtime - shmring.STALE_AFTER - 1
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    made = Segment.create(64 * KIB, str(tmp_path))
    made.unlink()
    made.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, other.name])
    assert shmring.sweep(str(tmp_path), now=fresh.stat().st_mtime + shmring.STALE_AFTER + 1) == [fresh.name]
    assert shmring.sweep(str(tmp_path / "missing")) == []


# --------------------------------------------------------------------------- settings


def test_ring_size_by_the_number_of_peers_bounds_a_ranks_rings() -> None:
    assert [shmring.auto_ring(p) for p in (1, 3, 8)] == [4 * MIB] * 3
    assert shmring.auto_ring(15) == 2184 * KIB and shmring.auto_ring(63) == 520 * KIB
    assert shmring.auto_ring(1000) == 256 * KIB  # the floor
    for peers in range(1, 200):
        ring = shmring.auto_ring(peers)
        shmring.check_ring(ring)
        assert ring == 256 * KIB or 2 * peers * ring <= shmring.RANK_BUDGET


def test_ring_size_from_the_environment() -> None:
    assert LinkConfig.from_env({}).shm_bytes is None  # by the number of peers
    assert LinkConfig.from_env({"NETCOLL_SHM_BYTES": "256K"}).shm_bytes == 256 * KIB
    assert LinkConfig.from_env({"NETCOLL_SHM_BYTES": ""}).shm_bytes is None
    for bad in ("lots", "1000", "32K", "2G"):
        with pytest.raises(ValueError, match="NETCOLL_SHM_BYTES"):
            LinkConfig.from_env({"NETCOLL_SHM_BYTES": bad})
    with pytest.raises(ValueError, match="ring size"):
        LinkConfig(shm_bytes=12345)
    assert LinkConfig.from_env({"NETCOLL_TRANSPORT": "SHM"}).transport == "shm"
