"""Tests for the sans-IO wire format (:mod:`netcoll.wire`).

Pure, fast, no sockets: frames are encoded, cut at arbitrary points, fed to a
:class:`FrameDecoder` (optionally with a sink / direct writes) and compared.
"""

from __future__ import annotations

import os
import struct
import tracemalloc
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netcoll.errors import NetcollError, ProtocolError
from netcoll.wire import (
    CHUNK,
    CONTROL_KINDS,
    DEFAULT_LIMITS,
    MAGIC,
    PREFIX_SIZE,
    SCHEMA,
    VERSION,
    Frame,
    FrameDecoder,
    FrameLimits,
    Kind,
    Pieces,
    decode_header,
    decode_prefix,
    encode,
    encode_header,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: FrameLimits small enough that fuzzed lengths never make the decoder allocate much.
SMALL = FrameLimits(max_header=4096, max_payload=1 << 16)

GIB = 1 << 30
ABORT_OPTIONAL = ("ranks", "w")  # an ABORT's optional fields the wire checks (check_abort)

# --------------------------------------------------------------------------- helpers


def valid_header(kind: Kind) -> dict[str, Any]:
    """A header holding exactly the required fields of ``kind`` (plus realistic optional ones)."""
    return {
        Kind.CHALLENGE: {"nonce": os.urandom(16), "role": "rank"},
        Kind.HELLO: {"role": "rank", "nonce": os.urandom(16), "proof": os.urandom(32), "rank": 3},
        Kind.WELCOME: {"proof": os.urandom(32)},
        Kind.DATA: {
            "g": "default",
            "q": 7,
            "s": 2,
            "c": 0,
            "f": "all_reduce(float32[1000], op=sum)",
            "m": {"dtype": "float32", "shape": [10, 100]},
        },
        Kind.ABORT: {
            "g": "default",
            "q": 7,
            "reason": "peer 2 timed out",
            "origin": 1,
            "cause": "timeout",
            "ranks": [2],
            "w": {"n": "all_reduce", "q": 7, "g": "default", "r": [2], "s": 4.5, "a": 5.0},
        },
        Kind.REQUEST: {"id": 1, "method": "submit", "params": {"op": "all_reduce"}},
        Kind.RESPONSE: {"id": 1, "ok": False, "error": {"type": "ValueError", "message": "no"}},
        Kind.EVENT: {"topic": "members", "epoch": 2},
        Kind.ERROR: {"message": "authentication failed"},
        Kind.PING: {},
        Kind.PONG: {},
        Kind.BYE: {},
        Kind.CREDIT: {"n": 1 << 20},
        Kind.RTS: {"id": 3, "n": 200 << 20, "g": "default", "q": 7, "s": 2, "c": 0},
        Kind.CTS: {"id": 3, "ok": True},
        Kind.BELL: {},
    }[kind]


def required_only(kind: Kind) -> dict[str, Any]:
    return {k: v for k, v in valid_header(kind).items() if k in SCHEMA[kind]}


def frame_bytes(
    kind: Kind,
    header: dict[str, Any],
    payload: bytes | memoryview = b"",
    flags: int = 0,
    limits: FrameLimits = DEFAULT_LIMITS,
) -> bytes:
    return b"".join(bytes(p) for p in encode(kind, header, payload, flags, limits))


def raw_prefix(
    magic: bytes = MAGIC,
    version: int = VERSION,
    kind: int = int(Kind.DATA),
    flags: int = 0,
    header_len: int = 0,
    payload_len: int = 0,
) -> bytes:
    return struct.pack("!4sBBHIQ", magic, version, kind, flags, header_len, payload_len)


def raw_frame(kind: Kind, header_obj: Any, payload: bytes = b"", *, packed: bytes | None = None) -> bytes:
    """A frame whose header bytes are anything (bypasses the encoder's own checks)."""
    body = msgpack.packb(header_obj, use_bin_type=True) if packed is None else packed
    return raw_prefix(kind=int(kind), header_len=len(body), payload_len=len(payload)) + body + payload


def pattern(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


def feed_all(dec: FrameDecoder, pieces: list[bytes]) -> list[Frame]:
    frames: list[Frame] = []
    for piece in pieces:
        frames.extend(dec.feed(piece))
    return frames


def addr(buf: Any) -> int:
    """Address of the first byte of a buffer (numpy array or memoryview)."""
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


def assert_broken(dec: FrameDecoder) -> None:
    assert not dec.at_boundary
    assert dec.payload_target() is None
    with pytest.raises(ProtocolError):
        dec.feed(frame_bytes(Kind.PING, {}))
    with pytest.raises(ProtocolError):
        dec.feed(b"")
    with pytest.raises(ProtocolError):
        dec.payload_written(0)


# --------------------------------------------------------------------------- strategies

kinds = st.sampled_from(list(Kind))
msgpack_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
msgpack_values = st.recursive(
    msgpack_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
extras = st.dictionaries(st.text(max_size=10), msgpack_values, max_size=4)
payloads = st.one_of(
    st.binary(max_size=64),
    st.integers(0, 20_000).map(pattern),
)


@st.composite
def frames(draw: st.DrawFn) -> tuple[Kind, dict[str, Any], bytes, int]:
    kind = draw(kinds)
    checked = ABORT_OPTIONAL if kind is Kind.ABORT else ()  # optional fields the wire checks
    header = {**{k: v for k, v in draw(extras).items() if k not in checked}, **required_only(kind)}
    payload = b"" if kind in CONTROL_KINDS else draw(payloads)  # control kinds carry no payload
    return kind, header, payload, draw(st.integers(0, 0xFFFF))


# --------------------------------------------------------------------------- layout


def test_constants_and_kind_numbers_are_fixed() -> None:
    assert MAGIC == b"NCOL" and VERSION == 1 and PREFIX_SIZE == 20
    assert {k.name: k.value for k in Kind} == {
        "CHALLENGE": 1,
        "HELLO": 2,
        "WELCOME": 3,
        "DATA": 4,
        "ABORT": 5,
        "REQUEST": 6,
        "RESPONSE": 7,
        "EVENT": 8,
        "ERROR": 9,
        "PING": 10,
        "PONG": 11,
        "BYE": 12,
        "CREDIT": 13,
        "RTS": 14,
        "CTS": 15,
        "BELL": 16,
    }
    assert set(SCHEMA) == set(Kind)


def test_prefix_layout_byte_by_byte() -> None:
    header = required_only(Kind.DATA)
    head = encode_header(Kind.DATA, header, payload_len=0x0102030405, flags=0xA1B2)
    body = msgpack.packb(header, use_bin_type=True)
    assert head[0:4] == b"NCOL"
    assert head[4] == 1
    assert head[5] == Kind.DATA == 4
    assert head[6:8] == b"\xa1\xb2"  # flags, big-endian u16
    assert head[8:12] == len(body).to_bytes(4, "big")  # header_len, big-endian u32
    assert head[12:20] == (0x0102030405).to_bytes(8, "big")  # payload_len, big-endian u64
    assert head[20:] == body
    assert msgpack.unpackb(head[20:], raw=False) == header


def test_encode_passes_payload_through_without_copy() -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    pieces = encode(Kind.DATA, required_only(Kind.DATA), arr)
    assert len(pieces) == 2
    body = pieces[1]
    assert isinstance(body, memoryview) and body.nbytes == arr.nbytes
    assert addr(body) == arr.ctypes.data  # same memory, no copy
    assert bytes(body) == arr.tobytes()
    assert encode(Kind.PING, {}) == [encode_header(Kind.PING, {})]  # no empty payload piece


def test_encode_rejects_oversize_header() -> None:
    with pytest.raises(ProtocolError):
        encode(Kind.EVENT, {"topic": "x" * 100}, limits=FrameLimits(max_header=50))
    with pytest.raises(ProtocolError):
        encode_header(Kind.DATA, required_only(Kind.DATA), payload_len=11, limits=FrameLimits(max_payload=10))


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("kind", list(Kind))
@pytest.mark.parametrize("size", [0, 1, 7, 4096, 100_003])
def test_roundtrip_every_kind(kind: Kind, size: int) -> None:
    header, payload = valid_header(kind), pattern(size, seed=size)
    dec = FrameDecoder()
    if kind in CONTROL_KINDS and size:  # control kinds carry no payload, on either side
        with pytest.raises(ProtocolError, match=f"{kind.name} frame payload"):
            encode(kind, header, payload)
        with pytest.raises(ProtocolError, match=f"{kind.name} frame payload"):
            dec.feed(raw_frame(kind, header, payload))
        return
    [frame] = dec.feed(frame_bytes(kind, header, payload, flags=5))
    assert frame.kind is kind
    assert frame.header == header
    assert isinstance(frame.payload, memoryview)
    assert frame.payload.nbytes == size and bytes(frame.payload) == payload
    assert frame.flags == 5
    assert dec.at_boundary


@pytest.mark.parametrize("kind", [k for k in Kind if not SCHEMA[k]])
def test_header_len_zero_for_kinds_without_required_fields(kind: Kind) -> None:
    dec = FrameDecoder()
    payload = b"" if kind in CONTROL_KINDS else b"abc"
    [frame] = dec.feed(raw_prefix(kind=int(kind), payload_len=len(payload)) + payload)
    assert frame.kind is kind and frame.header == {} and bytes(frame.payload) == payload
    assert dec.at_boundary


@pytest.mark.parametrize("kind", [k for k in Kind if SCHEMA[k]])
def test_header_len_zero_rejected_for_kinds_with_required_fields(kind: Kind) -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError):
        dec.feed(raw_prefix(kind=int(kind)))
    assert_broken(dec)


@FAST
@given(frames(), st.lists(st.integers(0, 1 << 20), max_size=8))
def test_roundtrip_random_split_points(f: tuple[Kind, dict[str, Any], bytes, int], cuts: list[int]) -> None:
    kind, header, payload, flags = f
    dec = FrameDecoder()
    [frame] = feed_all(dec, split(frame_bytes(kind, header, payload, flags), cuts))
    assert (frame.kind, frame.header, bytes(frame.payload), frame.flags) == (kind, header, payload, flags)
    assert dec.at_boundary


@FAST
@given(st.lists(frames(), min_size=1, max_size=6), st.lists(st.integers(0, 1 << 20), max_size=10))
def test_back_to_back_frames_random_splits(fs: list[tuple[Kind, dict[str, Any], bytes, int]], cuts: list[int]) -> None:
    stream = b"".join(frame_bytes(*f) for f in fs)
    dec = FrameDecoder()
    got = feed_all(dec, split(stream, cuts))
    assert [(g.kind, g.header, bytes(g.payload), g.flags) for g in got] == fs
    assert dec.at_boundary


def test_back_to_back_in_one_feed_and_byte_by_byte() -> None:
    specs = [(k, valid_header(k), pattern(0 if k in CONTROL_KINDS else i * 37, seed=i)) for i, k in enumerate(Kind)]
    stream = b"".join(frame_bytes(k, h, p) for k, h, p in specs)
    for pieces in ([stream], [stream[i : i + 1] for i in range(len(stream))]):
        dec = FrameDecoder()
        got = feed_all(dec, pieces)
        assert [(g.kind, g.header, bytes(g.payload)) for g in got] == specs
        assert dec.at_boundary
    # payloads of earlier frames are not clobbered by later ones
    assert len({id(g.payload.obj) for g in got if g.payload.nbytes}) == sum(1 for *_, p in specs if p)


def test_feed_accepts_bytearray_and_typed_memoryviews() -> None:
    data = frame_bytes(Kind.DATA, valid_header(Kind.DATA), pattern(400))
    padded = data + b"\0" * (-len(data) % 4)
    as_u32 = np.frombuffer(padded, dtype=np.uint32)  # itemsize 4 view of the stream
    for chunk in (bytearray(data), memoryview(data), memoryview(as_u32)):
        [frame] = FrameDecoder().feed(chunk)[:1]
        assert bytes(frame.payload) == pattern(400)


def test_decoder_keeps_no_reference_to_fed_buffers() -> None:
    """An I/O layer reuses its receive buffer; frames must not change when it does."""
    header, payload = valid_header(Kind.DATA), pattern(1000)
    data = frame_bytes(Kind.DATA, header, payload)
    dec = FrameDecoder()
    buf = bytearray(len(data))
    got: list[Frame] = []
    for start in range(0, len(data), 13):  # cuts inside prefix and header
        piece = data[start : start + 13]
        buf[: len(piece)] = piece
        got += dec.feed(memoryview(buf)[: len(piece)])
        buf[:] = b"\xff" * len(buf)  # clobber after every feed
    [frame] = got
    assert frame.header == header and bytes(frame.payload) == payload
    buf.extend(b"x")  # no buffer export left behind


def test_empty_feed_is_a_noop() -> None:
    dec = FrameDecoder()
    assert dec.feed(b"") == [] and dec.at_boundary
    data = frame_bytes(Kind.PING, {})
    dec.feed(data[:5])
    assert dec.feed(b"") == [] and not dec.at_boundary
    assert len(dec.feed(data[5:])) == 1 and dec.at_boundary


# --------------------------------------------------------------------------- sink


class RecordingSink:
    def __init__(self, make=lambda n: np.empty(n, dtype=np.uint8)) -> None:
        self.make = make
        self.calls: list[tuple[Kind, dict[str, Any], int]] = []
        self.buffers: list[Any] = []

    def __call__(self, kind: Kind, header: dict[str, Any], n: int) -> Any:
        self.calls.append((kind, dict(header), n))
        buf = self.make(n)
        self.buffers.append(buf)
        return buf


def test_sink_payload_lands_in_callers_buffer() -> None:
    sink = RecordingSink()
    header, payload = valid_header(Kind.DATA), pattern(5000)
    dec = FrameDecoder(sink=sink)
    [frame] = feed_all(dec, split(frame_bytes(Kind.DATA, header, payload), [3, 25, 40, 900, 4000]))
    [arr] = sink.buffers
    assert sink.calls == [(Kind.DATA, header, 5000)]
    assert arr.tobytes() == payload
    assert frame.payload.obj is arr  # the frame's payload is the posted buffer
    assert addr(frame.payload) == arr.ctypes.data and np.shares_memory(np.asarray(frame.payload), arr)


@pytest.mark.parametrize(
    "make",
    [
        lambda n: np.empty(n // 4, dtype=np.float32),  # typed array
        lambda n: memoryview(np.empty(n // 4, dtype=np.float32)),  # typed memoryview (itemsize 4)
        lambda n: np.empty((n // 8, 2), dtype=np.int32),  # 2-D array
        lambda n: memoryview(np.empty((4, n // 16), dtype=np.float32)),  # 2-D memoryview
        lambda n: bytearray(n),
        lambda n: memoryview(bytearray(n + 10))[5:-5],  # contiguous slice of a bigger buffer
    ],
)
def test_sink_typed_and_shaped_buffers(make) -> None:
    src = np.arange(256, dtype=np.float32) * 1.5
    sink = RecordingSink(make)
    dec = FrameDecoder(sink=sink)
    data = frame_bytes(Kind.DATA, valid_header(Kind.DATA), src)
    frames_ = feed_all(dec, split(data, [30, 100, 101, 555]))
    [frame], [buf] = frames_, sink.buffers
    assert np.array_equal(np.frombuffer(buf, dtype=np.float32), src)
    assert frame.payload.nbytes == src.nbytes and addr(frame.payload) == addr(buf)
    assert dec.at_boundary


def test_sink_not_called_for_empty_payload_and_none_means_decoder_allocates() -> None:
    sink = RecordingSink(lambda n: None)
    dec = FrameDecoder(sink=sink)
    got = dec.feed(frame_bytes(Kind.DATA, valid_header(Kind.DATA)) + frame_bytes(Kind.EVENT, {"topic": "t"}, b"xyz"))
    assert [c[0] for c in sink.calls] == [Kind.EVENT]  # zero-length payload: no sink call
    assert got[0].payload.nbytes == 0 and bytes(got[1].payload) == b"xyz"


def test_sink_is_consulted_as_soon_as_the_header_is_complete() -> None:
    sink = RecordingSink()
    dec = FrameDecoder(sink=sink)
    data = frame_bytes(Kind.DATA, valid_header(Kind.DATA), pattern(64))
    assert dec.feed(data[:-64]) == []
    assert len(sink.calls) == 1
    target = dec.payload_target()
    assert target is not None and target.nbytes == 64 and addr(target) == sink.buffers[0].ctypes.data


@pytest.mark.parametrize(
    "make",
    [
        lambda n: np.empty(n - 1, dtype=np.uint8),  # too small
        lambda n: np.empty(n + 1, dtype=np.uint8),  # too big
        lambda n: bytes(n),  # read-only
        lambda n: np.frombuffer(bytes(n), dtype=np.uint8),  # read-only numpy
        lambda n: memoryview(bytearray(n)).toreadonly(),  # read-only memoryview
        lambda n: np.empty(2 * n, dtype=np.uint8)[::2],  # right size, not contiguous
        lambda n: 12345,  # not a buffer at all
    ],
)
def test_sink_returning_unusable_buffer_raises_protocol_error(make) -> None:
    dec = FrameDecoder(sink=RecordingSink(make))
    with pytest.raises(ProtocolError):
        dec.feed(frame_bytes(Kind.DATA, valid_header(Kind.DATA), pattern(32)))
    assert_broken(dec)


def test_sink_exception_propagates_and_breaks_decoder() -> None:
    class Refused(Exception):
        pass

    def sink(kind: Kind, header: dict[str, Any], n: int) -> Any:
        raise Refused(n)

    dec = FrameDecoder(sink=sink)
    data = frame_bytes(Kind.DATA, valid_header(Kind.DATA), pattern(32))
    with pytest.raises(Refused):
        dec.feed(data[:-32])
    # The header was consumed; feeding on would misread payload bytes as a prefix.
    assert_broken(dec)


# --------------------------------------------------------------------------- direct writes


def test_payload_target_and_written_direct_path() -> None:
    sink = RecordingSink()
    dec = FrameDecoder(sink=sink)
    header, payload = valid_header(Kind.DATA), pattern(1000, seed=3)
    nxt = frame_bytes(Kind.PING, {})
    data = frame_bytes(Kind.DATA, header, payload)
    head_len = len(data) - 1000

    assert dec.payload_target() is None  # at a boundary
    assert dec.feed(data[:10]) == [] and dec.payload_target() is None  # inside the prefix
    assert dec.feed(data[10 : head_len + 100]) == []  # header + 100 payload bytes
    arr = sink.buffers[0]
    t = dec.payload_target()
    assert t.nbytes == 900 and addr(t) == arr.ctypes.data + 100 and not t.readonly

    t[:300] = payload[100:400]  # like sock.recv_into(t)
    assert dec.payload_written(300) is None
    assert dec.payload_written(0) is None
    t = dec.payload_target()
    assert t.nbytes == 600 and addr(t) == arr.ctypes.data + 400

    # the rest via feed, together with the next frame
    out = dec.feed(payload[400:700])
    assert out == [] and dec.payload_target().nbytes == 300
    t = dec.payload_target()
    t[:] = payload[700:]
    frame = dec.payload_written(300)
    assert isinstance(frame, Frame) and frame.header == header
    assert bytes(frame.payload) == payload == arr.tobytes()
    assert dec.at_boundary and dec.payload_target() is None
    [ping] = dec.feed(nxt)
    assert ping.kind is Kind.PING


@pytest.mark.parametrize("size", [CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5])
def test_payloads_around_the_chunk_size_roundtrip(size: int) -> None:
    """The decoder's own buffer grows chunk by chunk; the frame's payload is whole and writable."""
    payload = pattern(size, seed=size)
    data = frame_bytes(Kind.EVENT, {"topic": "big"}, payload)
    for pieces in ([data], split(data, [30, 31, 70_000, CHUNK + 40, 2 * CHUNK + 1])):
        dec = FrameDecoder()
        [frame] = feed_all(dec, pieces)
        assert bytes(frame.payload) == payload and not frame.payload.readonly and frame.payload.nbytes == size
        assert dec.at_boundary


def drive(dec: FrameDecoder, stream: bytes, steps: list[tuple[bool, int]], room: int | None = None) -> list[Frame]:
    """Feed ``stream`` to ``dec`` in ``steps``: (True, n) writes up to n bytes straight into
    ``payload_target()`` when there is one (never longer than ``room``), else feeds n bytes;
    the rest is fed at the end. The frames that came out."""
    got: list[Frame] = []
    pos = 0
    for direct, n in [*steps, (False, len(stream))]:
        t = dec.payload_target()
        if direct and t is not None and t.nbytes:
            assert room is None or t.nbytes <= room
            n = min(n, t.nbytes)
            t[:n] = stream[pos : pos + n]
            fr = dec.payload_written(n)
            got += [fr] if fr is not None else []
        else:
            got += dec.feed(stream[pos : pos + n])
        pos += n
        if pos >= len(stream):
            break
    return got


def test_payload_target_without_sink_is_the_decoders_own_buffer() -> None:
    dec = FrameDecoder()
    data = frame_bytes(Kind.EVENT, {"topic": "x"}, b"hello world")
    dec.feed(data[:-11])
    t = dec.payload_target()
    t[:] = b"hello world"
    frame = dec.payload_written(11)
    assert bytes(frame.payload) == b"hello world" and addr(frame.payload) == addr(t)


@FAST
@given(frames(), st.lists(st.tuples(st.booleans(), st.integers(0, 5000)), max_size=12), st.data())
def test_direct_writes_mixed_with_feed(f, steps, data) -> None:
    kind, header, payload, flags = f
    stream = frame_bytes(kind, header, payload, flags) + frame_bytes(Kind.PONG, {})
    dec = FrameDecoder(sink=RecordingSink() if data.draw(st.booleans()) else None)
    got = drive(dec, stream, steps)
    assert [(g.kind, g.header, bytes(g.payload), g.flags) for g in got] == [
        (kind, header, payload, flags),
        (Kind.PONG, {}, b"", 0),
    ]
    assert dec.at_boundary


class Collecting(Pieces):
    """Takes a payload in rooms of at most ``size`` bytes and keeps what it took."""

    def __init__(self, total: int, size: int) -> None:
        self.total, self.size, self.got = total, size, bytearray()
        self.buf = bytearray(size)
        self.result = memoryview(b"posted")
        self.rooms = 0

    def room(self) -> memoryview:
        self.rooms += 1
        return memoryview(self.buf)[: min(self.size, self.total - len(self.got))]

    def took(self, n: int) -> None:
        assert 0 < n <= min(self.size, self.total - len(self.got) + n)
        self.got += self.buf[:n]


@FAST
@given(st.integers(1, 5000), st.integers(1, 700), st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), max_size=12))
def test_a_payload_given_to_pieces_arrives_whole_in_order_in_any_split(size, room, steps) -> None:
    """A sink may return :class:`Pieces`: the payload goes to its rooms, fed or written
    directly in any pieces, and the frame carries its ``result``."""
    header, payload = valid_header(Kind.DATA), pattern(size, seed=size)
    stream = frame_bytes(Kind.DATA, header, payload) + frame_bytes(Kind.PONG, {})
    taker = Collecting(size, room)
    dec = FrameDecoder(sink=lambda kind, h, n: taker)
    [data, pong] = drive(dec, stream, steps, room)
    assert bytes(taker.got) == payload and data.payload is taker.result and not data.diverted
    assert pong.kind is Kind.PONG and dec.at_boundary


def test_a_whole_frame_in_one_feed_goes_to_pieces_too() -> None:
    payload = pattern(1000, seed=1)
    taker = Collecting(1000, 64)
    [frame] = FrameDecoder(sink=lambda kind, h, n: taker).feed(frame_bytes(Kind.DATA, valid_header(Kind.DATA), payload))
    assert bytes(taker.got) == payload and frame.payload is taker.result and taker.rooms >= 16


def test_divert_stops_giving_bytes_to_pieces() -> None:
    taker = Collecting(3000, 512)
    dec = FrameDecoder(sink=lambda kind, h, n: taker)
    data = frame_bytes(Kind.DATA, valid_header(Kind.DATA), pattern(3000, seed=2))
    head = len(data) - 3000
    assert dec.feed(data[: head + 700]) == []
    dec.divert()
    [frame] = dec.feed(data[head + 700 :])
    assert frame.diverted and frame.payload.nbytes == 0 and len(taker.got) == 700
    assert dec.at_boundary and dec.feed(frame_bytes(Kind.PING, {}))[0].kind is Kind.PING


def test_payload_written_misuse() -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError):
        dec.payload_written(0)  # not inside a payload
    dec.feed(frame_bytes(Kind.EVENT, {"topic": "x"}, b"abcdef")[:-6])
    with pytest.raises(ProtocolError):
        dec.payload_written(7)  # past the end
    with pytest.raises(ProtocolError):
        dec.payload_written(-1)
    [frame] = dec.feed(b"abcdef")  # misuse did not consume anything
    assert bytes(frame.payload) == b"abcdef"


# --------------------------------------------------------------------------- prefix errors and limits


@pytest.mark.parametrize(
    "bad",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # someone speaking HTTP to us
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(20),  # a TLS ClientHello
        bytes(PREFIX_SIZE),
        b"\xff" * 64,
        b"ncol" + bytes(16),  # wrong case
    ],
)
def test_garbage_and_bad_magic(bad: bytes) -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError, match="magic"):
        dec.feed(bad)
    assert_broken(dec)


@pytest.mark.parametrize("version", [0, 2, 255])
def test_bad_version(version: int) -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError, match="version"):
        dec.feed(raw_prefix(version=version))
    assert_broken(dec)
    with pytest.raises(ProtocolError):
        decode_prefix(raw_prefix(version=version))


@pytest.mark.parametrize("kind", [0, max(Kind) + 1, 99, 255])
def test_unknown_kind(kind: int) -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError, match="kind"):
        dec.feed(raw_prefix(kind=kind))
    assert_broken(dec)


def test_errors_are_netcoll_errors() -> None:
    assert issubclass(ProtocolError, NetcollError)


def test_decode_prefix_64_bit_lengths() -> None:
    five_gib = 5 * GIB
    assert five_gib > 2**32
    big = FrameLimits(max_payload=8 * GIB)
    head = encode_header(Kind.DATA, required_only(Kind.DATA), payload_len=five_gib, limits=big)
    kind, flags, header_len, payload_len = decode_prefix(head[:PREFIX_SIZE], big)
    assert (kind, flags, header_len, payload_len) == (Kind.DATA, 0, len(head) - PREFIX_SIZE, five_gib)
    assert head[12:20] == five_gib.to_bytes(8, "big")
    # the default limit (1 TiB) also allows > 4 GiB frames
    assert decode_prefix(raw_prefix(header_len=10, payload_len=five_gib))[3] == five_gib
    # the largest u64 length round-trips through the prefix when a limit allows it
    huge = FrameLimits(max_payload=2**64 - 1)
    assert decode_prefix(raw_prefix(header_len=1, payload_len=2**64 - 1), huge)[3] == 2**64 - 1
    with pytest.raises(ProtocolError, match="payload"):
        decode_prefix(raw_prefix(header_len=10, payload_len=five_gib), FrameLimits(max_payload=4 * GIB))


def test_decoder_passes_64_bit_payload_length_to_sink_without_allocating() -> None:
    """A 5 GiB frame is accepted up to the sink, which sees the exact length; the
    decoder allocates nothing for it itself."""
    seen: list[int] = []

    def sink(kind: Kind, header: dict[str, Any], n: int) -> Any:
        seen.append(n)
        return np.empty(16, dtype=np.uint8)  # not what was announced

    head = encode_header(Kind.DATA, required_only(Kind.DATA), payload_len=5 * GIB)
    dec = FrameDecoder(sink=sink)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="does not fit"):
            dec.feed(head)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seen == [5 * GIB]
    assert peak < 1 << 20
    assert_broken(dec)


@pytest.mark.parametrize(
    ("header_len", "payload_len", "limits", "what"),
    [
        (0, 2**50, DEFAULT_LIMITS, "payload"),  # 1 PiB with the default 1 TiB limit
        (10, 2**64 - 1, DEFAULT_LIMITS, "payload"),
        (2**32 - 1, 0, DEFAULT_LIMITS, "header"),
        (DEFAULT_LIMITS.max_header + 1, 0, DEFAULT_LIMITS, "header"),
        (10, 1001, FrameLimits(max_payload=1000), "payload"),
        (101, 0, FrameLimits(max_header=100), "header"),
    ],
)
def test_oversize_lengths_raise_at_the_prefix_before_allocating(header_len, payload_len, limits, what) -> None:
    prefix = raw_prefix(header_len=header_len, payload_len=payload_len)
    with pytest.raises(ProtocolError, match=what):
        decode_prefix(prefix, limits)
    dec = FrameDecoder(limits)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match=what):
            dec.feed(prefix)  # the 20 bytes alone are enough
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert_broken(dec)


def test_limits_are_inclusive() -> None:
    lim = FrameLimits(max_header=100, max_payload=1000)
    decode_prefix(raw_prefix(header_len=100, payload_len=1000), lim)
    body = msgpack.packb({"topic": "t", "pad": "x" * 80}, use_bin_type=True)
    assert len(body) <= 100
    [frame] = FrameDecoder(lim).feed(raw_frame(Kind.EVENT, None, pattern(1000), packed=body))
    assert frame.payload.nbytes == 1000


# --------------------------------------------------------------------------- truncation


@pytest.mark.parametrize("kind", [Kind.DATA, Kind.PING, Kind.HELLO])
def test_truncated_input_emits_nothing(kind: Kind) -> None:
    data = frame_bytes(kind, valid_header(kind), pattern(0 if kind in CONTROL_KINDS else 50))
    for cut in range(1, len(data)):
        dec = FrameDecoder()
        assert dec.feed(data[:cut]) == []
        assert not dec.at_boundary
        assert len(dec.feed(data[cut:])) == 1 and dec.at_boundary


@FAST
@given(frames(), st.data())
def test_truncated_stream_of_frames(f, data) -> None:
    stream = frame_bytes(*f) * 2
    cut = data.draw(st.integers(1, len(stream) - 1))
    dec = FrameDecoder()
    got = dec.feed(stream[:cut])
    assert len(got) == (1 if cut >= len(stream) // 2 else 0)
    assert dec.at_boundary == (cut == len(stream) // 2)


# --------------------------------------------------------------------------- header errors


@pytest.mark.parametrize(
    "packed",
    [
        b"\xc1",  # never-used msgpack byte
        b"\x82\xa1a",  # truncated map
        msgpack.packb({"topic": "t"}) + b"\x00",  # trailing bytes after the map
        b"\x81\xa5topic\xa2\xff\xfe",  # invalid UTF-8 in a str
        msgpack.packb({1: "x", "topic": "t"}),  # non-str map key
        msgpack.packb({"topic": "t", "params": {1: 2}}),  # non-str key in a nested map
        b"\xdd\xff\xff\xff\xff",  # array32 announcing 4G items
        b"\x91" * 2000 + b"\xc0",  # deeply nested arrays
    ],
)
def test_malformed_msgpack_header(packed: bytes) -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError):
        dec.feed(raw_frame(Kind.EVENT, None, packed=packed))
    assert_broken(dec)
    with pytest.raises(ProtocolError):
        decode_header(Kind.EVENT, packed)


@pytest.mark.parametrize("obj", [[1, 2], 7, "topic", None, b"\x80", True, 1.5])
@pytest.mark.parametrize("kind", [Kind.EVENT, Kind.PING])
def test_header_not_a_map(obj: Any, kind: Kind) -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError, match="map"):
        dec.feed(raw_frame(kind, obj))
    assert_broken(dec)


WRONG_TYPES = {
    int: ["1", 1.0, None, True, b"\x01", [1]],
    str: [1, b"s", None, ["s"]],
    bytes: ["n" * 16, 1, None, [1]],
    bool: [1, 0, "true", None],
}

SCHEMA_CASES = [(k, field) for k in Kind for field in SCHEMA[k]]


@pytest.mark.parametrize(("kind", "field"), SCHEMA_CASES, ids=[f"{k.name}.{f}" for k, f in SCHEMA_CASES])
def test_missing_or_wrongly_typed_required_field(kind: Kind, field: str) -> None:
    good = valid_header(kind)
    FrameDecoder().feed(raw_frame(kind, good))  # sanity: valid as is
    missing = {k: v for k, v in good.items() if k != field}
    variants = [missing] + [{**good, field: bad} for bad in WRONG_TYPES[SCHEMA[kind][field][0]]]
    for header in variants:
        dec = FrameDecoder()
        with pytest.raises(ProtocolError, match=field):
            dec.feed(raw_frame(kind, header, b"" if kind in CONTROL_KINDS else b"pay"))
        assert_broken(dec)
        with pytest.raises(ProtocolError):
            decode_header(kind, msgpack.packb(header, use_bin_type=True))


def test_extra_header_fields_are_kept() -> None:
    header = {**required_only(Kind.PING), "future": {"x": [1, 2.5, None]}, "b": b"\x00"}
    [frame] = FrameDecoder().feed(frame_bytes(Kind.PING, header))
    assert frame.header == header


def test_int_fields_accept_full_64_bit_range() -> None:
    for q in (0, -1, 2**63 - 1, 2**64 - 1, -(2**63)):
        header = {**required_only(Kind.DATA), "q": q}
        assert decode_header(Kind.DATA, msgpack.packb(header, use_bin_type=True))["q"] == q


# --------------------------------------------------------------------------- broken state


def test_error_after_good_frames_in_same_feed_breaks_decoder() -> None:
    dec = FrameDecoder()
    good = frame_bytes(Kind.PING, {})
    assert len(dec.feed(good)) == 1
    with pytest.raises(ProtocolError):
        dec.feed(good + b"XXXX" + bytes(16) + good)
    assert_broken(dec)


def test_broken_decoder_stays_broken_forever() -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError):
        dec.feed(b"garbage-garbage-garbage")
    for _ in range(3):
        assert_broken(dec)


# --------------------------------------------------------------------------- fuzz


def _fuzz_feed(stream: bytes, cuts: list[int], sink: Any = None) -> None:
    dec = FrameDecoder(SMALL, sink=sink)
    try:
        for piece in split(stream, cuts):
            for frame in dec.feed(piece):
                assert isinstance(frame, Frame) and isinstance(frame.kind, Kind)
                assert isinstance(frame.header, dict)
                assert frame.payload.nbytes <= SMALL.max_payload
    except ProtocolError:
        assert_broken(dec)


@FUZZ
@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=5))
def test_fuzz_arbitrary_bytes(stream: bytes, cuts: list[int]) -> None:
    _fuzz_feed(stream, cuts)


@FUZZ
@given(
    st.integers(0, 3),
    st.integers(0, 15),
    st.integers(0, 0xFFFF),
    st.integers(0, 300),
    st.integers(0, 300),
    st.binary(max_size=400),
    st.lists(st.integers(0, 500), max_size=4),
)
def test_fuzz_plausible_prefix_then_garbage(version, kind, flags, header_len, payload_len, rest, cuts) -> None:
    """Valid magic, near-valid fields, then random header/payload bytes."""
    _fuzz_feed(
        raw_prefix(version=version, kind=kind, flags=flags, header_len=header_len, payload_len=payload_len) + rest, cuts
    )


@FUZZ
@given(
    st.lists(frames(), min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6),
    st.lists(st.integers(0, 1 << 20), max_size=4),
    st.booleans(),
)
def test_fuzz_mutated_valid_streams(fs, mutations, cuts, use_sink) -> None:
    stream = bytearray(b"".join(frame_bytes(k, h, p[:2000], fl) for k, h, p, fl in fs))
    for pos, value in mutations:
        stream[pos % len(stream)] = value
    _fuzz_feed(bytes(stream), cuts, RecordingSink() if use_sink else None)


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_decode_header(data: bytes) -> None:
    for kind in (Kind.DATA, Kind.PING):
        try:
            header = decode_header(kind, data)
        except ProtocolError:
            continue
        assert isinstance(header, dict)
