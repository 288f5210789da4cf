"""bench/int8kernels.py: every path it measures gives numpy's bytes and bits (small size)."""

from __future__ import annotations

import pytest

from bench import int8kernels


def test_the_paths_agree(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("numba")
    int8kernels.main(["--size", str(3 * 512 + 7), "--reps", "1"])
    out = capsys.readouterr().out
    assert "numba: True" in out and "encode" in out
    assert out.count("numpy's: True") == len(int8kernels.PATHS) and "False" not in out
