"""The wire format, sans-IO: pure functions and a byte-fed decoder, no sockets,
no asyncio (in the style of h11). ``docs/protocol.md`` describes the bytes.

A frame is::

    +--------+---------+------+-------+------------+-------------+
    | magic  | version | kind | flags | header_len | payload_len |   20-byte prefix,
    | 4s     | u8      | u8   | u16   | u32        | u64         |   network byte order
    +--------+---------+------+-------+------------+-------------+
    | msgpack header (a map with str keys), header_len bytes       |
    +--------------------------------------------------------------+
    | raw payload bytes (tensor body), payload_len bytes           |
    +--------------------------------------------------------------+

Payloads are never msgpack-encoded or pickled. Every length is checked against
:class:`FrameLimits` before anything is allocated. The decoder can hand the payload
of a frame straight to a caller-supplied buffer (``sink``) and exposes the
unfilled part of that buffer (:meth:`FrameDecoder.payload_target`) so an I/O
layer can ``recv_into`` it directly: the payload is then copied zero times.
"""

from __future__ import annotations

from .decoder import CHUNK, FrameDecoder, Pieces, Sink
from .frames import (
    CONTROL_KINDS,
    DEFAULT_LIMITS,
    MAGIC,
    PREFIX,
    PREFIX_SIZE,
    SCHEMA,
    VERSION,
    Frame,
    FrameLimits,
    Kind,
    decode_header,
    decode_prefix,
    encode,
    encode_header,
)

__all__ = [
    "MAGIC",
    "VERSION",
    "PREFIX_SIZE",
    "CHUNK",
    "Kind",
    "CONTROL_KINDS",
    "SCHEMA",
    "FrameLimits",
    "DEFAULT_LIMITS",
    "Frame",
    "encode_header",
    "encode",
    "decode_prefix",
    "decode_header",
    "FrameDecoder",
    "Sink",
    "Pieces",
    "PREFIX",
]
