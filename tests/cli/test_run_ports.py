"""``netcoll run`` picks MASTER_PORT below the kernel's ephemeral range, where no
client's source port can take it before rank 0's store listens there."""

from __future__ import annotations

from pathlib import Path

from netcoll.cli import ports as run


def test_master_port_is_below_the_ephemeral_range() -> None:
    low = run._ephemeral_low()
    ports = {run.free_port("127.0.0.1") for _ in range(20)}
    assert all(run.FREE_PORT_FLOOR <= p < low for p in ports), (ports, low)


def test_ephemeral_low_falls_back_when_unreadable(tmp_path: Path) -> None:
    assert run._ephemeral_low(str(tmp_path / "missing")) == 32768
    bad = tmp_path / "range"
    bad.write_text("junk\n")
    assert run._ephemeral_low(str(bad)) == 32768
    bad.write_text("40000\t60999\n")
    assert run._ephemeral_low(str(bad)) == 40000
