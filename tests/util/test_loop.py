"""netcoll.loop: the spinning selector behaves like a selector, and the loop choice."""

from __future__ import annotations

import asyncio
import socket

import pytest

from netcoll import loop as nloop


def test_spin_selector_returns_ready_and_times_out() -> None:
    a, b = socket.socketpair()
    sel = nloop.SpinSelector(spin=0.001)
    try:
        sel.register(a, 1)
        assert sel.select(0.01) == []  # nothing ready: spins, then sleeps the rest
        b.send(b"x")
        assert [key.fileobj for key, _ in sel.select(1.0)] == [a]
    finally:
        sel.close()
        a.close()
        b.close()


def test_run_and_loop_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> str:
        return type(asyncio.get_running_loop()._selector).__name__  # type: ignore[attr-defined]

    assert nloop.run(main()) == "SpinSelector"
    assert nloop.run(main(), "asyncio") != "SpinSelector"
    monkeypatch.setenv("NETCOLL_LOOP", "asyncio")
    assert nloop.loop_kind() == "asyncio"
    with pytest.raises(ValueError, match="unknown event loop"):
        nloop.loop_kind("fast")


class _Poller:
    """Counts calls; ``due`` frames become ready while the loop is asleep (like a peer's write)."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.ready = 0

    def poll(self) -> bool:
        self.events.append("poll")
        got, self.ready = self.ready > 0, 0
        return got

    def sleep(self) -> None:
        self.events.append("sleep")

    def wake(self) -> None:
        self.events.append("wake")


def test_spin_selector_polls_its_pollers_and_tells_them_before_it_blocks() -> None:
    sel = nloop.SpinSelector(spin=0)
    try:
        poller = _Poller()
        sel.add_poller(poller)
        assert sel.select(0.01) == []  # nothing ready: poll, sleep, poll again, block, wake
        assert poller.events == ["poll", "sleep", "poll", "wake"]
        poller.events.clear()
        poller.ready = 1
        assert sel.select(5.0) == []  # something was polled: returns at once, no sleep
        assert poller.events == ["poll"]
        sel.remove_poller(poller)
        poller.events.clear()
        assert sel.select(0.001) == [] and poller.events == []
    finally:
        sel.close()


def test_spin_selector_of_a_loop() -> None:
    loop = nloop.new_event_loop("spin")
    try:
        assert isinstance(nloop.spin_selector(loop), nloop.SpinSelector)
    finally:
        loop.close()
    plain = asyncio.new_event_loop()
    try:
        assert nloop.spin_selector(plain) is None
    finally:
        plain.close()
