"""netcoll.threads: loop threads leave signals to the main thread (a Ctrl-C delivered to a
loop thread stayed pending while the main thread waited in connect(): the Ctrl-C test of
tests/sync/test_shutdown.py hung now and then on a loaded machine)."""

from __future__ import annotations

import signal
import threading

import pytest

from netcoll import threads

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")


def _mask() -> set[int]:
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_a_started_thread_blocks_the_handled_signals_and_the_starter_keeps_its_mask() -> None:
    before = _mask()
    seen: list[set[int]] = []
    t = threading.Thread(target=lambda: seen.append(_mask()))
    threads.start(t)
    t.join(10)
    assert signal.SIGINT in seen[0] and signal.SIGTERM in seen[0]
    assert seen[0] >= threads.HANDLED
    assert _mask() == before  # the caller's mask is as it was
