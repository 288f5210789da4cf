"""netcoll.loop: the spinning selector behaves like a selector, and the loop choice."""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading

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


def test_a_held_spin_selector_sleeps_at_once_until_every_hold_is_released(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hold()``: no polling (straight to a blocking select) until as many ``release()``s.
    A polling select is shown by its own yields: the byte it waits for is sent at its third
    ``sched_yield`` (so a descheduled test cannot have the byte there before the select
    starts); a held one gets the byte from a timer and must not yield at all."""
    yields = [0]
    real_yield = nloop.os.sched_yield
    a, b = socket.socketpair()

    def counting() -> None:
        yields[0] += 1
        if yields[0] == 3:
            b.send(b"x")
        real_yield()

    monkeypatch.setattr(nloop.os, "sched_yield", counting)
    sel = nloop.SpinSelector(spin=0.05)

    def polls() -> int:
        """Select until the byte sent at its third yield arrives; the yields it took."""
        yields[0] = 0
        assert [key.fileobj for key, _ in sel.select(5.0)] == [a]
        a.recv(1)
        return yields[0]

    def sleeps() -> int:
        """Select until a byte a timer sends arrives; the yields it took."""
        yields[0] = -(1 << 30)  # (never reaches 3: the timer's byte alone ends the select)
        timer = threading.Timer(0.01, b.send, (b"x",))
        timer.start()
        try:
            assert [key.fileobj for key, _ in sel.select(5.0)] == [a]
        finally:
            timer.join()
        a.recv(1)
        return yields[0] + (1 << 30)

    try:
        sel.register(a, selectors.EVENT_READ)
        assert polls() >= 3  # polls while it waits
        sel.hold()
        sel.hold()
        assert sleeps() == 0  # sleeps at once
        sel.release()
        assert sleeps() == 0  # one hold left
        sel.release()
        assert sel.holds == 0 and polls() >= 3
    finally:
        sel.close()
        a.close()
        b.close()


def test_a_spinning_selector_never_sleeps_past_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """After spinning, only what is left of a wait is slept, never the whole wait again. With
    ``precise`` (the delay line asks for it), since epoll sleeps whole milliseconds (rounded up),
    a wait ending within one is spun to the end and a longer one is slept rounded down to whole
    milliseconds. With spinning off, epoll gets the wait."""
    sleeps: list[float] = []
    real = nloop._Base.select

    def recording(self: selectors.BaseSelector, timeout: float | None = None) -> list[object]:
        if timeout is None or timeout > 0:
            sleeps.append(-1.0 if timeout is None else timeout)
            return []
        return real(self, 0)  # type: ignore[arg-type]

    monkeypatch.setattr(nloop._Base, "select", recording)
    sel = nloop.SpinSelector(spin=300e-6)
    sel.select(0.0012)
    assert len(sleeps) <= 1 and all(0 < t <= 0.0009 for t in sleeps)  # not precise: the rest, not all again
    sleeps.clear()
    sel.precise = True
    try:
        assert sel.select(0.0008) == [] and sleeps == []  # within a millisecond: spun through
        assert sel.select(0.0012) == [] and sleeps == []  # 0.9 ms left after spinning: back to the loop
        sel.select(0.0035)
        assert len(sleeps) <= 1 and all(t in (0.001, 0.002, 0.003) for t in sleeps)  # whole ms, under the rest
        sleeps.clear()
        sel.spin = 0
        sel.select(0.0012)
        assert sleeps == [0.0012]
    finally:
        sel.close()


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


def test_netcoll_spin_us_sets_how_long_the_loop_polls_and_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NETCOLL_SPIN_US", raising=False)
    assert nloop.SpinSelector().spin == nloop.DEFAULT_SPIN
    assert nloop.SpinSelector(0.002).spin == 0.002  # an explicit value wins
    for raw, seconds in (("0", 0.0), ("1500", 0.0015), (" 250 ", 0.00025), (str(nloop.MAX_SPIN_US), 0.1)):
        monkeypatch.setenv("NETCOLL_SPIN_US", raw)
        assert nloop.SpinSelector().spin == pytest.approx(seconds)
    monkeypatch.setenv("NETCOLL_SPIN_US", "0")
    with nloop.SpinSelector() as sel:  # no spinning: straight to a blocking select
        a, b = socket.socketpair()
        with a, b:
            sel.register(a, selectors.EVENT_READ)
            assert sel.select(0.01) == []
    for bad in ("-5", "1e3", "1.5", "lots", "²", str(nloop.MAX_SPIN_US + 1)):
        monkeypatch.setenv("NETCOLL_SPIN_US", bad)
        with pytest.raises(ValueError, match="NETCOLL_SPIN_US"):
            nloop.new_event_loop("spin")
