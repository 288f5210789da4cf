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
