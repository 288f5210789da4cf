"""Job timelines: every rank's spans of a traced job, merged by the
coordinator into one Chrome trace (the Trace Event Format that Perfetto and
``chrome://tracing`` open).

A job submitted with ``trace=True`` runs with a
:class:`~netcoll.observe.Recorder` on every rank: one span per operation, per
send and receive (by peer) and per reduction, timed with the rank's monotonic
clock. Before reporting its result, a rank estimates its clock's offset to the
coordinator's monotonic clock (NTP-style: ``clock`` RPCs, the one with the
shortest round trip wins: ``offset = coordinator time - midpoint``, error at
most half that round trip) and sends its spans shifted onto the coordinator's
clock (``job_trace``, msgpack in the payload: a trace can be larger than an
RPC header). :func:`chrome_trace` builds the document: ``ph: "X"`` complete
events with ``ts``/``dur`` in µs from the job's first span, ``pid`` = rank
(named ``rank N``), ``tid`` = one lane per peer direction (``send to rank 1``,
``recv from rank 1``), ``reduce`` and ``operations``.

The coordinator keeps the traces of the last :data:`KEEP` traced jobs.
"""

from __future__ import annotations

import collections
import json
import math
import time
from typing import TYPE_CHECKING, Any

import msgpack

from .. import observe
from ..rpc import Reply, Session

if TYPE_CHECKING:
    from ..rpc import RpcClient
    from .scheduler import JobService

KEEP = 8  # traced jobs whose traces the coordinator keeps
CLOCK_PROBES = 3
MAX_TRACE_BYTES = 64 << 20  # one rank's packed trace
MAX_NAME = 200


async def send_trace(rpc: RpcClient, job_id: int, rank: int, recorder: observe.Recorder) -> None:
    """Estimate this rank's clock offset to the coordinator and send the job's spans."""
    best: tuple[float, float] | None = None  # (round trip, offset)
    for _ in range(CLOCK_PROBES):
        before = time.monotonic()
        reply = await rpc.call("clock", {}, timeout=10.0)
        after = time.monotonic()
        offset = float(reply["now"]) - (before + after) / 2
        if best is None or after - before < best[0]:
            best = (after - before, offset)
    assert best is not None
    doc = recorder.export(best[1])
    params = {"job_id": job_id, "rank": rank, "clock_error_s": best[0] / 2, "dropped": doc["dropped"]}
    await rpc.call("job_trace", params, msgpack.packb(doc["spans"], use_bin_type=True), timeout=30.0)


class Traces:
    """The coordinator's traces of the last :data:`KEEP` traced jobs: job id ->
    rank -> (clock error, dropped spans, packed spans)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.jobs: collections.OrderedDict[int, dict[int, tuple[float, int, bytes]]] = collections.OrderedDict()

    def add(self, job_id: int, rank: int, params: dict[str, Any], packed: bytes) -> None:
        if len(packed) > MAX_TRACE_BYTES:
            raise ValueError(f"trace of rank {rank} is {len(packed)} bytes; at most {MAX_TRACE_BYTES}")
        error, dropped = params.get("clock_error_s"), params.get("dropped")
        if not isinstance(error, (int, float)) or not math.isfinite(error) or error < 0:
            raise TypeError("clock_error_s must be a non-negative number")
        if isinstance(dropped, bool) or not isinstance(dropped, int) or dropped < 0:
            raise TypeError("dropped must be a non-negative integer")
        self.jobs.setdefault(job_id, {})[rank] = (float(error), dropped, packed)
        self.jobs.move_to_end(job_id)
        while len(self.jobs) > self.keep:
            self.jobs.popitem(last=False)

    def chrome(self, job_id: int) -> dict[str, Any] | None:
        parts = self.jobs.get(job_id)
        return None if parts is None else chrome_trace(job_id, parts)


def serve(svc: JobService) -> Traces:
    """Add the trace RPCs to the job service's coordinator: ``clock`` and ``job_trace``
    (members), ``trace`` (clients: ``{id}`` -> the Chrome trace, JSON in the payload)."""
    traces = Traces()

    async def clock(session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        return {"now": time.monotonic()}

    async def job_trace(session: Session, params: dict[str, Any], payload: memoryview) -> dict[str, Any]:
        job, rank = svc.jobs.get(params.get("job_id")), params.get("rank")  # type: ignore[arg-type]
        if job is None or not isinstance(rank, int) or job.members.get(rank) != session.data.get("daemon"):
            raise ValueError("no such job, or this daemon is not that rank of it")
        traces.add(job.id, rank, params, bytes(payload))
        return {"accepted": True}

    async def trace(session: Session, params: dict[str, Any], _: memoryview) -> Reply:
        job_id = params.get("id")
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id not in svc.jobs:
            raise KeyError(f"no job {job_id!r}")
        doc = traces.chrome(job_id)
        if doc is None:
            raise KeyError(
                f"no trace of job {job_id}: submit it with trace=True (netcoll submit --trace FILE); "
                f"the last {traces.keep} traces are kept"
            )
        return Reply({"events": len(doc["traceEvents"])}, json.dumps(doc).encode())

    svc.coord.register("clock", clock)
    svc.coord.register("job_trace", job_trace)
    svc.coord.register("trace", trace, clients=True)
    return traces


def _spans(packed: bytes) -> list[tuple[str, str, float, float, dict[str, Any]]]:
    """One rank's spans, checked (a malformed row is skipped)."""
    rows = msgpack.unpackb(packed, raw=False, max_array_len=observe.MAX_SPANS, max_map_len=16, max_str_len=4096)
    out = []
    for row in rows if isinstance(rows, list) else ():
        if not (isinstance(row, list) and len(row) == 5):
            continue
        name, tid, start, end, args = row
        if not (isinstance(name, str) and isinstance(tid, str)):
            continue
        if not all(isinstance(t, (int, float)) and math.isfinite(t) for t in (start, end)) or end < start:
            continue
        out.append((name[:MAX_NAME], tid[:MAX_NAME], float(start), float(end), args if isinstance(args, dict) else {}))
    return out


def chrome_trace(job_id: int, parts: dict[int, tuple[float, int, bytes]]) -> dict[str, Any]:
    """The Trace Event Format document of a job from its ranks' parts."""
    spans = {rank: _spans(packed) for rank, (_, _, packed) in parts.items()}
    t0 = min((s[2] for rows in spans.values() for s in rows), default=0.0)
    events: list[dict[str, Any]] = []
    for rank in sorted(spans):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        lanes: dict[str, int] = {}
        for name, tid, start, end, args in spans[rank]:
            lane = lanes.get(tid)
            if lane is None:
                lane = lanes[tid] = len(lanes) + 1
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": lane, "args": {"name": tid}})
            events.append(
                {
                    "name": name,
                    "cat": "netcoll",
                    "ph": "X",
                    "ts": round((start - t0) * 1e6, 3),
                    "dur": round((end - start) * 1e6, 3),
                    "pid": rank,
                    "tid": lane,
                    "args": args,
                }
            )
    other = {
        "job": job_id,
        "clock": "ranks' monotonic clocks shifted onto the coordinator's; error per rank in clock_error_us",
        "clock_error_us": {str(r): round(e * 1e6, 1) for r, (e, _, _) in sorted(parts.items())},
        "dropped_spans": {str(r): d for r, (_, d, _) in sorted(parts.items())},
    }
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


__all__ = ["KEEP", "Traces", "chrome_trace", "send_trace", "serve"]
