"""Single-copy transfers between the two processes of a shared-memory link:
Linux's cross-memory attach (``process_vm_readv``), as Open MPI's shared-memory
transport uses it for large messages.

A ring message is copied twice: by the sender into the shared ring and by the
receiver out of it. With cross-memory attach the receiver copies the sender's
buffer straight into its own, once; the sender only announces where the bytes
are and waits until the receiver says it has read them (``docs/protocol.md``
§5.4, "direct DATA").

Whether a rank may read its peer's memory is not a setting: it is tried. Each
side writes, into its slot of the segment's header page, its process id and the
address of a copy of the segment's nonce in its own memory (:func:`publish`).
The other side reads 16 bytes at that address of that process (:func:`probe`):
only if they are the nonce, which only the two ends of the pair know, does it
mark in its own slot that it reads the peer, and only then does the peer send it
direct DATA. A different PID namespace (containers without a shared one), a
kernel without the call, ptrace restrictions (Yama, seccomp, no
``CAP_SYS_PTRACE`` across users) all make the probe fail, and the ring is used.
A rank lends its large sends only while its host's ranks outnumber its cores
(:func:`lends`; ``NETCOLL_SHM_CMA=1``: always); ``NETCOLL_SHM_CMA=0`` turns direct
DATA off on a rank (it then neither probes nor sends any).

Slot layout (little-endian, in the segment's first page): dialer at 64, acceptor
at 96; ``u64 pid, u64 address of the 16-byte nonce copy, u64 reads_peer``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from typing import Final

import numpy as np

from .. import settings

#: the slots of the two sides in the segment's header page
DIALER_SLOT: Final = 64
ACCEPTOR_SLOT: Final = 96
_SLOT: Final = struct.Struct("<QQQ")
_READS: Final = 16  # offset of reads_peer within a slot
#: DATA payloads of at least this many bytes go direct when the peer reads us
DIRECT_MIN: Final = 1 << 20
#: ...and of at most this many: the read is one call, during which the reader's loop
#: runs nothing else (64 MiB: about 5 ms here); larger ones take the ring, in pieces
DIRECT_MAX: Final = 64 << 20
#: a folded direct payload is read into scratch pieces of this size (stays in cache: one
#: core's L2 here). 16 / 64 MiB ring all_reduce, 4 ranks, GB/s: 256 KiB 1.90–2.12 / 1.92–2.11,
#: 1 MiB 2.04–2.45 / 2.18–2.68, 4 MiB 1.92–2.06 / 1.98–2.13 (512 KiB and 2 MiB as 1 MiB)
FOLD_PIECE: Final = 1 << 20
#: direct DATA that arrives before its receive is posted waits for it (then it is read
#: straight into the posted buffer) at most ``max(POST_WAIT_MIN, n / POST_WAIT_RATE)``
#: seconds; then it is read into a buffer of its own, as eager DATA is held, and copied
#: again when the receive comes. About what the held buffer's page faults and that second
#: copy would cost; bounded, so a receive posted late (or never) never blocks the link long.
POST_WAIT_MIN: Final = 1e-3
POST_WAIT_RATE: Final = 1e9


def post_wait(n: int) -> float:
    """Seconds direct DATA of ``n`` bytes waits for its receive to be posted."""
    return max(POST_WAIT_MIN, n / POST_WAIT_RATE)


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _bind() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    return fn


_READV = _bind()


def mode() -> str:
    """``NETCOLL_SHM_CMA``: ``"0"`` (never), ``"1"`` (lend whenever the peer reads us) or
    ``"auto"`` (the default: only while this host's ranks outnumber its cores, :func:`lends`).
    ValueError for anything else."""
    return settings.shm_cma()


def enabled() -> bool:
    """Whether this rank takes part in direct DATA at all (publishes, probes, may be
    read): on Linux with ``process_vm_readv``, unless ``NETCOLL_SHM_CMA=0``."""
    return mode() != "0" and _READV is not None


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity; a cgroup CPU quota is not seen)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def lends(local_ranks: int) -> bool:
    """Whether a rank with ``local_ranks`` ranks on its host (itself included) lends its
    large sends. By default only when they outnumber the cores: then CPU is what every
    copy costs, and one copy instead of two wins. With a core each, a ring transfer's two
    copies run on two cores at once, the ring hot in cache between them, and a broadcast
    or a scatter measured 10-30 % slower lent (2026-11; docs/performance.md says how to re-measure)."""
    how = mode()
    return enabled() and (how == "1" or (how == "auto" and local_ranks > usable_cores()))


def address(buf: memoryview) -> int:
    """The address of the first byte of a C-contiguous buffer (read-only ones too)."""
    return int(np.frombuffer(buf, dtype=np.uint8).__array_interface__["data"][0])


def read(pid: int, remote: int, into: memoryview) -> None:
    """Copy ``into.nbytes`` bytes at address ``remote`` of process ``pid`` into
    ``into`` (writeable, C-contiguous). OSError with the errno if the call fails
    or copies less (a bad address, the process gone)."""
    n = into.nbytes
    if _READV is None:
        raise OSError(errno.ENOSYS, "process_vm_readv is not available")
    local = _IoVec(address(into), n)
    far = _IoVec(remote, n)
    got = _READV(pid, ctypes.byref(local), 1, ctypes.byref(far), 1, 0)  # type: ignore[operator]
    if got == n:
        return
    err = ctypes.get_errno() if got < 0 else errno.EFAULT
    raise OSError(err, f"read {max(got, 0)} of {n} bytes at {remote:#x} of process {pid}: {os.strerror(err)}")


class Identity:
    """One side's entry in the segment's header page, and its view of the peer's.

    Args:
        header: the segment's header page (writeable).
        nonce: the segment's nonce.
        creator: whether this side made the segment (the dialer).
    """

    def __init__(self, header: memoryview, nonce: bytes, *, creator: bool) -> None:
        self._header = header
        self._nonce = nonce
        mine, theirs = (DIALER_SLOT, ACCEPTOR_SLOT) if creator else (ACCEPTOR_SLOT, DIALER_SLOT)
        self._mine, self._theirs = mine, theirs
        self._cookie = ctypes.create_string_buffer(nonce, len(nonce))  # lives as long as this object
        self.peer_pid = 0  # set by probe() once this side can read the peer
        self._peer_reads = False

    def publish(self) -> None:
        """Write this process's id and where its copy of the nonce is."""
        _SLOT.pack_into(self._header, self._mine, os.getpid(), ctypes.addressof(self._cookie), 0)

    def probe(self) -> str:
        """Try to read the peer's copy of the nonce; if that works, say so in our
        slot (the peer then sends us direct DATA). Why not, or "" if it worked."""
        pid, where, _ = _SLOT.unpack_from(self._header, self._theirs)
        if not pid or not where:
            return "the peer does not use it"
        got = bytearray(len(self._nonce))
        try:
            read(pid, where, memoryview(got))
        except OSError as exc:
            return f"cannot read its memory ({os.strerror(exc.errno) if exc.errno else exc})"
        if bytes(got) != self._nonce:
            return f"process {pid} here is not the peer (another PID namespace?)"
        self.peer_pid = pid
        struct.pack_into("<Q", self._header, self._mine + _READS, 1)
        return ""

    def peer_reads(self) -> bool:
        """Whether the peer has said it reads this process's memory (only ever becomes true)."""
        if not self._peer_reads:
            self._peer_reads = struct.unpack_from("<Q", self._header, self._theirs + _READS)[0] == 1
        return self._peer_reads


__all__ = [
    "DIRECT_MAX",
    "DIRECT_MIN",
    "FOLD_PIECE",
    "POST_WAIT_MIN",
    "POST_WAIT_RATE",
    "Identity",
    "address",
    "enabled",
    "lends",
    "mode",
    "post_wait",
    "read",
    "usable_cores",
]
