"""``/metrics``: Prometheus collectors over the state where it already lives
(``prometheus_client``, the optional extra ``netcoll[metrics]``).

Nothing is counted twice: each scrape reads the coordinator's job service,
the rank daemon, its links' stats (:meth:`Mesh.link_stats`) and the
process's collective records (:mod:`netcoll.observe`), plus the standard
``process_*`` metrics. Base units only (seconds, bytes). Without
``prometheus_client`` installed, ``/metrics`` answers 503 saying so and
everything else works.

============================================ ========= ============================== =============
metric                                       type      labels                         who
============================================ ========= ============================== =============
netcoll_info                                 gauge     role, version (member_id)      both
netcoll_start_time_seconds                   gauge                                    both
netcoll_members / netcoll_members_ready      gauge                                    coordinator
netcoll_epoch                                gauge                                    coordinator
netcoll_groups                               gauge                                    coordinator
netcoll_jobs_total                           counter   state                          coordinator
netcoll_jobs_submitted_total                 counter                                  coordinator
netcoll_jobs_queued / netcoll_jobs_running   gauge                                    coordinator
netcoll_collective_duration_seconds          histogram op, algorithm                  rank
netcoll_collectives_total                    counter   op, outcome                    rank
netcoll_peer_sent_bytes_total                counter   peer                           rank
netcoll_peer_received_bytes_total            counter   peer                           rank
netcoll_peer_send_backlog_bytes              gauge     peer                           rank
netcoll_peer_link_info                       gauge     peer, kind                     rank
netcoll_rank_registered / _epoch / _rank     gauge                                    rank
netcoll_rank_busy                            gauge                                    rank
netcoll_rank_jobs_total                      counter   result                         rank
netcoll_rank_buffers / _buffer_bytes         gauge                                    rank
netcoll_result_pool_free_bytes / _lent       gauge                                    rank
netcoll_result_pool_blocks_total             counter   source (new, reused)           rank
process_*                                    (prometheus_client's ProcessCollector)   both
============================================ ========= ============================== =============
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .. import observe, resultpool

if TYPE_CHECKING:
    from ..rendezvous.coordinator import Coordinator
    from .daemon import RankDaemon
    from .scheduler import JobService

UNAVAILABLE = "metrics need prometheus_client: pip install 'netcoll[metrics]'"


class MetricsUnavailable(Exception):
    """``/metrics`` cannot be served (prometheus_client is not installed): HTTP 503."""


def available() -> bool:
    return importlib.util.find_spec("prometheus_client") is not None


def _version() -> str:
    try:
        from .. import __version__

        return str(__version__)
    except Exception:  # noqa: BLE001 - a version is nice to have, never worth a failed scrape
        return "unknown"


def _gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    if labels is None:
        return GaugeMetricFamily(name, doc, value=value)
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _counter(name: str, doc: str, label: str, rows: dict[str, float]) -> Any:
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in rows.items():
        family.add_metric([key], value)
    return family


# -- the coordinator ------------------------------------------------------------------------------
class CoordinatorCollector:
    """The coordinator and its job service, read at scrape time."""

    def __init__(self, coord: Coordinator, svc: JobService, started: float | None) -> None:
        self.coord, self.svc, self.started = coord, svc, started

    def collect(self) -> Iterator[Any]:
        from .jobs import JobState

        svc = self.svc
        yield _gauge("netcoll_info", "Constant 1, labelled with the role and version.", 1, _info("coordinator"))
        if self.started is not None:
            yield _gauge("netcoll_start_time_seconds", "Unix time the process started serving.", self.started)
        yield _gauge("netcoll_members", "Rank daemons registered with the coordinator.", len(svc.members))
        yield _gauge("netcoll_members_ready", "Registered rank daemons that take jobs.", len(svc.ready_members()))
        yield _gauge("netcoll_epoch", "Current membership epoch (0 before the first job).", svc.epoch)
        yield _gauge("netcoll_groups", "Rendezvous groups (embedded use) at this coordinator.", len(self.coord.groups))
        ended = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
        totals = svc.finished
        yield _counter(
            "netcoll_jobs",
            "Jobs that ended, by final state.",
            "state",
            {s.value: totals.get(s.value, 0) for s in ended},
        )
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily("netcoll_jobs_submitted", "Jobs accepted by the coordinator.", value=svc.submitted)
        queued = sum(j.state == JobState.QUEUED for j in list(svc.jobs.values()))
        yield _gauge("netcoll_jobs_queued", "Jobs waiting to run.", queued)
        yield _gauge("netcoll_jobs_running", "Jobs running now (at most one at a time).", int(svc.current is not None))


def _info(role: str, **extra: str) -> dict[str, str]:
    return {"role": role, **extra, "version": _version()}


# -- a rank ---------------------------------------------------------------------------------------
class CollectiveCollector:
    """This process's collectives (:mod:`netcoll.observe`): durations and outcomes."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        hist = HistogramMetricFamily(
            "netcoll_collective_duration_seconds",
            "Time from start to end of each collective that succeeded on this rank.",
            labels=["op", "algorithm"],
        )
        merged: dict[tuple[str, str], list[float]] = {}
        for (name, fp), row in list(observe.DURATIONS.fold().items()):
            key = (name, observe.algorithm_of(fp))
            acc = merged.setdefault(key, [0.0] * len(row))
            for i, v in enumerate(row):
                acc[i] += v
        outcomes = CounterMetricFamily(
            "netcoll_collectives",
            "Collectives that ended on this rank, by outcome (ok or reason).",
            labels=["op", "outcome"],
        )
        ok: dict[str, float] = {}
        for (name, algorithm), row in sorted(merged.items()):
            cumulative, buckets = 0.0, []
            for bound, n in zip((*observe.BUCKETS, float("inf")), row[:-2], strict=True):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            hist.add_metric([name, algorithm], buckets, row[-2])
            ok[name] = ok.get(name, 0.0) + row[-1]
        for name, n in sorted(ok.items()):
            outcomes.add_metric([name, "ok"], n)
        for (name, reason), n in sorted(observe.OUTCOMES.copy().items()):
            outcomes.add_metric([name, reason], n)
        yield hist
        yield outcomes
        yield from _result_pool()


def _result_pool() -> Iterator[Any]:
    """The process's pool of large result arrays (:mod:`netcoll.resultpool`)."""
    s = resultpool.RESULTS.stats()
    yield _gauge("netcoll_result_pool_free_bytes", "Bytes of result memory kept for reuse.", s["held_bytes"])
    yield _gauge("netcoll_result_pool_lent", "Pooled result blocks held by arrays now.", s["lent"])
    yield _counter(
        "netcoll_result_pool_blocks",
        "Large results served, by where their memory came from.",
        "source",
        {"new": s["made"], "reused": s["reused"]},
    )


class RankCollector:
    """A rank daemon: its state, jobs, buffers and links."""

    def __init__(self, daemon: RankDaemon, started: float | None) -> None:
        self.daemon, self.started = daemon, started

    def collect(self) -> Iterator[Any]:
        d = self.daemon
        yield _gauge(
            "netcoll_info",
            "Constant 1, labelled with the role, member id and version.",
            1,
            _info("rank", member_id=d.member_id),
        )
        if self.started is not None:
            yield _gauge("netcoll_start_time_seconds", "Unix time the process started serving.", self.started)
        yield _gauge(
            "netcoll_rank_registered", "Whether registered with the coordinator (1) or not (0).", int(d.registered)
        )
        yield _gauge("netcoll_rank_epoch", "Epoch of the current links (0: none yet).", d.epoch or 0)
        yield _gauge("netcoll_rank_rank", "Rank in the current epoch (-1: none yet).", -1 if d.rank is None else d.rank)
        yield _gauge(
            "netcoll_rank_busy", "Whether a job runs on this rank now (1) or not (0).", int(d.current_job is not None)
        )
        yield _counter(
            "netcoll_rank_jobs",
            "Jobs this daemon ran, by result.",
            "result",
            {"ok": d.jobs_done, "failed": d.jobs_failed},
        )
        buffers = list(d.buffers.values())
        yield _gauge("netcoll_rank_buffers", "Named tensors kept on this rank.", len(buffers))
        nbytes = sum(int(getattr(b, "nbytes", 0)) for b in buffers)
        yield _gauge("netcoll_rank_buffer_bytes", "Bytes held by named tensors.", nbytes)
        yield from _links(d)


def _links(d: RankDaemon) -> Iterator[Any]:
    """Per-peer traffic, backlog and link kind, from the current links' stats (they
    start at zero with each epoch's links, as after a restart)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    mesh = d.mesh
    stats = mesh.link_stats() if mesh is not None else {}
    sent = CounterMetricFamily("netcoll_peer_sent_bytes", "Payload bytes sent to each peer rank.", labels=["peer"])
    got = CounterMetricFamily(
        "netcoll_peer_received_bytes", "Payload bytes received from each peer rank.", labels=["peer"]
    )
    backlog = GaugeMetricFamily(
        "netcoll_peer_send_backlog_bytes", "Bytes queued for each peer that it has not taken yet.", labels=["peer"]
    )
    kind = GaugeMetricFamily(
        "netcoll_peer_link_info", "Constant 1, labelled with the kind of link to each peer.", labels=["peer", "kind"]
    )
    lane = CounterMetricFamily(
        "netcoll_peer_lane_frames",
        "Frames through the shared-memory lane of each peer's link (no system call).",
        labels=["peer", "direction"],
    )
    direct = CounterMetricFamily(
        "netcoll_peer_direct_messages",
        "Messages of each peer's shared-memory link read in place from the sender's memory (one copy);"
        " held: received ones read before their receive was posted (then copied again).",
        labels=["peer", "direction"],
    )
    for peer, s in stats.items():
        sent.add_metric([str(peer)], s.bytes_sent)
        got.add_metric([str(peer)], s.bytes_received)
        backlog.add_metric([str(peer)], s.send_backlog)
        kind.add_metric([str(peer), s.kind], 1)
        if s.kind == "shm":
            lane.add_metric([str(peer), "sent"], s.lane_sent)
            lane.add_metric([str(peer), "received"], s.lane_received)
            direct.add_metric([str(peer), "sent"], s.direct_sent)
            direct.add_metric([str(peer), "received"], s.direct_received)
            direct.add_metric([str(peer), "held"], s.direct_held)
    yield from (sent, got, backlog, kind, lane, direct)


# -- exposition -----------------------------------------------------------------------------------
Render = Callable[[], tuple[str, str]]


def _renderer(*collectors: Any) -> Render:
    """A registry of ``collectors`` plus the process collector; returns ``render() ->
    (content type, text)``, or raises :class:`MetricsUnavailable` when it is called
    without prometheus_client installed."""
    if not available():

        def unavailable() -> tuple[str, str]:
            raise MetricsUnavailable(UNAVAILABLE)

        return unavailable
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    for collector in collectors:
        registry.register(collector)

    def render() -> tuple[str, str]:
        return CONTENT_TYPE_LATEST, generate_latest(registry).decode("utf-8")

    return render


def coordinator_metrics(coord: Coordinator, svc: JobService, started: float | None = None) -> Render:
    """The ``/metrics`` renderer of a coordinator with its job service."""
    return _renderer(CoordinatorCollector(coord, svc, started))


def rank_metrics(daemon: RankDaemon, started: float | None = None) -> Render:
    """The ``/metrics`` renderer of a rank daemon."""
    return _renderer(RankCollector(daemon, started), CollectiveCollector())


__all__ = [
    "UNAVAILABLE",
    "CollectiveCollector",
    "CoordinatorCollector",
    "MetricsUnavailable",
    "RankCollector",
    "available",
    "coordinator_metrics",
    "rank_metrics",
]
