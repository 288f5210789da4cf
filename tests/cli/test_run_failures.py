"""``netcoll run`` when things go wrong (issue 38, item 3): it leads with the rank that
failed first and its own error, gives every other rank one line (no tracebacks through
netcoll), names a rank that never arrived rather than a victim that timed out, checks
the script once, and says where its coordinator is and how to watch it with
``netcoll status``. Real processes, as test_run.py."""

from __future__ import annotations

import re
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from netcoll.cli import main
from tests.cli.test_run import finish, launcher

pytestmark = [
    pytest.mark.tcp,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="127.0.0.x addresses (Linux loopback)"),
]

RAISES = textwrap.dedent(
    """
    import numpy as np
    import netcoll.sync

    with netcoll.sync.connect() as comm:
        comm.all_reduce(np.ones(4, np.float32))
        if comm.rank == 1:
            raise ValueError("rank 1 is broken")
        comm.all_reduce(np.ones(4, np.float32))
    """
)

NEVER_CALLS = textwrap.dedent(
    """
    import time
    import numpy as np
    import netcoll.sync

    with netcoll.sync.connect() as comm:
        if comm.rank == 2:
            time.sleep(120)  # never calls: the launcher stops it
        comm.all_reduce(np.ones(4, np.float32), timeout=2)
    """
)

WAITS = textwrap.dedent(
    """
    import time
    import netcoll.sync

    with netcoll.sync.connect() as comm:
        comm.barrier()
        print("ready", flush=True)
        time.sleep(120)  # until the test is done looking
    """
)


def said(err: str) -> list[str]:
    """The launcher's lines about the ranks (not the coordinator's own warnings it passes on)."""
    lines = [line.removeprefix("netcoll run: ") for line in err.splitlines() if line.startswith("netcoll run: ")]
    return [line for line in lines if line.startswith(("coordinator ", "rank ", "ranks "))]


def test_the_rank_that_raised_leads_and_the_others_get_one_line_each(tmp_path: Path) -> None:
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    proc = launcher("-n", "3", str(script))
    _, err = finish(proc)
    assert proc.returncode == 1, err
    lines = said(err)
    assert lines[0].startswith("coordinator 127.0.0.1:")
    # the others still running when the launcher sees rank 1 end: both, or one already ended of its failure
    leads = r"rank 1 failed: ValueError: rank 1 is broken; stopping the other [12] rank\(s\)"
    assert re.fullmatch(leads, lines[1]), lines
    victims = [line for line in lines[2:-1] if re.match(r"rank \d: ", line)]
    assert sorted(line[:7] for line in victims) == ["rank 0:", "rank 2:"], lines  # one line each
    assert all("raises.py:9" in line and "rank 1" in line for line in victims), victims
    assert lines[-1] == "rank 1 failed: ValueError: rank 1 is broken; exit status 1", lines
    assert err.count("Traceback (most recent call last)") == 1 and "[rank 1] ValueError: rank 1 is broken" in err
    for internal in ("netcoll/sync/", "concurrent/futures", "engine.py", "algorithms/"):
        assert internal not in err, err
    assert "failed: all_reduce #" not in err  # no message repeats its operation


def test_a_rank_that_never_calls_is_named_not_a_victim_that_timed_out(tmp_path: Path) -> None:
    script = tmp_path / "never.py"
    script.write_text(NEVER_CALLS)
    proc = launcher("-n", "3", "--grace", "2", str(script))
    _, err = finish(proc)
    assert proc.returncode == 1, err
    lines = said(err)
    cause = "rank 2 never arrived (ranks 0, 1 timed out waiting for it in all_reduce #0)"
    assert lines[1] == f"{cause}; stopping the other 1 rank(s)", lines
    assert lines[-1] == f"{cause}; exit status 1", lines
    assert "Traceback" not in err, err


@pytest.mark.parametrize(
    ("target", "says"),
    [
        (["nosuch.py"], "no such script: 'nosuch.py'"),
        (["-m", "nosuch_module_xyz"], "no module named 'nosuch_module_xyz'"),
        (["-m", "json"], "'json' is a package without __main__"),
    ],
)
def test_a_script_that_cannot_run_is_said_once(tmp_path: Path, target: list[str], says: str) -> None:
    proc = launcher("-n", "4", *target, cwd=tmp_path)
    out, err = finish(proc)
    assert proc.returncode == 2 and out == "", err
    assert err.count("\n") == 1 and says in err and "[rank" not in err, err


def test_netcoll_status_watches_the_launchers_coordinator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "waits.py"
    script.write_text(WAITS)
    proc = launcher("-n", "2", "--grace", "2", str(script))
    try:
        assert proc.stderr is not None and proc.stdout is not None
        first = proc.stderr.readline()
        m = re.fullmatch(r"netcoll run: coordinator (\S+); to see the ranks and what each waits for: (.+)\n", first)
        assert m, first
        watch = m.group(2).split()
        assert watch[:4] == ["netcoll", "status", "--coordinator", m.group(1)] and watch[4] == "--client-token-file"
        for _ in range(2):
            assert proc.stdout.readline().endswith("ready\n")  # both ranks joined
        assert main(watch[1:]) == 0
        shown = capsys.readouterr().out
        assert "no job service" in shown and "group 'default': 2 of 2 ranks, running" in shown, shown
        assert len(re.findall(r"^\s+[01]\s+\S+\s+127\.0\.0\.1:\d+\s+ok$", shown, re.MULTILINE)) == 2, shown
        assert main([*watch[1:], "--json"]) == 0
        assert '"rendezvous_only": true' in capsys.readouterr().out
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc)
