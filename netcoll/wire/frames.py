"""Frame layout, kinds, header schemas, limits, and encoding: pure functions."""

from __future__ import annotations

import enum
import struct
import threading
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from ..errors import ProtocolError

MAGIC: Final = b"NCOL"
VERSION: Final = 1
PREFIX: Final = struct.Struct("!4sBBHIQ")
PREFIX_SIZE: Final = PREFIX.size  # 20


class Kind(enum.IntEnum):
    """Frame kinds. Values are part of the protocol; never renumber."""

    CHALLENGE = 1  # server -> client, first frame on every connection: {nonce, role}
    HELLO = 2  # client -> server: who I am (+ HMAC proof when a token is set)
    WELCOME = 3  # server -> client: accepted (+ server's HMAC proof)
    DATA = 4  # collective payload chunk
    ABORT = 5  # a collective failed on the sender; fail it here too
    REQUEST = 6  # RPC request {id, method, params}
    RESPONSE = 7  # RPC response {id, ok, result | error}
    EVENT = 8  # server push {topic, ...}
    ERROR = 9  # fatal: {message}; the sender closes the connection next
    PING = 10
    PONG = 11
    BYE = 12  # orderly close: the sender will send nothing more on this link
    CREDIT = 13  # receiver -> sender: {n}: n more bytes of eager DATA may be sent
    RTS = 14  # sender -> receiver: {id, n, g, q, s, c}: may n bytes for this slot come?
    CTS = 15  # receiver -> sender: {id, ok}: send them now (a receive is posted) / drop them
    BELL = 16  # shm link: {}: frames wait in the lane for you (you were asleep)


#: Control kinds: never flow-controlled, no payload, headers of at most
#: ``FrameLimits.max_control_header`` bytes (checked at the prefix).
CONTROL_KINDS: Final = frozenset(
    {Kind.ABORT, Kind.ERROR, Kind.PING, Kind.PONG, Kind.BYE, Kind.CREDIT, Kind.RTS, Kind.CTS, Kind.BELL}
)


#: Required header keys and their accepted types, per kind. Extra keys are
#: allowed (forward compatibility) but ignored by this version.
_INT = (int,)
_STR = (str,)
SCHEMA: Final[dict[Kind, dict[str, tuple[type, ...]]]] = {
    Kind.CHALLENGE: {"nonce": (bytes,), "role": _STR},
    Kind.HELLO: {"role": _STR, "nonce": (bytes,)},
    Kind.WELCOME: {},
    Kind.DATA: {"g": _STR, "q": _INT, "s": _INT, "c": _INT, "f": _STR},
    Kind.ABORT: {"g": _STR, "q": _INT, "reason": _STR, "origin": _INT, "cause": _STR},
    Kind.REQUEST: {"id": _INT, "method": _STR},
    Kind.RESPONSE: {"id": _INT, "ok": (bool,)},
    Kind.EVENT: {"topic": _STR},
    Kind.ERROR: {"message": _STR},
    Kind.PING: {},
    Kind.PONG: {},
    Kind.BYE: {},
    Kind.CREDIT: {"n": _INT},
    Kind.RTS: {"id": _INT, "n": _INT, "g": _STR, "q": _INT, "s": _INT, "c": _INT},
    Kind.CTS: {"id": _INT, "ok": (bool,)},
    Kind.BELL: {},
}


#: by kind value: is it a control kind (a tuple lookup is the cheapest test on the hot path)
_IS_CONTROL: Final[tuple[bool, ...]] = tuple(any(int(k) == i for k in CONTROL_KINDS) for i in range(max(Kind) + 1))

#: SCHEMA as (field, exact types) pairs, for the decoder's hot path
_SCHEMA_ITEMS: Final[dict[Kind, tuple[tuple[str, tuple[type, ...]], ...]]] = {
    kind: tuple(fields.items()) for kind, fields in SCHEMA.items()
}


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Upper bounds checked before any allocation. Control kinds
    (:data:`CONTROL_KINDS`) carry no payload and have a smaller header limit."""

    max_header: int = 64 * 1024
    max_payload: int = 1 << 40  # 1 TiB: 64-bit lengths, > 4 GiB frames work
    max_control_header: int = 16 * 1024

    def check(self, header_len: int, payload_len: int, kind: Kind | None = None) -> None:
        control = kind is not None and _IS_CONTROL[kind]
        max_header = min(self.max_header, self.max_control_header) if control else self.max_header
        max_payload = 0 if control else self.max_payload
        what = f"{kind.name} frame" if control and kind is not None else "frame"
        if header_len > max_header:
            raise ProtocolError(f"{what} header of {header_len} bytes exceeds the limit of {max_header}")
        if payload_len > max_payload:
            raise ProtocolError(f"{what} payload of {payload_len} bytes exceeds the limit of {max_payload}")


DEFAULT_LIMITS: Final = FrameLimits()


@dataclass(slots=True)  # (not frozen: a frozen dataclass's __init__ costs 4x, once per frame received)
class Frame:
    kind: Kind
    header: dict[str, Any]
    payload: memoryview
    flags: int = 0
    #: the payload stopped landing in its posted buffer part-way (:meth:`FrameDecoder.divert`); it is empty
    diverted: bool = False


class _Packers(threading.local):
    """One msgpack ``Packer`` per thread (a Packer is not safe to share between
    threads; ``msgpack.packb`` would build a new one per frame, twice the time)."""

    def __init__(self) -> None:
        self.pack = msgpack.Packer(use_bin_type=True).pack


_PACKERS: Final = _Packers()


def encode_header(
    kind: Kind, header: dict[str, Any], payload_len: int = 0, flags: int = 0, limits: FrameLimits = DEFAULT_LIMITS
) -> bytes:
    """Return prefix + msgpack header for a frame whose payload (``payload_len``
    bytes) the caller sends right after, unchanged."""
    body: bytes = _PACKERS.pack(header)
    limits.check(len(body), payload_len, kind)
    return PREFIX.pack(MAGIC, VERSION, int(kind), flags, len(body), payload_len) + body


def encode(
    kind: Kind,
    header: dict[str, Any],
    payload: bytes | memoryview = b"",
    flags: int = 0,
    limits: FrameLimits = DEFAULT_LIMITS,
) -> list[bytes | memoryview]:
    """Return the pieces of a whole frame, ready for ``writelines``; the payload
    is passed through without a copy."""
    mv = memoryview(payload)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    head = encode_header(kind, header, mv.nbytes, flags, limits)
    return [head, mv] if mv.nbytes else [head]


_KINDS: Final[dict[int, Kind]] = {int(k): k for k in Kind}  # a dict lookup is ~5x cheaper than Kind(n)


def decode_prefix(data: bytes | memoryview, limits: FrameLimits = DEFAULT_LIMITS) -> tuple[Kind, int, int, int]:
    """Parse and check a 20-byte prefix; return (kind, flags, header_len, payload_len)."""
    magic, version, kind, flags, header_len, payload_len = PREFIX.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r} (not a netcoll peer, or a corrupted stream)")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (this side speaks {VERSION})")
    k = _KINDS.get(kind)
    if k is None:
        raise ProtocolError(f"unknown frame kind {kind}")
    if (
        header_len > limits.max_header
        or payload_len > limits.max_payload
        or (_IS_CONTROL[kind] and (payload_len or header_len > limits.max_control_header))
    ):
        limits.check(header_len, payload_len, k)
    return k, flags, header_len, payload_len


def decode_header(kind: Kind, data: bytes | memoryview) -> dict[str, Any]:
    """Unpack and validate a msgpack header against :data:`SCHEMA`."""
    try:
        header = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types
        raise ProtocolError(f"malformed {kind.name} header: {exc}") from None
    if header.__class__ is not dict:
        raise ProtocolError(f"{kind.name} header must be a map, got {type(header).__name__}")
    for key, types in _SCHEMA_ITEMS[kind]:
        value = header.get(key)
        if value.__class__ not in types:  # exact types: bool is not an int here
            raise ProtocolError(f"{kind.name} header field {key!r} missing or of wrong type ({value!r})")
    if kind is Kind.ABORT and ("ranks" in header or "w" in header):
        check_abort(header)
    return header


#: an ABORT's optional ``w`` (the sender's wait, docs/protocol.md): field -> exact types
ABORT_WAIT: Final[dict[str, tuple[type, ...]]] = {
    "n": _STR,
    "q": _INT,
    "g": _STR,
    "r": (list,),
    "s": (int, float),
    "a": (int, float),
}
ABORT_RANKS_MAX: Final = 512  # entries of an ABORT's ``ranks`` and of its wait's ``r``


def check_abort(header: dict[str, Any]) -> None:
    """Check an ABORT's optional fields: ``ranks`` (a list of ranks) and ``w`` (the wait
    the sender is in: ``{n: name, q: seq, g: group, r: [world ranks], s: seconds
    without data, a: seconds running}``).
    Absent fields are fine (older senders); present ones of the wrong shape are a
    :class:`ProtocolError`."""
    ranks = header.get("ranks")
    if ranks is not None:
        _check_ranks("ranks", ranks)
    wait = header.get("w")
    if wait is None:
        return
    if wait.__class__ is not dict:
        raise ProtocolError(f"ABORT header field 'w' must be a map, got {type(wait).__name__}")
    for key, types in ABORT_WAIT.items():
        value = wait.get(key)
        if value.__class__ not in types:
            raise ProtocolError(f"ABORT header field 'w.{key}' missing or of wrong type ({value!r})")
    if wait["q"] < 0 or not 0 <= wait["s"] < 1e12 or not 0 <= wait["a"] < 1e12:  # (a NaN fails this too)
        raise ProtocolError(f"ABORT header field 'w' holds a negative or unreadable number ({wait!r})")
    _check_ranks("w.r", wait["r"])


def _check_ranks(key: str, ranks: Any) -> None:
    if ranks.__class__ is not list or len(ranks) > ABORT_RANKS_MAX:
        raise ProtocolError(f"ABORT header field {key!r} must be a list of at most {ABORT_RANKS_MAX} ranks")
    for r in ranks:
        if r.__class__ is not int or r < 0:
            raise ProtocolError(f"ABORT header field {key!r} holds {r!r}, not a rank")
