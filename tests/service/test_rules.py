"""The job service's rules without a coordinator or a socket: admission
(netcoll.service.admission), the queue and its history (netcoll.service.queue), the
daemon registry and epochs (netcoll.service.registry) and a job's outcome
(netcoll.service.outcome), driven directly with stand-in sessions."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from netcoll.limits import Limits
from netcoll.service.admission import admit
from netcoll.service.jobs import JobSpec, JobState
from netcoll.service.outcome import accept, conclude
from netcoll.service.queue import JobQueue
from netcoll.service.records import Daemon, Inputs, Job
from netcoll.service.registry import Registry


def _session(host: str = "127.0.0.1", lost: Any = None) -> Any:
    """The parts of an RPC Session the rules read."""
    return SimpleNamespace(peer=(host, 40000), data={}, proto=SimpleNamespace(lost=lost))


def _member(mid: str, hint: int | None = None) -> Daemon:
    return Daemon(mid, _session(), "127.0.0.1", 1000, hint)


def _job(queue: JobQueue, **spec: Any) -> Job:
    job = Job(next(queue.ids), JobSpec(**{"op": "all_reduce", "size": 64, **spec}), None)
    queue.add(job)
    return job


# -- admission -----------------------------------------------------------------------------------


def test_admission_names_the_limit_a_submit_breaks() -> None:
    limits = Limits(max_world_size=8, max_deadline_s=600, max_job_bytes=100, max_queued_jobs=2)
    refusals = {
        "max_world_size": (JobSpec(op="all_reduce", world_size=9), None, 0),
        "max_deadline_s": (JobSpec(op="all_reduce", deadline=601), None, 0),
        "max_job_bytes": (JobSpec(op="all_reduce"), Inputs("same", [{}], [bytes(101)]), 0),
        "max_queued_jobs": (JobSpec(op="all_reduce"), None, 2),
    }
    for name, (spec, inputs, queued) in refusals.items():
        with pytest.raises(ValueError, match=name):
            admit(spec, inputs, ready=4, queued=queued, limits=limits)
    admit(
        JobSpec(op="all_reduce", world_size=8, deadline=600),
        Inputs("same", [{}], [bytes(100)]),
        ready=0,
        queued=1,
        limits=limits,
    )


def test_a_root_outside_the_ready_daemons_is_refused_unless_the_job_waits_for_more() -> None:
    with pytest.raises(ValueError, match=r"root 2 is out of range: 2 rank daemons are ready \(valid roots are 0..1\)"):
        admit(JobSpec(op="broadcast", root=2), None, ready=2, queued=0)
    admit(JobSpec(op="broadcast", root=2, world_size=3), None, ready=2, queued=0)  # it waits for a third
    admit(JobSpec(op="all_reduce"), None, ready=0, queued=0)  # no root


def test_the_queue_counts_submits_being_journaled_as_queued() -> None:
    queue = JobQueue(limits=Limits(max_queued_jobs=2))
    _job(queue)
    queue.submitting = 1
    with pytest.raises(ValueError, match="the queue is full: 2 jobs queued"):
        queue.admit(JobSpec(op="all_reduce"), None, ready=1)


# -- the queue -----------------------------------------------------------------------------------


def test_a_job_waiting_for_ranks_does_not_hold_up_a_later_one_that_can_run() -> None:
    queue = JobQueue()
    big, small = _job(queue, world_size=3), _job(queue, world_size=2)
    ready = [_member("b"), _member("a")]
    picked = queue.pick(ready, None, now=10.0)
    assert picked is not None and picked[0] is small
    assert [m.member_id for m in picked[1]] == ["a", "b"]  # sorted member ids without hints
    assert big.waiting == "waiting for 1 more rank (has 2 of 3)" and big.clock == 10.0
    assert list(queue.pending) == [big.id]
    assert queue.pick(ready, None, now=11.0) is None
    assert queue.idle_wait(now=11.0) == 1.0  # the poll; its deadline is far
    assert queue.pick(ready, None, now=10.0 + big.spec.deadline) is None
    assert big.state == JobState.FAILED and big.error is not None and "waited 300s for 3 rank daemon(s)" in big.error
    assert not queue.pending


def test_unchanged_membership_keeps_its_ranks_and_hints_are_honoured() -> None:
    queue = JobQueue()
    _job(queue)
    _job(queue)
    ready = [_member("a"), _member("b", hint=0)]
    first = queue.pick(ready, None, now=0.0)
    assert first is not None and [m.member_id for m in first[1]] == ["b", "a"]
    second = queue.pick(list(reversed(ready)), ("b", "a"), now=0.0)
    assert second is not None and [m.member_id for m in second[1]] == ["b", "a"]


def test_a_root_no_longer_among_the_chosen_ranks_fails_the_job_before_it_runs() -> None:
    queue = JobQueue()
    job = _job(queue, op="broadcast", root=1)
    assert queue.pick([_member("a")], None, now=0.0) is None
    assert (
        job.state == JobState.FAILED and job.error is not None and "root 1 is out of range for the 1 rank" in job.error
    )


def test_history_keeps_the_last_finished_jobs_and_expires_old_results() -> None:
    queue = JobQueue(history=2, limits=Limits(max_result_jobs=1, max_result_bytes=1 << 20))
    jobs = [_job(queue) for _ in range(4)]
    for job in jobs[:3]:
        job.payloads[0] = b"x"
        job.finish(JobState.SUCCEEDED, None)
    queue.trim()
    assert list(queue.jobs) == [jobs[1].id, jobs[2].id, jobs[3].id]  # the queued one always stays
    assert jobs[2].payloads and not jobs[1].payloads and jobs[1].results_expired
    assert [r["id"] for r in queue.recent(2)] == [jobs[2].id, jobs[3].id]
    assert "timings" not in queue.recent(1)[0]
    with pytest.raises(KeyError, match="no job 1"):
        queue.get({"id": jobs[0].id})


# -- the registry --------------------------------------------------------------------------------


def test_register_checks_the_daemon_and_drain_takes_it_out_of_the_ready_ones() -> None:
    reg = Registry()
    s0, s1 = _session(), _session()
    reg.register(s0, {"member_id": "d0", "listen_port": 1234, "rank_hint": 1})
    with pytest.raises(ValueError, match="already registered"):
        reg.register(s1, {"member_id": "d0", "listen_port": 1235})
    with pytest.raises(ValueError, match="listen_port must be a TCP port"):
        reg.register(s1, {"member_id": "d1", "listen_port": 70000})
    with pytest.raises(ValueError, match="cannot mix loopback and routable"):
        reg.register(_session("10.0.0.2"), {"member_id": "d2", "listen_port": 1})
    reg.register(s1, {"member_id": "d1", "listen_port": 1235})
    assert [m.member_id for m in reg.ready()] == ["d0", "d1"] and reg.daemon(s1) == "d1"
    assert reg.drain(s1) and [m.member_id for m in reg.ready()] == ["d0"]
    assert reg.remove(_session()) is None
    removed = reg.remove(s1)
    assert removed is not None and removed.member_id == "d1" and list(reg.members) == ["d0"]


def test_a_new_epoch_starts_when_the_members_change_or_after_relink() -> None:
    reg = Registry()
    a, b = _member("a"), _member("b")
    reg.begin([a, b])
    session = reg.session
    reg.begin([a, b])
    assert (reg.epoch, reg.session) == (1, session)
    reg.begin([a])
    assert reg.epoch == 2 and reg.epoch_members == ("a",)
    reg.relink()
    reg.begin([a])
    assert reg.epoch == 3 and reg.session != session


# -- a job's outcome -----------------------------------------------------------------------------


def _running(n: int, **spec: Any) -> Job:
    job = Job(1, JobSpec(**{"op": "all_reduce", "size": 64, **spec}), None)
    job.start(1, [_member(f"d{r}") for r in range(n)])
    return job


def test_reports_are_accepted_only_from_the_rank_s_own_daemon() -> None:
    job = _running(2)
    jobs = {job.id: job}
    assert accept(jobs, "d0", {"job_id": 1, "rank": 0, "ok": True}, memoryview(b"abc"))
    assert job.payloads == {0: b"abc"}
    with pytest.raises(ValueError, match="rank 1 of job 1 is not this daemon"):
        accept(jobs, "d0", {"job_id": 1, "rank": 1, "ok": True}, memoryview(b""))
    assert not accept(jobs, "d0", {"job_id": 2, "rank": 0}, memoryview(b""))


def test_conclude_names_lost_and_silent_ranks_and_a_result_that_did_not_verify() -> None:
    job = _running(3)
    job.reports[0] = {"ok": True}
    job.lost[1] = "rank 1 (d1) was lost: connection closed"
    conclude(job, False, lambda ranks: [f"rank {r} is unresponsive" for r in ranks])
    assert job.state == JobState.FAILED
    assert job.error == (
        "rank 1 (d1) was lost: connection closed; ranks [2] never reported within the deadline; rank 2 is unresponsive"
    )
    bad = _running(2)
    bad.reports = {0: {"ok": True, "verified": True}, 1: {"ok": True, "verified": False, "wrong": 3}}
    conclude(bad, False, lambda ranks: [])
    assert bad.error == "result did not verify on ranks [1] (3 wrong elements)"
    good = _running(2, iters=2)
    good.reports = {
        r: {"ok": True, "verified": True, "nbytes": 1000, "timings": [0.001, 0.003 - r * 0.002]} for r in (0, 1)
    }
    conclude(good, False, lambda ranks: [])
    assert good.state == JobState.SUCCEEDED and good.time_s == pytest.approx(0.002)
    assert good.algbw == pytest.approx(1000 / 0.002 / 1e9)
