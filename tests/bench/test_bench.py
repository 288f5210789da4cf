"""netcoll.bench: sweep sizes, geometry, the nccl-tests table and a quick real
sweep over rank processes (correctness only, never timing). Size parsing:
test_sizes.py; the registry's factors and test data: test_collectives_registry.py."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bench import compare as bench_compare
from bench import machine as bench_machine
from netcoll import collectives
from netcoll.bench import add_arguments, config_from_args, report
from netcoll.bench.common import OPS, SweepConfig, geometry, make_row, parse_ops, sweep_sizes
from netcoll.bench.local import run_local
from netcoll.sizes import format_size
from tests.support import REPO

ROOT = str(REPO)


# -- pure parts ---------------------------------------------------------------------------------
def test_sweep_sizes_and_format() -> None:
    assert sweep_sizes(4, 64 << 20, 4)[:3] == [4, 16, 64]
    assert sweep_sizes(4, 64 << 20, 4)[-1] == 64 << 20 and len(sweep_sizes(4, 64 << 20, 4)) == 13
    assert sweep_sizes(4, 65536, 16) == [4, 64, 1024, 16384]
    assert sweep_sizes(1024, 1024, 2) == [1024]
    with pytest.raises(ValueError):
        sweep_sizes(8, 4, 2)
    with pytest.raises(ValueError):
        sweep_sizes(4, 8, 1)
    assert format_size(4) == "4 B" and format_size(65536) == "64 KiB" and format_size(64 << 20) == "64 MiB"
    assert format_size(1000) == "1 KB" and format_size(1001) == "1001 B"  # KB: 1000 bytes (netcoll.sizes)


def test_parse_ops() -> None:
    assert parse_ops("all") == list(OPS)
    assert parse_ops("all_reduce,broadcast") == ["all_reduce", "broadcast"]
    assert parse_ops("all-gather") == ["all_gather"]
    with pytest.raises(ValueError, match="unknown collective"):
        parse_ops("allreduce2")


def test_geometry_follows_nccl_tests() -> None:
    # all_gather: size is the output (P blocks), count the per-rank block
    g = geometry("all_gather", 1 << 20, np.float32, 4)
    assert (g.size, g.count, g.input_shape) == (1 << 20, (1 << 20) // 16, ((1 << 20) // 16,))
    # reduce_scatter: size is the input (P blocks)
    g = geometry("reduce_scatter", 1024, np.float32, 4)
    assert (g.size, g.count, g.input_shape) == (1024, 64, (4, 64))
    # rounding down to whole blocks, even to zero
    assert geometry("all_to_all", 64, np.float32, 3).size == 60
    assert geometry("scatter", 4, np.float32, 4).size == 0
    g = geometry("all_reduce", 4, np.float32, 4)
    assert (g.size, g.count) == (4, 1)
    assert geometry("broadcast", 2, np.float32, 4).size == 0


def test_ops_are_the_registry_collectives_with_data() -> None:
    assert OPS == collectives.WITH_DATA and "barrier" not in OPS


def test_rows_use_the_registry_factors() -> None:
    for op in OPS:
        g = geometry(op, 1 << 20, np.float32, 4)
        row = make_row(g, redop="sum", root=2, seconds=1e-3, median_seconds=1e-3, min_seconds=1e-3, wrong=0)
        coll = collectives.get(op)
        assert row["busbw_factor"] == coll.busbw_factor(4) and g.busbw_factor == coll.busbw_factor(4)
        assert row["busbw"] == pytest.approx(row["algbw"] * coll.busbw_factor(4))
        assert row["algbw"] == pytest.approx(g.size / 1e-3 / 1e9)
        assert row["redop"] == ("sum" if coll.takes_op else "none") and row["root"] == (2 if coll.takes_root else -1)
        assert g.input_shape == coll.input_shape(4, g.count)


# -- the table -------------------------------------------------------------------------------------
NCCL_HEADER = [  # verbatim from nccl-tests (src/common.cu), each line split in two
    "#                                                              out-of-place"
    "                       in-place          ",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
    "            (us)  (GB/s)  (GB/s)       ",
]


def _row(**kw):
    row = {
        "op": "all_reduce",
        "size": 1048576,
        "count": 262144,
        "type": "float",
        "redop": "sum",
        "root": -1,
        "time_us": 1234.56,
        "algbw": 0.8493,
        "busbw": 1.27,
        "wrong": 0,
    }
    row.update(kw)
    return row


def test_table_header_is_nccl_tests_exactly() -> None:
    assert report.header()[:3] == NCCL_HEADER


def test_table_row_layout() -> None:
    line = report.format_row(_row())
    assert line == (
        "     1048576        262144     float     sum      -1   1234.6    0.85    1.27      0"
        "      N/A     N/A     N/A    N/A"
    )
    # nccl-tests' time precision steps: %7.2f < 100 us <= %7.1f < 10000 us <= %7.0f
    assert report.format_row(_row(time_us=12.345)).split()[5] == "12.35"
    assert report.format_row(_row(time_us=123456.7)).split()[5] == "123457"
    assert report.format_row(_row(wrong=None)).split()[8] == "N/A"
    # column positions: size ends at 12, count at 26, as nccl-tests' %12li  %12li
    assert line[:12].strip() == "1048576" and line[14:26].strip() == "262144"


def test_table_footer_and_json() -> None:
    rows = [_row(), _row(size=4, count=1, busbw=0.0, wrong=0)]
    foot = report.footer(rows)
    assert foot[0] == "# Out of bounds values : 0 OK"
    assert foot[1] == "# Avg bus bandwidth    : 0.635 "
    assert report.footer([_row(wrong=3)])[0] == "# Out of bounds values : 3 FAILED"
    doc = json.loads(report.to_json({"world_size": 4}, rows))
    assert doc["rows"] == rows and doc["meta"]["avg_busbw"] == pytest.approx(0.635)


def test_progress_only_on_a_tty(tmp_path) -> None:
    with open(tmp_path / "f", "w") as f:
        assert not report.Progress.wanted(f)


# -- arguments ----------------------------------------------------------------------------------
def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_arguments() -> None:
    cfg = config_from_args(
        _parse("-b", "4K", "-e", "1MiB", "-f", "2", "-n", "3", "-w", "0", "--op", "all", "-d", "half", "-o", "max")
    )
    assert (cfg.minbytes, cfg.maxbytes, cfg.stepfactor, cfg.iters, cfg.warmup) == (4096, 1 << 20, 2, 3, 0)
    assert cfg.ops == list(OPS) and cfg.dtype == "float16" and cfg.redop == "max"
    assert config_from_args(_parse("broadcast")).ops == ["broadcast"]
    assert config_from_args(_parse()).ops == ["all_reduce"]
    with pytest.raises(ValueError):
        config_from_args(_parse("-d", "int32", "-o", "avg"))
    with pytest.raises(SystemExit):
        _parse("-b", "4X")
    assert _parse("-b", "1.5M").minbytes == 3 << 19  # the one size grammar (netcoll.sizes)


def _cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "netcoll.bench", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_coordinator_mode_without_a_coordinator() -> None:
    r = _cli("--coordinator", "127.0.0.1:1")
    assert r.returncode == 1 and "could not connect to 127.0.0.1:1" in r.stderr and "Traceback" not in r.stderr


def test_bad_arguments_exit_2() -> None:
    r = _cli("--op", "nope")
    assert r.returncode == 2 and "unknown collective" in r.stderr


# -- real rank processes -------------------------------------------------------------------------
@pytest.mark.tcp
async def test_quick_sweep_over_processes_is_correct() -> None:
    cfg = SweepConfig(ops=["all"], minbytes=4, maxbytes=64 << 10, stepfactor=16, iters=2, warmup=1)
    res = await asyncio.wait_for(run_local(cfg, 2), 60)
    rows = res["rows"]
    assert len(rows) == len(OPS) * 4
    assert [r["op"] for r in rows[::4]] == list(OPS)
    for r in rows:
        assert r["wrong"] == 0, r
        assert r["time_us"] > 0 and r["busbw"] >= 0
        assert r["redop"] == ("sum" if r["op"] in ("all_reduce", "reduce", "reduce_scatter") else "none")
        assert r["root"] == (0 if r["op"] in ("broadcast", "reduce", "gather", "scatter") else -1)
    assert res["meta"]["world_size"] == 2 and len(res["meta"]["ranks"]) == 2
    ag = [r for r in rows if r["op"] == "all_gather"]
    assert [r["size"] for r in ag] == [0, 64, 1024, 16384] and ag[-1]["count"] == 16384 // 4 // 2


@pytest.mark.tcp
def test_cli_table_and_json() -> None:
    r = _cli(
        "--ranks",
        "2",
        "-b",
        "4",
        "-e",
        "64K",
        "-f",
        "16",
        "-n",
        "2",
        "-w",
        "1",
        "--op",
        "all_reduce,scatter",
        "-d",
        "int32",
        "-o",
        "bxor",
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(
        "# nThread 1 nGpus 1 minBytes 4 maxBytes 65536 step: 16(factor) warmup iters: 1 "
        "iters: 2 agg iters: 1 validation: 1 graph: 0"
    )
    for h in NCCL_HEADER:
        assert h in lines
    data = [ln for ln in lines if not ln.startswith("#")]
    assert len(data) == 8
    for ln in data:
        cols = ln.split()
        assert len(cols) == 13 and cols[2] == "int32" and cols[8] == "0", ln
    assert sum(ln.startswith("# Avg bus bandwidth    : ") for ln in lines) == 2
    assert "# Out of bounds values : 0 OK" in lines
    assert r.stderr == ""  # no progress bar when stderr is not a terminal

    r = _cli("--ranks", "2", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-w", "0", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [row["size"] for row in doc["rows"]] == [1024, 4096]
    assert all(row["wrong"] == 0 and row["op"] == "all_reduce" for row in doc["rows"])
    assert doc["meta"]["world_size"] == 2 and doc["meta"]["config"]["iters"] == 2


def test_cli_refuses_a_root_outside_the_world() -> None:
    r = _cli("--ranks", "2", "-r", "2", "--op", "broadcast")
    assert r.returncode == 2 and "root" in r.stderr


def test_cli_refuses_an_unknown_algorithm() -> None:
    r = _cli("--ranks", "2", "--op", "all_reduce", "--algorithm", "nope")
    assert r.returncode == 2 and "not an algorithm" in r.stderr
    assert SweepConfig(ops=["all"], algorithm="ring").validate().algorithm_for("gather") == "auto"


@pytest.mark.tcp
def test_cli_reports_a_failing_rank() -> None:
    r = _cli("--ranks", "2", "-b", "4", "-e", "4", "--timeout", "1e-9")
    assert r.returncode == 1
    assert "benchmark failed: rank" in r.stderr and "CollectiveTimeout" in r.stderr, r.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.tcp
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_kills_every_rank_process() -> None:
    import signal
    import time

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "netcoll.bench",
            "--ranks",
            "2",
            "-b",
            "16M",
            "-e",
            "16M",
            "-n",
            "100000",
            "-w",
            "0",
            "-c",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        # a shell's background job ignores SIGINT, and the child would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        pids = []
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("#  Rank "):
                pids.append(int(line.split("Pid")[1].split()[0]))
            if line.startswith("# Collective test") or (len(pids) == 2 and line.strip() == "#"):
                break
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 130
        assert p.stderr is not None
        err = p.stderr.read()
        assert "Traceback" not in err and "interrupted" in err, err
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in pids)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.tcp
def test_closed_stdout_stops_quietly() -> None:  # | head
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "netcoll.bench",
            "--ranks",
            "2",
            "-b",
            "4",
            "-e",
            "16M",
            "-f",
            "4",
            "-n",
            "3",
            "-w",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    try:
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.readline().startswith(b"# nThread 1")
        p.stdout.close()
        assert p.wait(60) == 141
        err = p.stderr.read().decode()
        assert "Traceback" not in err and "was lost" not in err, err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# -- bench/compare.py's report (synthetic results; no peers are run) -------------------------------
def _fake_rows(impl: str, speed: float) -> list[dict]:
    rows = []
    for op in ("all_reduce", "all_gather"):
        for req in (4, 64 << 10, 16 << 20):
            g = geometry(op, req, np.float32, 4)
            t = (20e-6 + g.size / 1e9) / speed
            rows.append(
                make_row(
                    g,
                    redop="sum",
                    root=0,
                    seconds=t,
                    median_seconds=t,
                    min_seconds=t,
                    wrong=0 if impl == "netcoll" else None,
                    requested=req,
                    impl=impl,
                )
            )
    return rows


def test_compare_report_ratios_and_targets(tmp_path) -> None:
    compare = bench_compare
    results = {
        "meta": {
            "date": "today",
            "command": "python3 bench/compare.py",
            "commit": "abc",
            "nproc": 2,
            "cpu": "x",
            "python": "3",
            "numpy": "2",
            "platform": "linux",
            "loop": "asyncio",
            "skipped": {"mpi": "nope"},
            "config": SweepConfig().to_json(),
            "elapsed_s": 1,
        },
        "runs": {
            "4": {
                "world_size": 4,
                "notes": [],
                "impls": {"netcoll": _fake_rows("netcoll", 2.0), "gloo": _fake_rows("gloo", 1.0)},
            }
        },
        "rss": {
            "world_size": 4,
            "message_bytes": 64 << 20,
            "peak_rss_bytes": 200 << 20,
            "baseline_rss_bytes": 50 << 20,
            "growth_bytes": 150 << 20,
            "import_rss_bytes": 40 << 20,
            "time_us": 1e5,
            "busbw": 1.0,
        },
    }
    rt = compare.ratios(results["runs"]["4"])
    assert rt[("all_reduce", 16 << 20)][0] == pytest.approx(2.0) and rt[("all_reduce", 16 << 20)][1] == "gloo"
    assert rt[("all_gather", 4)] is None  # empty buffer at 4 B on 4 ranks
    verdicts = {t.split(": ", 1)[1].split(":")[0]: v for t, _, v in compare.targets(results)}
    assert verdicts["every collective, every size ≥ 64 KiB"] == "met"
    assert verdicts["all_gather, reduce_scatter ≥ 16 MiB"] == "met"
    assert verdicts["all_reduce of 4 bytes"] == "met"
    text = compare.render(results, {"4": "benchmarks-4ranks.png"})
    assert "| all_reduce | — |" not in text and "2.00 g" in text and "MPI-TCP was skipped" in text
    doc = tmp_path / "b.md"
    doc.write_text("# hand written\n\n" + compare.BEGIN + "\nSTALE\n" + compare.END + "\n\ntail\n")
    compare.write_doc(str(doc), text)
    out = doc.read_text()
    assert out.startswith("# hand written") and out.endswith("tail\n") and "STALE" not in out and "2.00 g" in out
    # a dedicated latency run, when there is one, decides the 4-byte target (not the sweep's row)
    g = geometry("all_reduce", 4, np.float32, 4)
    slow = make_row(
        g,
        redop="sum",
        root=0,
        seconds=300e-6,
        median_seconds=300e-6,
        min_seconds=250e-6,
        wrong=0,
        requested=4,
        iters=500,
        impl="netcoll",
    )
    results["runs"]["4"]["latency"] = {"netcoll": slow}
    verdicts = {t.split(": ", 1)[1].split(":")[0]: (m, v) for t, m, v in compare.targets(results)}
    measured, verdict = verdicts["all_reduce of 4 bytes"]
    assert verdict == "NOT met" and "300 µs" in measured and "500 calls" in measured
    assert "over 500 calls" in compare.render(results, {})


@pytest.mark.tcp
async def test_bench_against_running_daemons() -> None:
    """``netcoll bench --coordinator``: the sweep as jobs on rank daemons."""
    import argparse

    import netcoll
    from netcoll.bench import add_arguments
    from netcoll.bench import run as bench_run
    from netcoll.bench.common import SweepConfig
    from netcoll.bench.remote import run_remote
    from netcoll.service import JobService, RankDaemon

    async with netcoll.Coordinator() as coord:
        svc = JobService(coord)
        svc.start()
        daemons = [RankDaemon(coord.address, host="127.0.0.1", port=0, local_host="127.0.0.1") for _ in range(3)]
        tasks = [asyncio.create_task(d.run()) for d in daemons]
        try:
            async with asyncio.timeout(10):
                while sum(d.registered for d in daemons) < 3:
                    await asyncio.sleep(0.05)
            cfg = SweepConfig(ops="all", minbytes=4, maxbytes=4096, stepfactor=32, iters=2, warmup=1).validate()
            result = await run_remote(cfg, coord.address)
            rows = result["rows"]
            assert result["meta"]["world_size"] == 3
            assert {r["op"] for r in rows} == set(cfg.ops) and all(r["wrong"] == 0 for r in rows)
            parser = argparse.ArgumentParser()
            add_arguments(parser)
            code = await bench_run(
                parser.parse_args(
                    ["--coordinator", coord.address, "-b", "8", "-e", "8", "--op", "all_reduce", "--no-progress"]
                )
            )
            assert code == 0
        finally:
            for d in daemons:
                d.request_stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            await svc.close()


async def test_compare_interleaves_rounds_and_keeps_each_cells_median_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--rounds 3``: every implementation runs once per round, the order rotated each round;
    each cell (and the latency run) keeps the run with its median time, every run's time kept
    beside it; world sizes above ``--rounds-ranks`` run once."""
    compare = bench_compare
    calls: list[tuple[int, str]] = []
    slow = {("gloo", 0): 3.0, ("gloo", 1): 1.0, ("gloo", 2): 2.0, ("netcoll-tcp", 1): 5.0}

    async def fake_sweep(impl: str, cfgs: list[SweepConfig], n: int, ns: argparse.Namespace) -> list[dict]:
        k = sum(1 for _, i in calls if i == impl)  # this implementation's round
        calls.append((n, impl))
        factor = slow.get((impl, k), 1.0)
        rows = [{**r, "time_us": r["time_us"] * factor, "round": k} for r in _fake_rows(impl, 1.0)]
        lat = {**rows[0], "median_us": 100.0 * factor, "round": k}
        return [{"rows": rows, "links": ["tcp"]}, {"rows": [lat]}]

    monkeypatch.setattr(compare, "sweep", fake_sweep)
    ns = argparse.Namespace(
        split_bytes=1 << 20, no_scale_iters=False, latency_iters=5, rounds=3, rounds_ranks=4,
        impls=["netcoll-tcp", "gloo"], measure_default=False, limit=60.0, loop="auto",
    )  # fmt: skip
    cfg = SweepConfig(ops=["all_reduce", "all_gather"], minbytes=4, maxbytes=16 << 20, stepfactor=4).validate()
    run = await compare.one_world(4, ["netcoll-tcp", "gloo"], cfg, ns)
    assert [i for _, i in calls] == ["netcoll-tcp", "gloo", "gloo", "netcoll-tcp", "netcoll-tcp", "gloo"]
    assert run["rounds"] == 3
    gloo = run["impls"]["gloo"]
    assert {r["round"] for r in gloo} == {2}  # times x3, x1, x2: the median is round 2's
    assert all(r["rounds_time_us"] == [1.5 * r["time_us"], 0.5 * r["time_us"], r["time_us"]] for r in gloo)
    assert run["latency"]["gloo"]["round"] == 2 and run["latency"]["gloo"]["rounds_median_us"] == [300.0, 100.0, 200.0]
    assert {r["round"] for r in run["impls"]["netcoll-tcp"]} <= {0, 2}  # never the slow round 1
    calls.clear()
    run8 = await compare.one_world(8, ["netcoll-tcp", "gloo"], cfg, ns)
    assert [i for _, i in calls] == ["netcoll-tcp", "gloo"] and run8["rounds"] == 1
    assert "rounds_time_us" not in run8["impls"]["gloo"][0]
    assert bench_machine.rounds_clause({"rounds": {"8": 1, "4": 3}}).startswith(
        "; at 4 ranks, every value is the median run of 3 interleaved runs"
    )
    assert bench_machine.rounds_clause({"rounds": {"4": 1}}) == bench_machine.rounds_clause({}) == ""


@pytest.mark.tcp
async def test_coordinator_rows_name_what_auto_ran() -> None:
    """Rows of a sweep run as jobs say what ``auto`` chose (``auto:doubling``, with its segment
    size), as the local runner's do; a forced algorithm is named as given."""
    from netcoll.bench.remote import run_remote
    from tests.support.services import service

    cfg = SweepConfig(ops=["all_reduce"], minbytes=4, maxbytes=4, iters=2, warmup=1)
    forced = SweepConfig(ops=["all_reduce"], minbytes=4, maxbytes=4, iters=2, warmup=1, algorithm="ring")
    async with service(2) as (cluster, _client):
        auto = await asyncio.wait_for(run_remote(cfg, cluster.coord.address, token=cluster.token), 60)
        ring = await asyncio.wait_for(run_remote(forced, cluster.coord.address, token=cluster.token), 60)
    (row,) = auto["rows"]
    assert row["algorithm"] == "auto:doubling" and row["segment_bytes"] > 0 and row["wrong"] == 0
    assert ring["rows"][0]["algorithm"] == "ring"


def test_a_record_without_usable_model_stats_names_plain_auto() -> None:
    from netcoll.bench.remote import _algorithm_fields

    cfg = SweepConfig(ops=["all_reduce"])
    g = geometry("all_reduce", 1024, "float32", 2)
    for model in (None, "junk", {"0": None}, {"0": {"choices": {"all_reduce": {"algorithm": 7}}}}, {"x": {}}):
        assert _algorithm_fields(cfg, g, {"model": model}) == {"algorithm": "auto"}
    chosen = {"algorithm": "tree", "segment_bytes": 65536, "predicted_s": 2e-3}
    fields = _algorithm_fields(cfg, g, {"model": {"1": {"choices": {"all_reduce": chosen}}}})
    assert fields == {"algorithm": "auto:tree", "segment_bytes": 65536, "predicted_us": 2000.0}


def test_a_coordinator_row_takes_its_median_and_min_over_the_slowest_rank_per_call() -> None:
    """A job row's time is the mean of the slowest rank per call (the job's ``time_s``); its
    median and min are over the same per-call maxima, not the mean again. Without every
    rank's every call they fall back to the mean."""
    from netcoll.bench.remote import _row

    cfg = SweepConfig(ops=["all_reduce"], minbytes=4, maxbytes=4, iters=4, warmup=1).validate()
    g = geometry("all_reduce", 4, np.dtype("float32"), 2)
    timings = {"0": [1.0, 1.0, 30.0, 1.0], "1": [2.0, 0.5, 1.0, 3.0]}  # slowest per call: 2, 1, 30, 3
    rec = {"id": "j1", "time_s": 9.0, "timings": timings, "model": None}
    row = _row(cfg, g, rec, 4)
    assert row["time_us"] == 9.0e6 and row["median_us"] == 2.5e6 and row["min_us"] == 1.0e6
    partial = _row(cfg, g, {**rec, "timings": {"0": [1.0, 1.0, 30.0, 1.0], "1": []}}, 4)
    assert partial["median_us"] == partial["min_us"] == 9.0e6
