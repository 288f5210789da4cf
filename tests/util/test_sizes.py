"""netcoll.sizes: the one size grammar, and every command speaking it the same way."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from netcoll.sizes import format_size, parse_size, size_error
from tests.support import REPO

GOOD = [
    ("4", 4),
    ("0", 0),
    ("4096", 4096),
    ("4K", 4096),
    ("4k", 4096),
    ("4KiB", 4096),
    ("4KB", 4000),
    ("4kb", 4000),
    ("64M", 64 << 20),
    ("64MiB", 64 << 20),
    ("64MB", 64_000_000),
    ("12MB", 12_000_000),
    ("1.5GB", 1_500_000_000),
    ("2TB", 2 * 10**12),
    ("1G", 1 << 30),
    ("1GiB", 1 << 30),
    ("2T", 2 << 40),
    ("16B", 16),
    (" 2 M ", 2 << 20),
    ("1.5M", 3 << 19),
    ("1.5K", 1536),
    ("0.5GiB", 1 << 29),
    ("1.25 KiB", 1280),
    ("3.0", 3),
    (8, 8),
    (0, 0),
    (4096.0, 4096),
]
BAD = [
    "",
    "K",
    "B",
    "4X",
    "-4",
    "4iB",
    "4Ki",
    "M4",
    "4 MB extra",
    "lots",
    "1e3",
    "1,5M",
    "0x10",
    ".5M",
    "1.",
    "1.5",
    "0.1K",
    "4 K i B",
]


@pytest.mark.parametrize("text, n", GOOD)
def test_parse_size(text: str | int | float, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", BAD)
def test_parse_size_rejects_with_one_message(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_size(text)
    message = str(info.value)
    assert message.startswith(f"not a size: {text!r}")
    assert message.endswith(size_error(text).rpartition(" (")[2])  # the accepted forms, and how units count
    assert "powers of 1024" in message and "powers of 1000" in message


@pytest.mark.parametrize("value", [True, False, -1, 1.5, float("nan"), float("inf")])
def test_parse_size_rejects_bad_numbers(value: float) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(value)


def test_iec_units_and_bare_letters_are_powers_of_1024_si_units_of_1000() -> None:
    """``12MB`` means what it means everywhere else (12 000 000 bytes); ``MiB`` and,
    as in nccl-tests, a bare ``M`` are 1024**2 (issue 38)."""
    for unit, power in (("K", 1), ("M", 2), ("G", 3), ("T", 4)):
        assert parse_size(f"1{unit}") == parse_size(f"1{unit}iB") == 1024**power
        assert parse_size(f"1{unit}B") == parse_size(f"1{unit.lower()}b") == 1000**power


def test_format_size() -> None:
    assert format_size(4) == "4 B" and format_size(65536) == "64 KiB" and format_size(64 << 20) == "64 MiB"
    assert format_size(1000) == "1 KB" and format_size(3 << 19) == "1.5 MiB" and format_size(1152) == "1.125 KiB"
    assert format_size(12_000_000) == "12 MB" and format_size(1001) == "1001 B"
    assert format_size(1_500_000_000) == "1.5 GB" and format_size(1_048_572) == "1048572 B"
    assert format_size(1048572) == "1048572 B"  # never a rounded "1024 KiB"
    assert format_size(1 << 40) == "1 TiB" and format_size(None) == "-"


@pytest.mark.parametrize(
    "n",
    [0, 1, 4, 1000, 1001, 1_000_001, 1024, 1536, 1152, 65536, 3 << 19, 1048572, 12_000_000, 5 << 30, 1 << 40, 10**12],
)
def test_format_size_round_trips(n: int) -> None:
    assert parse_size(format_size(n)) == n


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-m", "netcoll", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_submit_up_and_bench_take_the_same_sizes_in_process() -> None:
    """The flags parse with one function: 1.5M is 1572864 bytes in every command."""
    import argparse

    from netcoll.bench import add_arguments
    from netcoll.cli import build_parser

    ns = build_parser().parse_args(["submit", "all_reduce", "--size", "1.5M"])
    assert ns.size == 3 << 19
    ns = build_parser().parse_args(["up", "--size", "1.5M"])
    assert ns.size == 3 << 19
    bench = argparse.ArgumentParser()
    add_arguments(bench)
    ns = bench.parse_args(["-b", "1.5M", "-e", "1.5M", "--segment-bytes", "1.5M"])
    assert ns.minbytes == ns.maxbytes == ns.segment_bytes == 3 << 19


@pytest.mark.parametrize("bad", ["lots", "1.5", "4Ki"])
def test_submit_and_bench_reject_a_bad_size_with_the_same_message(bad: str) -> None:
    submit, bench = _run("submit", "all_reduce", "--size", bad), _run("bench", "-b", bad)
    for proc in (submit, bench):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        with pytest.raises(ValueError) as info:
            parse_size(bad)
        assert str(info.value) in lines[0], (lines[0], str(info.value))


def test_a_size_over_a_limit_is_said_in_units_naming_the_setting() -> None:
    """``--size 40G``: "exceeds the limit of 16 GiB (max_job_bytes: NETCOLL_LIMIT_MAX_JOB_BYTES
    raises it ...)", never "of 17179869184" (issue 38)."""
    from netcoll.limits import exceeded
    from netcoll.service.jobs import JobSpec

    with pytest.raises(ValueError) as info:
        JobSpec(op="all_reduce", size=40 << 30)
    message = str(info.value)
    assert "a job of 40 GiB per rank exceeds the limit of 16 GiB" in message
    assert "NETCOLL_LIMIT_MAX_JOB_BYTES raises it" in message and "17179869184" not in message
    assert exceeded("a deadline of 90000s", "max_deadline_s", 86400.0) == (
        "a deadline of 90000s exceeds the limit of 86400 (max_deadline_s: NETCOLL_LIMIT_MAX_DEADLINE_S raises it)"
    )


def test_submit_reads_mb_as_megabytes() -> None:
    from netcoll.cli import build_parser

    assert build_parser().parse_args(["submit", "all_reduce", "--size", "12MB"]).size == 12_000_000
    assert build_parser().parse_args(["submit", "all_reduce", "--size", "12MiB"]).size == 12 << 20
