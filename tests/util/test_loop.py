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


def test_a_crowded_host_does_not_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nloop, "CPUS", 2)
    monkeypatch.setattr(nloop, "_crowded", False)
    assert nloop.note_local_ranks(4) is False and not nloop.crowded()  # 2 ranks per CPU: polling helps
    assert nloop.note_local_ranks(5) is True and nloop.crowded()
    sel = nloop.SpinSelector(spin=0.5)
    polls = 0
    real = nloop._Base.select

    def counting(self: nloop.SpinSelector, timeout: float | None = None) -> list[object]:
        nonlocal polls
        polls += 1
        return real(self, timeout)  # type: ignore[arg-type]

    monkeypatch.setattr(nloop._Base, "select", counting)
    try:
        assert sel.select(0.01) == []
        assert polls == 2  # one look, then straight to sleep: no spinning
        nloop.note_local_ranks(1)
        polls = 0
        assert sel.select(0.01) == []
        assert polls > 2  # spins (polls) before sleeping
    finally:
        sel.close()
