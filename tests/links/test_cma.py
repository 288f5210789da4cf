"""Cross-memory attach (``netcoll/links/cma.py``): reading another process's
memory, and the probe that decides whether a pair uses it."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import numpy as np
import pytest

from netcoll.links import cma

pytestmark = pytest.mark.skipif(not cma.enabled(), reason="no process_vm_readv here")


def test_a_read_copies_exactly_the_bytes_at_the_address() -> None:
    src = np.arange(1 << 20, dtype=np.uint32)
    dst = np.zeros(1 << 20, dtype=np.uint32)
    cma.read(os.getpid(), cma.address(memoryview(src).cast("B")), memoryview(dst).cast("B"))
    assert np.array_equal(src, dst)
    view = memoryview(src.tobytes())  # read-only buffers have an address too
    cma.read(os.getpid(), cma.address(view), memoryview(dst).cast("B"))
    assert np.array_equal(src, dst)


def test_a_read_of_an_unmapped_address_or_a_gone_process_is_an_os_error() -> None:
    dst = memoryview(bytearray(64))
    with pytest.raises(OSError, match="read 0 of 64 bytes"):
        cma.read(os.getpid(), 4096, dst)
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with pytest.raises(OSError):  # (a reaped pid: ESRCH, unless reused meanwhile by a process we cannot read)
        cma.read(int(proc.stdout), 4096, dst)


def pair() -> tuple[cma.Identity, cma.Identity, memoryview]:
    page = memoryview(bytearray(4096))
    nonce = secrets.token_bytes(16)
    return cma.Identity(page, nonce, creator=True), cma.Identity(page, nonce, creator=False), page


def test_the_probe_marks_a_peer_whose_nonce_it_reads_back() -> None:
    dialer, acceptor, _ = pair()
    assert acceptor.probe() == "the peer does not use it"  # nothing published yet
    dialer.publish()
    acceptor.publish()
    assert not dialer.peer_reads() and not acceptor.peer_reads()
    assert acceptor.probe() == "" and acceptor.peer_pid == os.getpid()
    assert dialer.peer_reads() and not acceptor.peer_reads()  # only the direction that was probed
    assert dialer.probe() == "" and acceptor.peer_reads()


def test_the_probe_refuses_a_slot_that_does_not_lead_to_the_nonce() -> None:
    dialer, acceptor, page = pair()
    dialer.publish()
    other = cma.Identity(memoryview(bytearray(4096)), secrets.token_bytes(16), creator=True)
    other.publish()  # a process that holds another nonce at the published address
    page[64:80] = other._header[64:80]  # type: ignore[attr-defined]
    assert "is not the peer" in acceptor.probe() and not dialer.peer_reads()
    page[72:80] = (8).to_bytes(8, "little")  # an address that is not mapped
    assert "cannot read its memory" in acceptor.probe() and acceptor.peer_pid == 0


@pytest.mark.parametrize(
    ("value", "cores", "ranks", "lends"),
    [
        ("", 2, 2, False),
        ("", 2, 3, True),
        ("auto", 8, 8, False),
        ("AUTO", 8, 9, True),
        ("1", 64, 2, True),
        ("0", 1, 64, False),
    ],
)
def test_a_rank_lends_by_its_setting_and_how_crowded_its_host_is(
    value: str, cores: int, ranks: int, lends: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETCOLL_SHM_CMA", value)
    monkeypatch.setattr(cma, "usable_cores", lambda: cores)
    assert cma.lends(ranks) is lends
    assert cma.enabled() is (value != "0")


def test_usable_cores_are_this_processs_cpus() -> None:
    assert 1 <= cma.usable_cores() <= (os.cpu_count() or 1)
