"""``netcoll bench --compression`` and the job field ``compression``: the codec reaches the
calls (fewer bytes on the links), generated data verifies within the codec's bound, and
what a compressed call refuses is refused at submission."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import netcoll
from netcoll import collectives
from netcoll.bench.common import SweepConfig
from netcoll.bench.remote import run_remote
from netcoll.service import Client, JobService, RankDaemon
from netcoll.service.jobs import JobSpec
from netcoll.testdata import TestData

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_sweep_config_checks_the_codec() -> None:
    cfg = SweepConfig(ops="all", compression="INT8").validate()
    assert cfg.compression == "int8"
    assert cfg.compression_for("all_reduce") == "int8" and cfg.compression_for("all_to_all") == "none"
    assert (
        SweepConfig(ops="all_reduce", dtype="int32", compression="fp16").validate().compression_for("all_reduce")
        == "none"
    )  # integers run uncompressed
    with pytest.raises(ValueError, match="--compression must be one of"):
        SweepConfig(compression="lz4").validate()
    with pytest.raises(ValueError, match="runs with --algorithm auto"):
        SweepConfig(compression="fp16", algorithm="ring").validate()


def test_generated_data_verifies_within_the_codecs_bound() -> None:
    coll = collectives.get("all_reduce")
    data = TestData("sum", np.dtype(np.float32), 4)
    right = data.reduced().window(0, 100).copy()
    assert coll.count_wrong(data, 100, 0, 0, right + 0.2, "int8") == 0  # within 2*4*8/254
    assert coll.count_wrong(data, 100, 0, 0, right + 0.2, "none") == 100
    assert coll.count_wrong(data, 100, 0, 0, right + 0.3, "int8") == 100
    nan = right.copy()
    nan[3] = np.nan
    assert coll.count_wrong(data, 100, 0, 0, nan, "fp16") == 1


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "netcoll.bench", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.tcp
def test_cli_compression_flag() -> None:
    args = ["--ranks", "2", "-b", "64K", "-e", "256K", "-f", "4", "-n", "2", "-w", "1", "--json"]
    r = _cli(*args, "--op", "all_reduce,all_gather,broadcast,reduce,reduce_scatter", "--compression", "int8")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["meta"]["config"]["compression"] == "int8"
    assert len(doc["rows"]) == 10
    assert all(row["wrong"] == 0 and row["compression"] == "int8" for row in doc["rows"]), doc["rows"]
    r = _cli(*args, "--compression", "zip")
    assert r.returncode == 2 and "--compression" in r.stderr


def test_job_field_is_checked_at_submission() -> None:
    assert JobSpec(op="all_reduce", compression="FP16").compression == "fp16"
    assert JobSpec(op="all_reduce").compression is None
    for bad, match in (
        ({"op": "all_reduce", "compression": "gzip"}, "must be one of"),
        ({"op": "all_reduce", "compression": "int8", "dtype": "int32"}, "needs a float"),
        ({"op": "all_reduce", "compression": "int8", "reduce_op": "prod"}, "cannot be compressed"),
        ({"op": "all_reduce", "compression": "int8", "algorithm": "ring"}, "algorithm must be 'auto'"),
        ({"op": "all_to_all", "compression": "int8"}, "takes no compression"),
    ):
        with pytest.raises(ValueError, match=match):
            JobSpec(**bad)


@pytest.mark.tcp
async def test_compressed_jobs_on_rank_daemons() -> None:
    async with netcoll.Coordinator() as coord:
        svc = JobService(coord)
        svc.start()
        daemons = [RankDaemon(coord.address, host="127.0.0.1", port=0, local_host="127.0.0.1") for _ in range(3)]
        tasks = [asyncio.create_task(d.run()) for d in daemons]
        try:
            async with asyncio.timeout(15):
                while sum(d.registered for d in daemons) < 3:
                    await asyncio.sleep(0.05)
            cfg = SweepConfig(
                ops=["all_reduce", "broadcast"], minbytes=4096, maxbytes=4096, iters=1, warmup=0, compression="bf16"
            ).validate()
            result = await run_remote(cfg, coord.address)
            assert all(r["wrong"] == 0 and r["compression"] == "bf16" for r in result["rows"]), result["rows"]
            x = np.random.default_rng(0).standard_normal(5000).astype(np.float32)
            async with Client(coord.address) as client:
                job = await client.run("all_reduce", compression="int8", world_size=3, inputs=[x, x, 2 * x])
            assert job["state"] == "succeeded", job
            got = job["result"]
            assert got.dtype == np.float32 and np.abs(got - 4 * x).max() <= 2 * 3 * 2 * np.abs(x).max() / 254
        finally:
            for d in daemons:
                d.request_stop()
            await asyncio.gather(*tasks, return_exceptions=True)
            await svc.close()
