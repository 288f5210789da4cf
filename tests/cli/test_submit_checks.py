"""``netcoll submit`` catches mistakes before anything is queued (exit 2, one line, the
choices, "did you mean"), and rank daemons with default settings share a host (ports
chosen at bind time and advertised). Real processes, as test_cli.py."""

from __future__ import annotations

import concurrent.futures
import json
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from netcoll.algorithms import ALGORITHMS
from netcoll.collectives import NAMES
from tests.cli.test_cli import Cluster, one_error_line, run_cli

pytestmark = [
    pytest.mark.tcp,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="binds 127.0.0.x addresses (Linux loopback)"),
]


@pytest.fixture
def nobody() -> str:
    """HOST:PORT of a port nobody listens on: a submit that got that far would exit 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_bad_submits_exit_2_before_connecting_with_the_choices(nobody: str) -> None:
    cases = (
        (["all_reducex"], "invalid choice: 'all_reducex'; did you mean 'all_reduce'? choose from all_reduce, "),
        (["all_reduce", "--algorithm", "rign"], "has no algorithm 'rign'; did you mean 'ring'? choose from auto, ring"),
        (["broadcast", "--algorithm", "halving"], "broadcast has no algorithm 'halving'; choose from auto, "),
        (["all_reduce", "--dtype", "float33"], "unknown dtype 'float33'; did you mean 'float32'? choose from bool,"),
        (["all_reduce", "--op", "summ"], "invalid choice: 'summ'; did you mean 'sum'? choose from sum, prod"),
        (["broadcast", "--root", "4", "--world-size", "4"], "root 4 is out of range for 4 ranks (valid roots are 0"),
        (["all_reduce", "--size", "6"], "size 6 is not a whole number of float32 elements"),
        (["all_reduce", "--size", "lots"], "not a size: 'lots'"),
        (["all_reduce", "--dtype", "int32", "--op", "avg"], "avg"),
    )
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda case: run_cli("submit", *case[0], "--coordinator", nobody), cases))
    for (args, needle), proc in zip(cases, procs, strict=True):
        assert proc.returncode == 2, (args, proc.stderr)
        assert needle in one_error_line(proc), (args, proc.stderr)


def test_help_lists_each_collectives_own_algorithms() -> None:
    proc = run_cli("submit", "--help")
    assert proc.returncode == 0
    listed = {}
    for line in proc.stdout.split("algorithms (--algorithm")[1].splitlines()[1:]:
        words = line.split()
        if words and words[0] in NAMES:
            listed[words[0]] = words[1:]
    assert listed == {name: ["auto", *ALGORITHMS[name]] for name in NAMES}


@pytest.fixture
def small_cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        c.start_coordinator()
        yield c
    finally:
        c.close()


def test_two_default_daemons_share_a_host_and_roots_are_checked(small_cluster: Cluster) -> None:
    """`netcoll rank` with no --port / --http-port, twice on one host (127.0.0.9): both bind,
    advertise what they bound, and run a job together; status shows their HTTP ports."""
    c = small_cluster
    for i in range(2):
        rank = c._start(f"rank-default-{i}", ["rank", "--coordinator", c.address, "--host", "127.0.0.9"])
        c.ranks.append(rank)
    c.wait_members(2)
    listens = {r.info["listen"] for r in c.ranks}
    assert len(listens) == 2 and all(a.startswith("127.0.0.9:") for a in listens), listens
    status = c.cli("status", "--json")
    members = json.loads(status.stdout)["members"]
    assert {m["address"] for m in members} == listens
    https = {r.info["http"] for r in c.ranks}
    assert {f"http://127.0.0.9:{m['http_port']}" for m in members} == https and len(https) == 2
    text = c.cli("status").stdout
    assert all(str(m["http_port"]) in text for m in members), text
    proc, rec = c.submit_json("all_reduce", "--size", "64KiB", "--iters", "2")
    assert proc.returncode == 0 and rec["state"] == "succeeded" and rec["world_size"] == 2, (rec, c.logs())
    assert rec["time_s"] > 0 and set(rec["rank_time_s"]) == {"0", "1"}
    assert "time_us" not in rec and "rank_time_us" not in rec
    assert all(re.fullmatch(r"127\.0\.0\.9:\d+", r["address"]) for r in rec["ranks"])
    # a root the 2 ready daemons do not have: exit 2 before anything is queued
    before = json.loads(c.cli("status", "--json").stdout)["jobs"]
    bad = c.cli("submit", "broadcast", "--root", "2")
    assert bad.returncode == 2, bad.stderr
    assert "root 2 is out of range for 2 ranks (valid roots are 0..1): 2 rank daemons ready" in one_error_line(bad)
    assert json.loads(c.cli("status", "--json").stdout)["jobs"] == before
    text = c.cli("submit", "broadcast", "--root", "1", "--no-progress").stdout
    assert re.search(r"root 1, algorithm auto \(ran \w+\), 1 iteration\n", text) and "1 iterations" not in text, text


def test_rank_defaults_pick_free_ports() -> None:
    from netcoll.config import RankConfig

    cfg = RankConfig.load({}, {})
    assert (cfg.port, cfg.http_port) == (0, 0)
    pinned = RankConfig.load({"http_port": "29511"}, {"NETCOLL_PORT": "29500"})  # explicit ports are kept
    assert (pinned.port, pinned.http_port) == (29500, 29511)
