"""Bookkeeping for the job service: members, jobs and their inputs (no I/O)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..arrays import array_from_meta
from ..escape import escape
from ..rpc import Session
from .jobs import JobSpec, JobState


def slowest_per_call(timings: Iterable[Sequence[float]], iters: int) -> list[float]:
    """Per call, the slowest rank's seconds, from every rank's ``iters`` call times (a job's
    time per call is their mean); empty unless every rank timed every call."""
    runs = list(timings)
    if not runs or any(len(t) != iters for t in runs):
        return []
    return [max(column) for column in zip(*runs, strict=True)]


@dataclass(eq=False)
class Daemon:
    """A rank daemon registered with the job service (a group's joiner at the rendezvous is a
    :class:`netcoll.rendezvous.groups.Member`)."""

    member_id: str
    session: Session
    host: str
    port: int
    rank_hint: int | None = None
    draining: bool = False
    since: float = field(default_factory=time.time)
    http_port: int | None = None  #: its HTTP health/metrics port (None: none)

    def describe(self) -> str:
        return f"{escape(self.member_id)} at {escape(self.host)}:{self.port}"


def rank_daemons(ready: list[Daemon], previous: tuple[str, ...] | None) -> list[Daemon]:
    """Order an epoch's rank daemons into ranks 0..n-1 (the service's rule; a rendezvous
    group's joiners get theirs from :func:`netcoll.rendezvous.groups.assign_ranks`):
    unchanged membership keeps its order; otherwise rank hints are honoured (when in
    range and unique) and the rest fill the free ranks in member-id order."""
    by_id = {m.member_id: m for m in ready}
    if previous is not None and set(previous) == set(by_id):
        return [by_id[mid] for mid in previous]
    n = len(ready)
    slots: list[Daemon | None] = [None] * n
    rest = []
    for m in sorted(ready, key=lambda m: m.member_id):
        h = m.rank_hint
        if h is not None and h < n and slots[h] is None:
            slots[h] = m
        else:
            rest.append(m)
    it = iter(rest)
    return [s if s is not None else next(it) for s in slots]


@dataclass
class Inputs:
    """Arrays a client sent with a job: ``same`` for every rank, one ``per_rank``,
    or one for the ``root`` only."""

    mode: str
    metas: list[dict[str, Any]]
    blobs: list[bytes]

    @property
    def per_rank(self) -> list[bytes] | None:
        return self.blobs if self.mode == "per_rank" else None

    def for_rank(self, rank: int, spec: JobSpec) -> tuple[dict[str, Any] | None, bytes | None]:
        if self.mode == "per_rank":
            if rank >= len(self.blobs):
                return None, None
            return self.metas[rank], self.blobs[rank]
        if self.mode == "root" and rank != spec.root:
            return None, None
        return self.metas[0], self.blobs[0]


def split_inputs(spec: JobSpec, inputs: Any, payload: memoryview) -> Inputs | None:
    """Check the ``inputs`` description of a submit against its payload."""
    if inputs is None:
        if spec.data == "inline" or spec.op == "put":
            raise ValueError(f"a {spec.op} job with data='inline' needs arrays")
        if payload.nbytes:
            raise ValueError("payload sent without an inputs description")
        return None
    if not isinstance(inputs, dict) or inputs.get("mode") not in ("same", "per_rank", "root"):
        raise ValueError("inputs must be {mode: same|per_rank|root, arrays: [...]}")
    metas = inputs.get("arrays")
    if not isinstance(metas, list) or not metas or len(metas) > 4096:
        raise ValueError("inputs.arrays must be a non-empty list of {dtype, shape, nbytes}")
    if inputs["mode"] != "per_rank" and len(metas) != 1:
        raise ValueError(f"inputs mode {inputs['mode']!r} takes exactly one array")
    blobs, offset = [], 0
    for meta in metas:
        nbytes = meta.get("nbytes") if isinstance(meta, dict) else None
        if not isinstance(nbytes, int) or nbytes < 0 or offset + nbytes > payload.nbytes:
            raise ValueError("inputs.arrays do not match the payload sent")
        arr = array_from_meta(meta, payload[offset : offset + nbytes])  # validates dtype/shape/size
        if spec.op != "put" and arr.dtype != spec.np_dtype:
            raise ValueError(f"the job says dtype={spec.dtype} but the array sent is {arr.dtype}")
        blobs.append(bytes(payload[offset : offset + nbytes]))
        offset += nbytes
    if offset != payload.nbytes:
        raise ValueError(f"payload has {payload.nbytes - offset} bytes beyond the arrays described")
    return Inputs(inputs["mode"], metas, blobs)


class Job:
    """One submitted job and everything known about it."""

    def __init__(self, job_id: int, spec: JobSpec, inputs: Inputs | None) -> None:
        self.id = job_id
        self.spec = spec
        self.inputs = inputs
        self.state = JobState.QUEUED
        self.error: str | None = None
        self.submitted_at = time.time()
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.epoch: int | None = None
        self.members: dict[int, str] = {}
        self.rank_of: dict[str, int] = {}
        self.addresses: dict[int, str] = {}
        self.reports: dict[int, dict[str, Any]] = {}
        self.payloads: dict[int, bytes] = {}
        self.lost: dict[int, str] = {}
        self.changed = asyncio.Event()
        self.done = asyncio.Event()
        self.cancel_requested = False
        self.watchers: set[Session] = set()
        #: the ranks' latest progress reports (:meth:`report_progress`; summed by :attr:`progress`)
        self.rank_progress: dict[int, dict[str, int]] = {}
        #: set (and replaced) whenever the job changes in a way a watcher would show
        self.updated = asyncio.Event()
        self.time_s: float | None = None
        self.algbw: float | None = None
        self.busbw: float | None = None
        self.verified: bool | None = None
        #: called once when the job ends (the service counts jobs by final state)
        self.on_finish: Callable[[Job], None] | None = None
        self.results_expired = False
        #: loop time the scheduler first considered the job: its deadline counts from here
        self.clock: float | None = None
        #: what a queued job waits for ("waiting for 2 more ranks (has 2 of 4)"), else None
        self.waiting: str | None = None
        #: the final record of a job finished before a coordinator restart (from the journal)
        self.stored: dict[str, Any] | None = None

    @classmethod
    def restore(cls, record: dict[str, Any]) -> Job:
        """A job that finished before the coordinator restarted, from its journaled record
        (queryable as it was; its result arrays are not kept across restarts)."""
        spec = record.get("spec") or {}
        job = cls(int(record["id"]), JobSpec.model_construct(**spec), None)
        job.state = JobState(record["state"])
        job.error = record.get("error")
        job.submitted_at = record.get("submitted_at") or job.submitted_at
        job.started_at, job.finished_at = record.get("started_at"), record.get("finished_at")
        job.epoch, job.busbw, job.algbw = record.get("epoch"), record.get("busbw"), record.get("algbw")
        job.verified = record.get("verified")
        job.results_expired = True
        job.stored = dict(record)
        if "time_us" in record:  # journaled before the JSON went all-seconds
            us = job.stored.pop("time_us")
            job.stored.setdefault("time_s", None if us is None else us / 1e6)
        job.done.set()
        return job

    @property
    def world_size(self) -> int:
        return len(self.members)

    def start(self, epoch: int, members: list[Daemon]) -> None:
        self.state, self.started_at, self.epoch = JobState.RUNNING, time.time(), epoch
        self.members = {r: m.member_id for r, m in enumerate(members)}
        self.rank_of = {m.member_id: r for r, m in enumerate(members)}
        self.addresses = {r: f"{m.host}:{m.port}" for r, m in enumerate(members)}
        self.notify()

    def finish(self, state: JobState, error: str | None) -> None:
        if self.state.done:
            return
        self.state, self.error, self.finished_at = state, error, time.time()
        self.inputs = None  # free client arrays
        self.done.set()
        self.changed.set()
        self.notify()
        if self.on_finish is not None:
            self.on_finish(self)

    # -- what watchers see ------------------------------------------------------------------
    def notify(self) -> None:
        """Wake every watcher (each waits on the event of the moment)."""
        self.updated.set()
        self.updated = asyncio.Event()

    def set_waiting(self, why: str | None) -> None:
        """What a queued job waits for (None: nothing); watchers hear of a change."""
        if why != self.waiting:
            self.waiting = why
            self.notify()

    def report_progress(self, rank: int, iteration: int, of: int, sent: int) -> None:
        """Rank ``rank`` has done ``iteration`` of ``of`` timed iterations and sent ``sent``
        payload bytes in this job; :attr:`progress` sums the ranks' reports."""
        self.rank_progress[rank] = {"iteration": iteration, "of": of, "bytes_sent": sent}
        self.notify()

    @property
    def progress(self) -> dict[str, Any]:
        """The ranks' progress reports summed ({} before the first)."""
        reports = self.rank_progress.values()
        if not reports:
            return {}
        return {
            "iteration": min(p["iteration"] for p in reports),  # done on every reporting rank
            "of": max(p["of"] for p in reports),
            "bytes_sent": sum(p["bytes_sent"] for p in reports),
            "ranks_reporting": len(reports),
        }

    def snapshot(self) -> dict[str, Any]:
        """The job as a progress event: ``state``, and what it waits for (queued) or how far
        it is (running: iterations, bytes sent by all ranks, ranks reporting, seconds run)."""
        event: dict[str, Any] = {"id": self.id, "state": self.state.value, "op": self.spec.op}
        if self.state == JobState.QUEUED:
            event["waiting"] = self.waiting
        elif self.state == JobState.RUNNING:
            event.update({"iteration": 0, "of": self.spec.iters, "bytes_sent": 0, "ranks_reporting": 0})
            event.update(self.progress)
            event.update(world_size=self.world_size, elapsed_s=time.time() - (self.started_at or time.time()))
        return event

    def record(self, with_results: bool = False) -> Any:
        if self.stored is not None:
            rec = dict(self.stored)
            return (dict(rec, results=[], results_expired=True), b"") if with_results else rec
        rec = {
            "id": self.id,
            "state": self.state.value,
            "op": self.spec.op,
            "error": self.error,
            "spec": self.spec.model_dump(),
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "epoch": self.epoch,
            "world_size": self.world_size,
            "ranks": [
                {"rank": r, "member_id": mid, "address": self.addresses.get(r)}
                for r, mid in sorted(self.members.items())
            ],
            "timings": {str(r): rep.get("timings", []) for r, rep in sorted(self.reports.items())},
            # rank -> {peer rank: link kind}: which connection each pair of ranks used
            "links": {str(r): rep.get("links", {}) for r, rep in sorted(self.reports.items())},
            # rank -> the cost model's parameters and choice: algorithm, segment, predicted/measured s
            "model": {str(r): rep.get("model") for r, rep in sorted(self.reports.items())},
            "time_s": self.time_s,  # mean seconds per timed iteration (slowest rank's)
            "algbw": self.algbw,
            "busbw": self.busbw,
            "verified": self.verified,
            "wrong": sum(int(rep.get("wrong") or 0) for rep in self.reports.values()),
            "progress": self.progress or None,
            "waiting": self.waiting if self.state == JobState.QUEUED else None,
        }
        if not with_results:
            return rec
        results, blobs, offset = [], [], 0
        for r in sorted(self.payloads):
            meta = self.reports.get(r, {}).get("result")
            data = self.payloads[r]
            results.append({"rank": r, "meta": meta, "offset": offset, "nbytes": len(data)})
            blobs.append(data)
            offset += len(data)
        rec["results"] = results
        rec["results_expired"] = self.results_expired
        return rec, b"".join(blobs)


def chosen(rec: dict[str, Any], op: str) -> dict[str, Any] | None:
    """What ``auto`` ran for ``op`` in a finished job, from its record (a rank's last choice
    in ``model``, the same on every rank: ``{"algorithm": "ring", "segment_bytes": ...}``),
    or None when the record does not say."""
    model = rec.get("model")
    if not isinstance(model, dict):
        return None
    for stats in model.values():
        choice = stats.get("choices", {}).get(op) if isinstance(stats, dict) else None
        if isinstance(choice, dict) and isinstance(choice.get("algorithm"), str):
            return choice
    return None
