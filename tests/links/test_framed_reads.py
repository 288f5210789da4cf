"""How a peer connection reads frames (sans I/O: the protocol's buffers only)."""

from __future__ import annotations

from netcoll.links.connection import COALESCE_MAX, FramedProtocol
from netcoll.wire import Kind, encode


async def test_a_coalesced_frame_fits_one_read() -> None:
    """The largest frame written as one buffer (a payload of COALESCE_MAX behind its
    header) fits the buffer one read fills at a frame boundary, so it arrives in one
    system call and one turn of the loop, not two (a 64 KiB scratch left the header's
    worth of a 64 KiB payload for a second read)."""
    header = {
        "g": "a-group-name-of-some-length",
        "q": 2**40,
        "f": "all_reduce(segment_bytes=4194304, x=float32[16384], op=sum, algorithm=doubling)",
        "s": 31,
        "c": 1023,
    }
    frame = b"".join(bytes(piece) for piece in encode(Kind.DATA, header, bytes(COALESCE_MAX)))
    proto = FramedProtocol()
    assert len(proto.get_buffer(-1)) >= len(frame)
