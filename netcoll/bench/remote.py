"""``netcoll bench --coordinator HOST:PORT``: the same sweep, run as jobs on the
rank daemons of a running cluster (``netcoll up``, compose, Kubernetes).

Each (collective, size) step is one job with generated data: the daemons
time ``iters`` calls after ``warmup`` and verify the result on every rank; the
row's time is the mean over iterations of the slowest rank, as in the local
runner, so the numbers compare.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .common import Geometry, SweepConfig, geometry, make_row

if TYPE_CHECKING:
    from ..mesh.certs import TlsConfig


class RemoteBenchError(RuntimeError):
    """A job of the sweep failed (the message is the job's reason)."""


def _job_fields(cfg: SweepConfig, g: Geometry) -> dict[str, Any]:
    """The generated-data job of one step: a job's input is one rank's buffer, so
    ``shape`` is the geometry's input shape (the registry's), not nccl-tests' size."""
    return {
        "op": g.op,
        "shape": list(g.input_shape),
        "dtype": cfg.dtype,
        "reduce_op": cfg.redop,
        "root": cfg.root,
        "algorithm": cfg.algorithm_for(g.op),
        "compression": cfg.compression_for(g.op),
        "iters": cfg.iters,
        "warmup": cfg.warmup,
        "world_size": g.world_size,
        "deadline": cfg.timeout or 300.0,
    }


def _algorithm_fields(cfg: SweepConfig, g: Geometry, rec: dict[str, Any]) -> dict[str, Any]:
    """``algorithm`` (``auto:ring`` for what auto ran), and for auto the segment size and
    predicted time the record names, as in the local runner's rows."""
    from ..service.records import chosen as what_ran

    algo = cfg.algorithm_for(g.op)
    chosen = what_ran(rec, g.op) if algo == "auto" else None
    if chosen is None:
        return {"algorithm": algo}
    seg, predicted = chosen.get("segment_bytes"), chosen.get("predicted_s")
    return {
        "algorithm": f"auto:{chosen['algorithm']}",
        "segment_bytes": seg if isinstance(seg, int) else 0,
        "predicted_us": float(predicted) * 1e6 if isinstance(predicted, (int, float)) else None,
    }


def _row(cfg: SweepConfig, g: Geometry, rec: dict[str, Any], requested: int) -> dict[str, Any]:
    """The table row of one finished job (time: the mean of the slowest rank per iteration;
    median and min over those iterations as well)."""
    from ..service.records import slowest_per_call

    seconds = rec["time_s"] or 0.0
    per_rank = {int(r): sum(t) / len(t) for r, t in rec["timings"].items() if t}
    slowest = slowest_per_call(rec["timings"].values(), cfg.iters)
    return make_row(
        g,
        redop=cfg.redop,
        root=cfg.root,
        seconds=seconds,
        median_seconds=statistics.median(slowest) if slowest else seconds,
        min_seconds=min(slowest) if slowest else seconds,
        wrong=None if not cfg.check else (rec.get("wrong") or 0),
        requested=requested,
        iters=cfg.iters,
        warmup=cfg.warmup,
        **_algorithm_fields(cfg, g, rec),
        compression=cfg.compression_for(g.op),
        job=rec["id"],
        rank_time_us=[per_rank[r] * 1e6 for r in sorted(per_rank)],
    )


async def run_remote(
    cfg: SweepConfig,
    address: str,
    *,
    token: str | None = None,
    client_token: str | None = None,
    tls: TlsConfig | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the sweep on the daemons at ``address``; return ``{"rows", "meta"}``.
    ``token`` / ``client_token`` / ``tls``: the credentials, as for :class:`~netcoll.Client`."""
    from ..service import Client, JobSpec

    if cfg.alternate:  # a daemon runs one algorithm per job
        raise ValueError("alternating algorithms (SweepConfig.alternate) runs in a local cluster only")
    emit = on_event or (lambda ev: None)
    rows: list[dict[str, Any]] = []
    async with Client(address, token=token, client_token=client_token, tls=tls) as client:
        members = [m for m in await client.members() if m["state"] != "draining"]
        if not members:
            raise RemoteBenchError(f"no rank daemons are registered at {address}")
        n = len(members)
        emit(
            {
                "event": "ranks",
                "ranks": [
                    {"rank": i, "pid": 0, "host": m["host"], "member_id": m["member_id"]} for i, m in enumerate(members)
                ],
            }
        )
        for op, requested in cfg.steps():
            g = geometry(op, requested, cfg.np_dtype, n)
            emit({"event": "start", "op": op, "size": g.size, "requested": requested})
            rec = await client.run(JobSpec(**_job_fields(cfg, g)))
            if rec["state"] != "succeeded" and not (rec["state"] == "failed" and rec["verified"] is False):
                raise RemoteBenchError(f"{op} of {g.size} bytes: job {rec['id']} {rec['state']}: {rec['error']}")
            rows.append(_row(cfg, g, rec, requested))
            emit({"event": "row", "row": rows[-1]})
    return {
        "rows": rows,
        "meta": {
            "config": cfg.to_json(),
            "world_size": n,
            "coordinator": address,
            "transport": f"{'tls' if tls else 'tcp'}, rank daemons",
        },
    }
