"""bench/netem.py and its parts in bench/netemlib/ (issue 12, goal 4): the cost formulas and
crossover finder, the "this machine does not allow it: say so, exit 0" path, and — where the
machine allows network namespaces (root + iproute2) — a tiny real run that must leave no
namespace or process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import netem
from bench.netemlib import common, model, netns
from bench.netemlib.run import Run
from tests.support import REPO
from tests.support.env import subprocess_env

SCRIPT = Path(REPO) / "bench" / "netem.py"


def _run(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(**env),
        cwd=REPO,
        check=False,
    )


# -- pure parts ---------------------------------------------------------------------------------
def test_units() -> None:
    assert common.parse_delay("200us") == pytest.approx(200e-6)
    assert common.parse_delay("1.5ms") == pytest.approx(1.5e-3)
    assert common.parse_delay("0") == 0
    assert common.parse_rate("1gbit") == 1e9
    assert common.parse_rate("125mbps") == 1e9  # tc: bps = bytes per second
    assert common.tc_time(200e-6) == "200us" and common.tc_rate(1e9) == "1000000000bit"
    for bad in ("fast", "2s"):
        with pytest.raises(Exception, match="delay"):
            common.parse_delay(bad)


def test_cost_terms_follow_the_algorithm_headers() -> None:
    n = 1 << 20
    assert model.cost_terms("all_reduce", "ring", n, 4) == (6, pytest.approx(1.5 * n))
    assert model.cost_terms("all_reduce", "doubling", n, 4) == (2, 2 * n)
    assert model.cost_terms("all_reduce", "doubling", n, 3) == (3, 3 * n)  # 1 round + fold in/out
    assert model.cost_terms("all_reduce", "allpairs", n, 4) == (1, 3 * n)
    assert model.cost_terms("all_reduce", "tree", n, 4) == (4, 4 * n)
    assert model.cost_terms("all_reduce", "halving", n, 4) == (4, pytest.approx(1.5 * n))
    assert model.cost_terms("all_gather", "doubling", n, 4) == (2, pytest.approx(0.75 * n))
    assert model.cost_terms("broadcast", "tree", n, 4) == (2, 2 * n)
    with pytest.raises(ValueError):
        model.cost_terms("all_to_all", "pairwise", n, 4)


def test_model_crossovers() -> None:
    # latency-bound doubling against bandwidth-optimal ring: a crossover the model must place
    m = model.Model(alpha=100e-6, beta=8e-9, p=4)
    sizes = [4 << (2 * i) for i in range(12)]
    curves = {a: [(s, m.seconds("all_reduce", a, s)) for s in sizes] for a in ("ring", "doubling")}
    (cx,) = model.crossovers(curves)
    assert (cx["from"], cx["to"]) == ("doubling", "ring")
    # 2a + 2Nb = 6a + 1.5Nb  <=>  N = 8a / b = 100 KB
    assert cx["between"][0] < 100_000 < cx["between"][1]
    assert 50_000 < cx["at"] < 200_000
    assert model.crossovers({"ring": curves["ring"]}) == []
    # netcoll/selection/cost.py, where it exists, gives the same two-parameter predictions
    cost = model.load_cost_module(str(REPO))
    if cost is not None:
        mc = model.Model(alpha=100e-6, beta=8e-9, p=4, cost=cost)
        for s in (4, 1 << 16, 1 << 20):
            for a in ("ring", "doubling", "allpairs"):
                assert mc.seconds("all_reduce", a, s) == pytest.approx(m.seconds("all_reduce", a, s), rel=0.05)


@pytest.mark.parametrize("kind", ["netem", "line", "tbf"])
def test_shaping_commands(kind: str, tmp_path: Path) -> None:
    """The qdiscs each rank link gets (the netem path cannot run on a kernel without netem, so
    its commands are checked here): delay and rate on the rank side, the rate on the switch side;
    without netem the rate by tbf, and the delay by the daemons' delay line unless --shape tbf."""
    shape = ["--shape", "tbf"] if kind == "tbf" else []
    args = netem.build_parser().parse_args(["--ranks", "2", "--delay", "200us", "--rate", "1gbit", *shape])
    caps = {"ip": "ip", "tc": "tc", "netem": kind == "netem", "tbf": True, "netem_error": "unknown qdisc"}
    run = Run(args, caps)
    try:
        calls: list[tuple[str, ...]] = []

        def ns(name: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
            calls.append((name, *argv))
            return subprocess.CompletedProcess(list(argv), 0, "qdisc shown", "")

        run.host.ns = ns  # type: ignore[method-assign]
        netns.shape(run)
    finally:
        shutil.rmtree(run.tmp, ignore_errors=True)
    adds = [c for c in calls if c[1:4] == ("tc", "qdisc", "add")]
    assert len(adds) == 4  # 2 ranks x (rank side, switch side)
    rank_side = next(c for c in adds if c[0] == run.rns[0])
    switch_side = next(c for c in adds if c[0] == run.sw and "p0" in c)
    if kind == "netem":
        assert rank_side[4:11] == ("dev", "eth0", "root", "netem", "delay", "200us", "rate")
        assert "1000000000bit" in rank_side and "delay" not in switch_side and "rate" in switch_side
        assert run.delay_applied == pytest.approx(200e-6)
    else:
        assert rank_side[4:9] == ("dev", "eth0", "root", "tbf", "rate") and "1000000000bit" in rank_side
        assert switch_side[4:9] == ("dev", "p0", "root", "tbf", "rate")
        assert run.result["notes"]
    if kind == "line":
        assert run.shaping == "tbf+line" and run.delay_applied == run.line_delay == pytest.approx(200e-6)
    elif kind == "tbf":
        assert run.shaping == "tbf" and run.delay_applied == 0 and run.line_delay == 0
    else:
        assert run.line_delay == 0


# -- the machine does not allow it: a message and exit 0 ------------------------------------------
def test_missing_ip_says_so_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = _run("--ip", str(tmp_path / "no-such-ip"), "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "skipped" in res.stdout and "no-such-ip" in res.stdout and "exiting 0" in res.stdout
    assert not out.exists()
    # the same through the environment variable
    res = _run("--json", str(out), NETCOLL_NETEM_IP=str(tmp_path / "no-such-ip"))
    assert res.returncode == 0 and "skipped" in res.stdout and not out.exists()


def test_unprivileged_says_so_and_exits_0(tmp_path: Path) -> None:
    """Not root: namespaces are tried, refused by the kernel, and the script says so and exits 0.
    (As root the test drops to uid/gid 65534 for the child; the skip path needs only the stdlib
    and the checkout's ``bench`` package, found through ``PYTHONPATH``.)"""
    if not sys.platform.startswith("linux") or shutil.which("ip") is None:
        pytest.skip("needs Linux with iproute2 to reach the namespace attempt")
    python, preexec = sys.executable, None
    if os.geteuid() == 0:
        if not os.access(sys.executable, os.X_OK) or Path(sys.executable).resolve().is_relative_to("/root"):
            python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable

        def preexec() -> None:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)

    os.chmod(tmp_path, 0o777)
    try:
        res = subprocess.run(
            [python, str(SCRIPT), "--json", str(tmp_path / "r.json")],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                "LANG": "C.UTF-8",
                "PYTHONPATH": str(REPO),
            },
            cwd=tmp_path,
            preexec_fn=preexec,
            check=False,
        )
    except PermissionError as exc:  # the interpreter itself is out of the unprivileged user's reach
        pytest.skip(f"no Python the unprivileged user may run: {exc}")
    if res.returncode != 0 and "Permission denied" in res.stderr:
        pytest.skip(f"no Python the unprivileged user may run: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    assert "skipped" in res.stdout and "not root" in res.stdout and "exiting 0" in res.stdout
    assert not (tmp_path / "r.json").exists()


def test_bad_subnet_is_refused() -> None:
    res = _run("--subnet", "8.8.8")
    assert res.returncode == 2 and "private" in res.stderr


# -- a real run, where namespaces are allowed -----------------------------------------------------
def _namespaces_allowed() -> str | None:
    """None if this machine allows the run; else why not."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "iproute2 (ip, tc) is not installed"
    res = _run("--check", timeout=30)
    if res.returncode != 0 or "allows: netns" not in res.stdout:
        return f"the machine does not allow namespaces here: {res.stdout.strip()} {res.stderr.strip()}"
    return None


@pytest.mark.slow
@pytest.mark.tcp
@pytest.mark.timeout(200)
def test_tiny_run_writes_results_and_leaves_nothing(tmp_path: Path) -> None:
    why = _namespaces_allowed()
    if why:
        pytest.skip(why)
    out = tmp_path / "netem.json"
    idle = Path("/proc/sys/net/ipv4/tcp_slow_start_after_idle")
    host_idle = idle.read_text()
    res = _run(
        "--ranks", "2", "-b", "4", "-e", "64K", "-f", "16384", "-n", "2", "-w", "1", "--calib-iters", "20",
        "--algorithms", "doubling,ring,auto", "--limit", "100", "--json", str(out), "--no-plot",
        "--idle-restart", "off", "--statistic", "median",
        timeout=150,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(out.read_text())
    assert doc["tcp_slow_start_after_idle"] == "0" and idle.read_text() == host_idle  # the namespaces' own
    assert doc["config"]["statistic"] == "median"
    assert doc["ranks"] == 2 and doc["shaping"] in ("netem", "tbf+line")
    assert doc["delay_applied_s"] == pytest.approx(200e-6)
    if doc["shaping"] == "tbf+line":  # the kernel has no netem: the daemons delay what they receive, and it says so
        assert "delay line in each rank daemon" in res.stdout
        assert doc["calibration_veth"]["line_delay_s"] == pytest.approx(200e-6)
    assert [(s["op"], s["algorithm"]) for s in doc["sweeps"]] == [
        ("all_reduce", "doubling"),
        ("all_reduce", "ring"),
        ("all_reduce", "auto"),
    ]
    for sweep in doc["sweeps"]:
        assert [r["size"] for r in sweep["rows"]] == [4, 65536]
        for r in sweep["rows"]:
            assert r["wrong"] == 0 and r["time_us"] > 0 and r["predicted_us"] > 0
    assert doc["calibration"]["overhead_per_message_s"] > 0
    assert "all_reduce" in doc["crossovers"]
    assert doc["members"] == ["10.213.7.10", "10.213.7.11"]
    # nothing left: no namespace of this run, no process it started
    assert doc["cleanup"] == {"ok": True, "problems": [], "namespaces_deleted": True}
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert doc["prefix"].startswith("ncX-") and doc["prefix"] not in listed
    assert doc["pids"]
    for pid in doc["pids"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_auto_against_the_best_fixed_algorithm() -> None:
    """The report compares auto with the fastest fixed algorithm at each size, and names what
    auto ran over the repeats."""
    from bench.netemlib import report

    def sweep(alg: str, times: list[float], ran: list[list[str]] | None = None) -> dict[str, object]:
        rows: list[dict[str, object]] = [{"size": s, "time_us": t} for s, t in zip((4, 1024), times, strict=True)]
        for row, names in zip(rows, ran or [[alg]] * 2, strict=True):
            row["ran"] = names
        return {"op": "all_reduce", "algorithm": alg, "rows": rows}

    result = {
        "ranks": 4,
        "auto_by": "fixed table",
        "sweeps": [
            sweep("ring", [300.0, 100.0]),
            sweep("tree", [100.0, 200.0]),
            sweep("auto", [105.0, 150.0], [["auto:tree/64 KiB"], ["auto:tree", "auto:ring", "auto:tree"]]),
        ],
    }
    cells = report.auto_against_best(result)["all_reduce"]
    want = [(4, "tree", "tree/64 KiB"), (1024, "ring", "tree|ring")]
    assert [(c["size"], c["best"], c["ran"]) for c in cells] == want
    assert [round(c["ratio"], 2) for c in cells] == [1.05, 1.5]
    text = report.text_table(result)
    assert "at 1 of 2 sizes; worst 1.50x at 1 KiB (tree|ring against ring)" in text
