"""The ``netcoll`` command line end to end, with real processes.

One ``netcoll coordinator`` (with a token) and rank daemons started as
``netcoll rank --host 127.0.0.<i>`` (each bound to, and dialling the
coordinator from, its own loopback address, standing in for hosts); jobs go
through ``netcoll submit`` and through ``netcoll.Client``. Every process is
started through ``sys.executable -m netcoll`` and is killed in the fixture's
teardown, whatever happens. (The same service in one event loop:
test_service.py.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import netcoll
from netcoll.collectives import NAMES as OPS
from netcoll.config import ConfigError, RankConfig, SubmitConfig, UpConfig
from tests.support import REPO
from tests.support.env import subprocess_env as base_env

pytestmark = [
    pytest.mark.tcp,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="binds 127.0.0.x addresses besides 127.0.0.1 (Linux loopback)"
    ),
]

TOKEN = "cli-test-" + secrets.token_hex(8)
#: the tests on the module's one cluster: under pytest-xdist with ``--dist loadgroup`` (the
#: README's command) they run on one worker, so the cluster starts once, not once per worker
ON_THE_CLUSTER = pytest.mark.xdist_group("cli-cluster")


def netcoll_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "netcoll", *args]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        netcoll_cmd(*args),
        env=env or base_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """stderr must be exactly one line, no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("netcoll"), lines
    return lines[0]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, sample: str) -> float | None:
    """The value of ``sample`` (a metric name with its labels) in exposition ``text``."""
    for line in text.splitlines():
        if not line.startswith("#") and line.rpartition(" ")[0] == sample:
            return float(line.rpartition(" ")[2])
    return None


_SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? (?:[-+]?[0-9.eE+-]+|NaN|[+-]Inf)$'
)


def check_exposition(text: str) -> None:
    """Prometheus text format 0.0.4: HELP and TYPE before each family, well-formed samples."""
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            assert name not in typed, f"family {name} declared twice"
            typed.add(name)
        elif not line.startswith("#"):
            assert _SAMPLE.match(line), line
            assert re.split(r"[{ ]", line, maxsplit=1)[0] in typed, f"sample before its TYPE: {line}"
    assert text.endswith("\n")


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"{proc.args} did not start within {timeout}s:\n{log.read_text()[-3000:]}")


class Proc:
    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path, info: dict[str, Any]) -> None:
        self.name, self.popen, self.log, self.info = name, popen, log, info

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 2000) -> str:
        return f"--- {self.name} ---\n{self.log.read_text(errors='replace')[-n:]}"


class Cluster:
    """A coordinator process and rank daemon processes; everything killed in close()."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = base_env(NETCOLL_TOKEN=TOKEN)
        self.procs: list[Proc] = []
        self.ranks: list[Proc] = []
        self.next_host = 2
        self.coord: Proc | None = None
        self.address = ""
        self.http = ""

    def _start(self, name: str, args: list[str]) -> Proc:
        log = self.tmp / f"{name}.log"
        ready = self.tmp / f"{name}.json"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                netcoll_cmd(*args, "--ready-file", str(ready)),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        proc = Proc(name, popen, log, {})
        self.procs.append(proc)
        proc.info = wait_for_file(ready, popen, log)
        return proc

    def start_coordinator(self) -> None:
        self.coord = self._start(
            "coordinator", ["coordinator", "--host", "127.0.0.1", "--port", "0", "--http-port", "0"]
        )
        self.address, self.http = self.coord.info["address"], self.coord.info["http"]

    def start_rank(self) -> Proc:
        host = f"127.0.0.{self.next_host}"
        self.next_host += 1
        proc = self._start(
            f"rank-{host}", ["rank", "--coordinator", self.address, "--host", host, "--port", "0", "--http-port", "0"]
        )
        self.ranks.append(proc)
        return proc

    def alive_ranks(self) -> list[Proc]:
        return [r for r in self.ranks if r.alive]

    def members_metric(self) -> int:
        status, text = http_get(f"{self.http}/metrics")
        value = metric(text, "netcoll_members")
        assert status == 200 and value is not None, text
        return int(value)

    def wait_members(self, n: int, timeout: float = 20.0) -> None:
        """Until n daemons are registered at the coordinator and every live one says it is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alive = self.alive_ranks()
            if (
                self.members_metric() == n
                and len(alive) == n
                and all(http_get(f"{r.info['http']}/readyz")[0] == 200 for r in alive)
            ):
                return
            time.sleep(0.1)
        raise AssertionError(f"want {n} members, /metrics says {self.members_metric()}\n" + self.logs())

    def ensure(self, n: int = 4) -> None:
        while len(self.alive_ranks()) < n:
            self.start_rank()
        self.wait_members(n)

    def rank_of_member(self, member_id: str) -> Proc:
        return next(r for r in self.ranks if r.info["member_id"] == member_id)

    def cli(self, *args: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, "--coordinator", self.address, env=self.env, timeout=timeout)

    def submit_json(self, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        proc = self.cli("submit", *args, "--json")
        lines = proc.stdout.strip().splitlines()
        assert len(lines) == 1, (proc.stdout, proc.stderr)
        return proc, json.loads(lines[0])

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.procs)

    def close(self) -> None:
        for p in self.procs:
            if p.alive:
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cli-cluster"))
    try:
        c.start_coordinator()
        c.ensure(4)
        yield c
    finally:
        c.close()


# -- no cluster needed -------------------------------------------------------------------------
def test_usage_errors_are_one_line() -> None:
    assert run_cli("--help").returncode == 0
    ver = run_cli("--version")
    assert ver.returncode == 0 and netcoll.__version__ in ver.stdout
    cases = (
        (["frobnicate"], "invalid choice"),
        (["submit", "all_reducex"], "invalid choice"),
        (["submit", "all_reduce", "--iters", "many"], "--iters"),
        (["submit", "all_reduce", "--size", "lots"], "--size"),
        (["submit", "all_reduce", "--dtype", "float33"], "float33"),
        (["submit", "all_reduce", "--dtype", "int32", "--op", "avg"], "avg"),
        (["submit", "all_reduce", "--size", "64GiB"], "exceeds"),
        (["submit", "all_reduce", "--size", "0.1K"], "not a whole number"),
        (["submit", "all_reduce", "--algorithm", "pairwise"], "has no algorithm 'pairwise'"),
        (["up", "--size", "lots"], "not a size: 'lots'"),
        (["rank", "--port", "abc"], "--port"),
        (["coordinator", "--http-port", "70000"], "--http-port"),
    )
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda case: run_cli(*case[0]), cases))
    for (args, needle), proc in zip(cases, procs, strict=True):
        assert proc.returncode == 2, (args, proc.stderr)
        assert needle in one_error_line(proc), (args, proc.stderr)
    proc = run_cli("coordinator", env=base_env(NETCOLL_PORT="tcp://10.0.0.7:29400"))
    assert proc.returncode == 2 and "NETCOLL_PORT" in one_error_line(proc)


def test_unreachable_coordinator_is_one_clear_line() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = run_cli("status", "--coordinator", f"127.0.0.1:{port}")
    assert proc.returncode == 1
    assert (
        one_error_line(proc) == f"netcoll status: cannot reach the coordinator at 127.0.0.1:{port}: connection refused"
    )
    proc = run_cli("submit", "barrier", env=base_env(NETCOLL_COORDINATOR=f"127.0.0.1:{port}"))
    assert proc.returncode == 1 and f"127.0.0.1:{port}" in one_error_line(proc)


def test_config_flags_win_over_environment() -> None:
    env = {
        "NETCOLL_PORT": "1111",
        "NETCOLL_HTTP_PORT": "off",
        "NETCOLL_RANK_HINT": "3",
        "NETCOLL_COORDINATOR": "coord",
        "NETCOLL_LOG_LEVEL": "WARN",
        "NETCOLL_TOKEN": "",
        "NETCOLL_ADVERTISE_HOST": "10.1.2.3",
        "NETCOLL_HOST": "10.1.2.3",
    }
    cfg = RankConfig.load({"port": "2222", "rank_hint": None}, env)
    assert (cfg.port, cfg.http_port, cfg.rank_hint, cfg.coordinator, cfg.log_level, cfg.token) == (
        2222,
        None,
        3,
        "coord:29400",
        "warning",
        None,
    )
    assert cfg.advertise_host == "10.1.2.3" and cfg.local_host == "10.1.2.3"
    assert RankConfig.load({"rank_hint": "$(NETCOLL_RANK_HINT)"}, {}).rank_hint is None  # k8s left it unexpanded
    assert RankConfig.load({}, {}).local_host is None  # 0.0.0.0: dial from wherever the route says
    assert SubmitConfig.load({"op": "all_reduce", "size": "4KiB"}, {}).size == 4096
    assert SubmitConfig.load({"op": "all_reduce", "size": "1.5M"}, {}).size == 3 << 19
    assert UpConfig.load({"port": "0"}, {}).coordinator_http_port == 0
    with pytest.raises(ConfigError, match="NETCOLL_COORDINATOR"):
        RankConfig.load({}, {"NETCOLL_COORDINATOR": "a:b:c"})


@pytest.mark.parametrize(
    "argv, rc",
    [(["health", "http://127.0.0.1:9/livez", "--timeout", "0.5"], 1), (["--help"], 0), (["health", "--help"], 0)],
)
def test_health_stays_light(argv: list[str], rc: int) -> None:
    code = (
        f"import sys; from netcoll.cli import main; rc = main({argv!r}); "
        "print(rc, sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'pydantic', 'msgpack'}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=base_env(), capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.stdout.strip().splitlines()[-1] == f"{rc} []", (proc.stdout, proc.stderr)


def test_the_cli_is_a_package_of_one_module_per_command() -> None:
    import ast
    import importlib

    from netcoll import cli

    assert cli.COMMANDS == ("coordinator", "rank", "up", "run", "submit", "status", "health", "bench")
    for name in cli.COMMANDS:
        module = importlib.import_module(f"netcoll.cli.{name}")
        assert callable(module.add_parser) and callable(module.run) and module.HELP, name
    for path in (REPO / "netcoll" / "cli").glob("*.py"):  # small functions, small modules
        tree = ast.parse(path.read_text())
        assert len(path.read_text().splitlines()) <= 400, path
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None and node.end_lineno - node.lineno < 60, (path, node.name)
    scripts = (REPO / "pyproject.toml").read_text()
    assert 'netcoll = "netcoll.cli:main"' in scripts
    for module in ("netcoll", "netcoll.cli"):  # python -m netcoll and python -m netcoll.cli
        proc = subprocess.run(
            [sys.executable, "-m", module, "--version"],
            env=base_env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode == 0 and netcoll.__version__ in proc.stdout, (module, proc.stdout, proc.stderr)


def test_bench_is_wired() -> None:
    proc = run_cli("bench", "--help")
    if proc.returncode == 0:
        assert "netcoll bench" in proc.stdout
    else:  # netcoll.bench is not there (yet): a clear line, no traceback
        assert proc.returncode == 1 and "bench" in one_error_line(proc)


def test_up_demo_runs_every_collective_and_exits_0() -> None:
    proc = run_cli("up", "--ranks", "2", "--demo", "--port", "0", "--size", "64KiB", timeout=90)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    for op in OPS:
        assert any(line.split()[:2] == [op, "succeeded"] for line in proc.stdout.splitlines()), proc.stdout
    assert "demo passed" in proc.stdout and "== numpy" in proc.stdout
    assert "time/iter: the mean of each iteration's slowest rank" in proc.stdout  # what the numbers are
    assert "busbw: algbw x the collective's bus factor" in proc.stdout
    assert "netcoll up: stopped" in proc.stdout


# -- against the cluster ----------------------------------------------------------------------------
@ON_THE_CLUSTER
def test_health_endpoints_and_metrics(cluster: Cluster) -> None:
    cluster.ensure(4)
    for url in (
        f"{cluster.http}/livez",
        f"{cluster.http}/readyz",
        f"{cluster.ranks[0].info['http']}/readyz",
        cluster.http.removeprefix("http://"),
    ):
        proc = run_cli("health", url)
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", (url, proc.stdout, proc.stderr)
    proc = run_cli("health", f"{cluster.http}/nope")
    assert proc.returncode == 1 and "404" in one_error_line(proc)
    status, text = http_get(f"{cluster.http}/metrics")
    assert status == 200 and metric(text, "netcoll_members") == 4, text
    assert metric(text, 'netcoll_jobs_total{state="succeeded"}') is not None, text
    check_exposition(text)
    status, text = http_get(f"{cluster.ranks[0].info['http']}/metrics")
    assert status == 200 and metric(text, "netcoll_rank_registered") == 1, text
    check_exposition(text)
    assert metric(text, 'netcoll_rank_jobs_total{result="ok"}') is not None, text
    # garbage, oversize and half-sent requests never take the HTTP server down
    host, port = cluster.http.removeprefix("http://").rsplit(":", 1)
    for junk in (
        b"\x00\xff\xfe garbage\r\n\r\n",
        b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
        b"GET /livez HTTP/9.9\r\n\r\n",
        b"POST /readyz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
        b"GET /livez",
    ):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            reply = s.recv(4096)
        assert reply.startswith((b"HTTP/1.1 4", b"HTTP/1.1 5")), (junk[:20], reply)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"HEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\r\n\r\n"), reply  # headers, no body
    assert http_get(f"{cluster.http}/livez") == (200, "ok\n")


@ON_THE_CLUSTER
def test_every_collective_through_the_cli(cluster: Cluster) -> None:
    cluster.ensure(4)
    jobs = [[op, *(["--size", "256KiB"] if op != "barrier" else []), "--iters", "2"] for op in OPS] + [
        ["reduce", "--size", "64KiB", "--dtype", "int32", "--op", "max", "--root", "2"],
        ["broadcast", "--size", "64KiB", "--dtype", "float64", "--root", "3"],
        ["all_reduce", "--size", "64KiB", "--dtype", "bfloat16", "--op", "avg", "--warmup", "1"],
        ["scatter", "--size", "64KiB", "--dtype", "uint8", "--root", "1"],
        ["all_reduce", "--size", "16KiB", "--dtype", "int64", "--op", "bxor", "--algorithm", "ring"],
        ["all_gather", "--size", "1.5M", "--algorithm", "doubling"],  # a decimal size, as bench takes it
    ]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:  # they queue and run in order
        results = list(pool.map(lambda args: cluster.submit_json(*args), jobs))
    for args, (proc, rec) in zip(jobs, results, strict=True):
        assert proc.returncode == 0, (args, proc.stderr, rec)
        assert rec["state"] == "succeeded" and rec["error"] is None, (args, rec)
        assert rec["verified"] is (None if args[0] == "barrier" else True), (args, rec)
        assert rec["world_size"] == 4 and sorted(rec["timings"]) == ["0", "1", "2", "3"], rec
        assert all(len(t) == rec["spec"]["iters"] for t in rec["timings"].values()), rec
        assert rec["time_s"] > 0 and isinstance(rec["id"], int), rec
        if args[0] != "barrier":
            assert rec["busbw"] > 0 and rec["algbw"] > 0, rec
    assert len({rec["id"] for _, rec in results}) == len(jobs)

    human = cluster.cli("submit", "all_reduce", "--size", "128KiB", "--iters", "2")
    assert human.returncode == 0, human.stderr
    out = human.stdout
    assert "all_reduce: succeeded on 4 ranks" in out and "busbw" in out and "verified yes" in out, out
    assert sum(1 for line in out.splitlines() if line.strip().startswith(("0 ", "1 ", "2 ", "3 "))) == 4, out


@ON_THE_CLUSTER
async def test_every_collective_through_the_client(cluster: Cluster) -> None:
    await asyncio.to_thread(cluster.ensure, 4)
    n = 4
    rng = np.random.default_rng(7)
    per_rank = [rng.integers(-8, 9, size=(5, 3)).astype(np.float64) for _ in range(n)]
    rows = [rng.integers(-8, 9, size=(n, 3)).astype(np.float32) for _ in range(n)]
    ints = [rng.integers(0, 1000, size=7).astype(np.int32) for _ in range(n)]
    async with netcoll.Client(cluster.address, token=TOKEN) as client:

        async def run(op: str, **kw: Any) -> Any:
            rec = await client.run(op, **kw)
            assert rec["state"] == "succeeded" and rec["world_size"] == n, rec
            return rec["result"]

        np.testing.assert_array_equal(await run("all_reduce", inputs=per_rank), np.sum(per_rank, axis=0))
        np.testing.assert_array_equal(await run("all_reduce", inputs=ints, reduce_op="max"), np.max(ints, axis=0))
        np.testing.assert_array_equal(
            await run("all_reduce", inputs=ints, reduce_op="bxor"), np.bitwise_xor.reduce(ints, axis=0)
        )
        np.testing.assert_array_equal(await run("broadcast", inputs=per_rank[1], root=1, world_size=n), per_rank[1])
        np.testing.assert_array_equal(
            await run("reduce", inputs=per_rank, root=2, reduce_op="prod"), np.prod(per_rank, axis=0)
        )
        np.testing.assert_array_equal(await run("all_gather", inputs=per_rank), np.stack(per_rank))
        np.testing.assert_array_equal(await run("gather", inputs=per_rank, root=3), np.stack(per_rank))
        got = await run("scatter", inputs=rows[0], root=0, world_size=n)
        for r in range(n):
            np.testing.assert_array_equal(got[r], rows[0][r])
        got = await run("reduce_scatter", inputs=rows)
        for r in range(n):
            np.testing.assert_array_equal(got[r], np.sum(rows, axis=0)[r])
        got = await run("all_to_all", inputs=rows)
        for r in range(n):
            np.testing.assert_array_equal(got[r], np.stack([rows[j][r] for j in range(n)]))
        await run("barrier", world_size=n)
        # named tensors kept on the ranks
        await client.put("w", per_rank)
        stored = await client.get("w")
        for r in range(n):
            np.testing.assert_array_equal(stored[r], per_rank[r])
        np.testing.assert_array_equal(await run("all_reduce", data="buffer", input="w"), np.sum(per_rank, axis=0))


@ON_THE_CLUSTER
def test_status_json_and_text(cluster: Cluster, tmp_path: Path) -> None:
    cluster.ensure(4)
    proc = cluster.cli("submit", "barrier")  # a job, so that the current members have ranks
    assert proc.returncode == 0, proc.stderr
    proc = cluster.cli("status", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    members = doc["members"]
    assert len(members) == 4 and sorted(m["rank"] for m in members) == [0, 1, 2, 3], doc
    alive = {r.info["member_id"]: r for r in cluster.alive_ranks()}
    for m in members:
        assert m["member_id"] in alive and m["epoch"] == doc["epoch"] and m["state"] == "ready", m
        host = alive[m["member_id"]].info["listen"].split(":")[0]
        assert m["address"] == alive[m["member_id"]].info["listen"] and host != "127.0.0.1", m  # as seen
        assert m["current_job"] is None
    assert doc["queued"] == 0 and doc["jobs"] and doc["jobs"][-1]["op"] == "barrier", doc
    (tmp_path / "status.json").write_text(proc.stdout)  # deploy/e2e.sh's contract, checked by its helper
    helper = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "e2e_json.py"), "members", str(tmp_path / "status.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert helper.stdout.strip() == "4", helper.stdout + helper.stderr
    job, _ = cluster.submit_json("all_to_all", "--size", "64KiB")
    (tmp_path / "job.json").write_text(job.stdout)
    helper = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "e2e_json.py"), "job", str(tmp_path / "job.json"), "succeeded", "4"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert helper.returncode == 0 and "world=4" in helper.stdout, helper.stdout + helper.stderr
    text = cluster.cli("status")
    assert text.returncode == 0 and "4 rank daemons" in text.stdout and "recent jobs" in text.stdout, text.stdout
    wrong = run_cli("status", "--coordinator", cluster.address, env=base_env(NETCOLL_TOKEN="not-the-token"))
    assert wrong.returncode == 1 and "authentication" in one_error_line(wrong), wrong.stderr


@ON_THE_CLUSTER
async def test_bad_requests_get_clear_errors_and_the_coordinator_keeps_serving(cluster: Cluster) -> None:
    from netcoll.rpc import RpcClient
    from netcoll.wire import MAGIC, PREFIX, VERSION, Kind

    await asyncio.to_thread(cluster.ensure, 4)
    rpc = await RpcClient.connect(cluster.address, token=TOKEN)
    try:
        for spec, word in (
            ({"op": "all_reducex"}, "op"),
            ({"op": "all_reduce", "dtype": "float33"}, "float33"),
            ({"op": "all_reduce", "dtype": "int32", "reduce_op": "avg"}, "avg"),
            ({"op": "all_reduce", "size": 1 << 40}, "exceeds"),
            ({"op": "all_reduce", "size": "huge"}, "size"),
        ):
            with pytest.raises((ValueError, TypeError)) as info:
                await rpc.call("submit", {"spec": spec}, timeout=10)
            assert word in str(info.value), info.value
        with pytest.raises(ValueError, match="do not match"):
            await rpc.call(
                "submit",
                {
                    "spec": {"op": "all_reduce", "data": "inline"},
                    "inputs": {"mode": "same", "arrays": [{"dtype": "<f4", "shape": [1000], "nbytes": 4000}]},
                },
                b"short",
                timeout=10,
            )
        with pytest.raises(ValueError, match="unknown method"):
            await rpc.call("format_disk", {}, timeout=10)
        # a REQUEST frame whose msgpack header is malformed: the coordinator drops that connection only
        junk = b"\xc1\xc1\xff not msgpack"
        assert rpc.proto.transport is not None
        rpc.proto.transport.write(PREFIX.pack(MAGIC, VERSION, int(Kind.REQUEST), 0, len(junk), 0) + junk)
        async with asyncio.timeout(10):
            while not rpc.closed:
                await asyncio.sleep(0.02)
    finally:
        await rpc.close()

    host, port = cluster.address.rsplit(":", 1)
    for garbage in (
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(4096),
        MAGIC + bytes([VERSION, int(Kind.HELLO), 0, 0]) + struct.pack("!IQ", 1 << 31, 1 << 50),
        os.urandom(20),
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(garbage)
        await writer.drain()
        async with asyncio.timeout(15):  # answered with an error, or closed; never left hanging
            while await reader.read(65536):
                pass
        writer.close()

    proc, rec = await asyncio.to_thread(cluster.submit_json, "all_reduce", "--size", "64KiB")
    assert proc.returncode == 0 and rec["state"] == "succeeded" and rec["world_size"] == 4, (proc.stderr, rec)
    assert cluster.coord is not None and cluster.coord.alive


@ON_THE_CLUSTER
async def test_killed_daemon_fails_the_job_then_the_rest_then_a_new_one(cluster: Cluster, tmp_path: Path) -> None:
    await asyncio.to_thread(cluster.ensure, 4)
    submit = await asyncio.create_subprocess_exec(
        *netcoll_cmd(
            "submit",
            "all_reduce",
            "--size",
            "4MiB",
            "--iters",
            "100000",
            "--deadline",
            "120",
            "--json",
            "--coordinator",
            cluster.address,
        ),
        env=cluster.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with netcoll.Client(cluster.address, token=TOKEN) as client:
            async with asyncio.timeout(30):
                while True:  # our job is running, past its first iteration (the links are up)
                    status = await client.status()
                    rec = status["jobs"][-1] if status["jobs"] else {}
                    if rec.get("op") == "all_reduce" and rec.get("state") == "running" and rec.get("progress"):
                        break
                    await asyncio.sleep(0.05)
        victim_rank = 2
        victim_id = rec["ranks"][victim_rank]["member_id"]
        cluster.rank_of_member(victim_id).popen.send_signal(signal.SIGKILL)
        async with asyncio.timeout(40):
            out, err = await submit.communicate()
    finally:
        if submit.returncode is None:
            submit.kill()
            await submit.wait()
    assert submit.returncode == 1, (out, err)
    job = json.loads(out)
    assert "deadline" not in job["error"], f"the job should fail on the lost rank, not at its deadline: {job}"
    assert job["state"] == "failed" and job["id"] == rec["id"], job
    assert f"rank {victim_rank}" in job["error"] and victim_id in job["error"], job["error"]
    assert err.decode().count("\n") == 1 and f"job {job['id']} failed: rank" in err.decode(), err
    (tmp_path / "failed.json").write_bytes(out)  # what deploy/e2e.sh checks, with its own helper
    helper = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(REPO / "deploy" / "e2e_json.py"), "job", str(tmp_path / "failed.json"), "failed-rank"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert helper.returncode == 0, helper.stdout + helper.stderr
    failed_epoch = job["epoch"]

    await asyncio.to_thread(cluster.wait_members, 3)
    proc, rec = await asyncio.to_thread(cluster.submit_json, "all_reduce", "--size", "256KiB")
    assert proc.returncode == 0 and rec["state"] == "succeeded", (proc.stderr, rec)
    assert rec["world_size"] == 3 and rec["epoch"] > failed_epoch and victim_id not in json.dumps(rec["ranks"]), rec
    epoch3 = rec["epoch"]

    newcomer = await asyncio.to_thread(cluster.start_rank)
    await asyncio.to_thread(cluster.wait_members, 4)
    proc, rec = await asyncio.to_thread(cluster.submit_json, "all_gather", "--size", "256KiB")
    assert proc.returncode == 0 and rec["state"] == "succeeded" and rec["verified"] is True, (proc.stderr, rec)
    assert rec["world_size"] == 4 and rec["epoch"] > epoch3, rec
    assert newcomer.info["member_id"] in {r["member_id"] for r in rec["ranks"]}, rec


@ON_THE_CLUSTER
def test_sigterm_drains_the_running_job_then_leaves(cluster: Cluster) -> None:
    cluster.ensure(4)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        job = pool.submit(cluster.submit_json, "all_reduce", "--size", "1MiB", "--iters", "100")
        leaving = cluster.alive_ranks()[-1]
        deadline = time.monotonic() + 30
        while metric(http_get(f"{leaving.info['http']}/metrics")[1], "netcoll_rank_busy") != 1:
            assert time.monotonic() < deadline and not job.done(), "the job never started on the rank"
            time.sleep(0.02)
        leaving.popen.send_signal(signal.SIGTERM)  # mid-job
        assert leaving.popen.wait(30) == 0, leaving.tail()
        proc, rec = job.result(60)
    assert proc.returncode == 0 and rec["state"] == "succeeded" and rec["world_size"] == 4, (proc.stderr, rec)
    log = leaving.log.read_text()
    assert "draining" in log and "stopped" in log and "Traceback" not in log, log
    cluster.wait_members(3)
    proc, rec = cluster.submit_json("barrier")
    assert rec["state"] == "succeeded" and rec["world_size"] == 3, rec
    cluster.ensure(4)
