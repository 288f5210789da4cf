"""How much a socket read waits for: the receive low-water mark (``SO_RCVLOWAT``).

While a frame's payload is being read, the connection knows how many bytes are surely
still coming (``bytes_due()``: the rest of that payload). The kernel may then wake the
reader only once ``min(due, MAX)`` bytes are in, instead of at every burst of packets: on
a link slower than the loop reads (1 Gbit/s against a loop that reads GB/s) a multi-MiB
payload costs a few wake-ups per 256 KiB, not one per burst. The mark is never above
what is due, so no read waits for bytes that will not come (and Linux wakes a reader
anyway when its receive window fills or the connection ends).

:func:`mark_for` is the policy (no I/O); :class:`ReadMark` applies it to one socket.
"""

from __future__ import annotations

import socket
from typing import Any, Final

#: The most bytes a read waits for while a payload is due.
MAX: Final = 256 * 1024
#: Payload remainders below this are read as they come (the mark stays 1).
MIN: Final = 16 * 1024


def mark_for(due: int, current: int) -> int | None:
    """The mark to set when ``due`` bytes are surely coming and the socket's mark is
    ``current``, or None to leave it: lowered at once when above what is due, raised
    only when that at least doubles it (fewer system calls: a 1 MiB payload costs
    about three)."""
    want = min(due, MAX) if due >= MIN else 1
    if current > max(due, 1) or want >= 2 * current:
        return want
    return None


class ReadMark:
    """``SO_RCVLOWAT`` of one socket, kept equal to :func:`mark_for` of what its protocol
    says is due (a protocol without ``bytes_due`` leaves it at 1)."""

    __slots__ = ("_sock", "value")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        #: the socket's mark; 0 where it cannot be set (then never tried again)
        self.value = 1

    def after_read(self, protocol: Any) -> None:
        """The protocol has taken a read: set the mark for what it now expects."""
        due_of = getattr(protocol, "bytes_due", None)
        if due_of is None or not self.value:
            return
        want = mark_for(due_of(), self.value)
        if want is not None:
            self._set(want)

    def reset(self) -> None:
        """Back to 1 (the socket is handed to a layer that reads it otherwise: TLS)."""
        if self.value > 1:
            self._set(1)

    def _set(self, value: int) -> None:
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, value)
        except OSError:  # a socket that has no such option: read as the data comes
            value = 0
        self.value = value


__all__ = ["MAX", "MIN", "ReadMark", "mark_for"]
