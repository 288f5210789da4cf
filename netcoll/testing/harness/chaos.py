"""Chaos (issue 10): jobs against a coordinator and rank-daemon processes on
loopback while rank daemons are SIGKILLed and SIGSTOPped at random points.

Starts ``python -m netcoll coordinator`` and ``--ranks`` ``python -m netcoll rank``
subprocesses on 127.0.0.1 (a token, default settings), then runs ``--jobs``
small generated-and-verified jobs one after another (all_reduce, broadcast,
all_gather, reduce_scatter). ``--kills`` + ``--stops`` of them, drawn by a seeded
RNG (``--seed``, printed), get a fault on a random daemon at a random point:

* ``before``: just before the job is submitted;
* ``during``: once the job is running, after a random part of its run;
* ``between``: then a random pause of up to 1 s, then the submit.

A killed daemon is replaced at once by a new process (a new member id), as an
orchestrator would. A quarter of the stopped ones are continued after a short
pause (0.2 s to ``PAUSE_MAX``, 2 s: a GC pause or a VM hiccup, well under
``liveness_timeout_s``); their job must succeed. The others stay stopped until
their job has ended, then are either continued (SIGCONT: a paused VM that comes
back after it was declared gone; it must rejoin cleanly) or killed and replaced
(a hung host that gets restarted), by the RNG. The job after each fault waits
for the group to be whole again and must succeed.

Invariants, checked for every job (exit 1 on any violation):

* it ends ``succeeded``, or ``failed`` naming the faulted rank (its rank number
  in the job or its member id) -- no other outcome, no hang (each wait is
  bounded), no job lost; a job with only a short pause succeeds;
* a failed job ended within ``--bound`` seconds (5) of the fault, by the job
  record's ``finished_at`` against the fault's wall-clock time (same host);
* the job after a fault succeeds on the re-formed group;
* at the end: no daemon died that was not killed, the coordinator's and the
  long-lived daemons' descriptors are back to their baseline, and after the
  shutdown every process started is gone.

    python3 -m netcoll.testing.harness.chaos --jobs 300 --kills 30 --stops 30 --ranks 3 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import re
import secrets
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ...service import Client
from .cluster import Cluster, Proc, settle

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
POSITIONS = ("before", "during", "between")
DONE = ("succeeded", "failed", "cancelled")
#: a stop that ends within this many seconds (below liveness_timeout_s, 4 s, with a margin)
#: must not fail the job: the daemon is slow, not gone
PAUSE_MAX = 2.0


@dataclass
class Fault:
    kind: str  # "kill" | "stop"
    position: str  # POSITIONS
    victim: str  # member id
    at: float = 0.0  # time.time() of the signal
    then: str = ""  # what became of a stopped daemon: "pause" (continued soon) | "cont" | "kill" (after the job)
    pause: float = 0.0  # seconds, for "pause"
    timer: asyncio.TimerHandle | None = None


@dataclass
class Tally:
    jobs: int = 0
    succeeded: int = 0
    failed: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    fault_to_end: dict[str, list[float]] = field(default_factory=lambda: {"kill": [], "stop": []})
    after_fault_ok: int = 0
    after_fault: int = 0
    problems: list[str] = field(default_factory=list)


class ChaosCluster(Cluster):
    """The coordinator of :class:`Cluster` and daemons with member ids of our own,
    started without waiting (a replacement comes up while jobs go on)."""

    def __init__(self, ranks: int, token: str, env: dict[str, str] | None = None) -> None:
        super().__init__(0, token)
        self.env.update(env or {})  # (may override the log level too)
        self.ranks = ranks
        self.daemons: dict[str, Proc] = {}  # member id -> its current process (alive or stopped)
        self.stopped: set[str] = set()
        self.killed: set[int] = set()  # pids we SIGKILLed
        self._next = 0

    def spawn(self) -> str:
        member = f"chaos-{self._next}"
        self._next += 1
        with open(os.path.join(self.tmp.name, member + ".log"), "wb") as err:
            popen = subprocess.Popen(
                [sys.executable, "-m", "netcoll", "rank", "--coordinator", self.address, "--host", "127.0.0.1",
                 "--port", "0", "--http-port", "off", "--member-id", member],
                env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        proc = Proc(member, popen, ("127.0.0.1", 0))
        self.procs.append(proc)
        self.daemons[member] = proc
        return member

    def signal(self, member: str, sig: signal.Signals) -> None:
        proc = self.daemons[member]
        if sig == signal.SIGKILL:
            self.killed.add(proc.pid)
            del self.daemons[member]
            self.stopped.discard(member)
        elif sig == signal.SIGSTOP:
            self.stopped.add(member)
        elif sig == signal.SIGCONT:
            self.stopped.discard(member)
        proc.popen.send_signal(sig)

    def died(self) -> list[str]:
        """Daemons (or the coordinator) that exited without being killed by us."""
        return [f"{p.name} (exit {p.popen.returncode})" for p in self.procs
                if p.popen.poll() is not None and p.pid not in self.killed]  # fmt: skip

    async def start(self) -> None:
        self._spawn("coordinator", ["coordinator", "--host", "127.0.0.1", "--port", "0"])
        for _ in range(self.ranks):
            self.spawn()

    async def stop(self) -> None:
        for member in list(self.stopped):
            self.signal(member, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        await super().stop()


async def whole(cluster: ChaosCluster, client: Any, seconds: float = 30.0) -> str | None:
    """Wait (bounded) until exactly the daemons we run are registered and ready."""
    want = set(cluster.daemons)
    deadline = time.monotonic() + seconds
    have: set[str] = set()
    while time.monotonic() < deadline:
        rows = await client.members()
        have = {r["member_id"] for r in rows if r["state"] == "ready"}
        if have == want and len(rows) == len(want):
            return None
        await asyncio.sleep(0.05)
    return f"the group did not re-form within {seconds:g}s: registered {sorted(have)}, running {sorted(want)}"


def names(rec: dict[str, Any], member: str) -> bool:
    """Does the failed job's error name ``member`` (its member id or its rank in the job)?"""
    error = str(rec.get("error") or "")
    ranks = [r["rank"] for r in rec.get("ranks") or () if r.get("member_id") == member]
    return member in error or any(re.search(rf"\brank {r}\b", error) for r in ranks)


class Chaos:
    """One run: ``jobs`` jobs, ``kills`` + ``stops`` of them with a fault."""

    def __init__(self, cluster: ChaosCluster, client: Any, rng: random.Random, opts: dict[str, Any]) -> None:
        self.cluster, self.client, self.rng, self.opts = cluster, client, rng, opts
        self.tally = Tally()
        self.faults: list[dict[str, Any]] = []
        self.durations: list[float] = [0.05]

    def plan(self, jobs: int, kills: int, stops: int) -> dict[int, str]:
        """Which jobs get a fault of which kind: never two in a row (the job after a
        fault checks the re-formed group), never the first."""
        slots = list(range(1, jobs - 1, 2))
        if kills + stops > len(slots):
            raise ValueError(f"{kills + stops} faults need at least {2 * (kills + stops) + 2} jobs")
        chosen = self.rng.sample(slots, kills + stops)
        kinds = ["kill"] * kills + ["stop"] * stops
        self.rng.shuffle(kinds)
        return dict(zip(chosen, kinds, strict=True))

    def inflict(self, fault: Fault) -> None:
        fault.at = time.time()
        if fault.kind == "kill":
            self.cluster.signal(fault.victim, signal.SIGKILL)
            self.cluster.spawn()  # the orchestrator restarts it: a new process, a new member id
        else:
            self.cluster.signal(fault.victim, signal.SIGSTOP)
            if self.rng.random() < 0.25:  # a short pause (a GC pause, a VM hiccup): continued soon
                fault.then, fault.pause = "pause", round(self.rng.uniform(0.2, PAUSE_MAX), 2)
                cont = functools.partial(self.cluster.signal, fault.victim, signal.SIGCONT)
                fault.timer = asyncio.get_running_loop().call_later(fault.pause, cont)

    def recover(self, fault: Fault) -> None:
        """After the job: continue a stopped daemon, or kill and replace it."""
        if fault.kind != "stop":
            return
        if fault.then == "pause":
            if fault.timer is not None and fault.victim in self.cluster.stopped:  # the job ended first
                fault.timer.cancel()
                self.cluster.signal(fault.victim, signal.SIGCONT)
            return
        fault.then = self.rng.choice(("cont", "cont", "cont", "kill"))
        if fault.then == "cont":
            self.cluster.signal(fault.victim, signal.SIGCONT)
        else:
            self.cluster.signal(fault.victim, signal.SIGKILL)
            self.cluster.spawn()

    async def job(self, i: int, fault: Fault | None) -> dict[str, Any]:
        op, o = OPS[i % len(OPS)], self.opts
        if fault is not None and fault.position != "during":
            self.inflict(fault)
            if fault.position == "between":
                await asyncio.sleep(self.rng.uniform(0, 1.0))
        during = fault is not None and fault.position == "during"
        # a job to fault "during" runs 10x as many iterations, so that the fault (at a
        # random point within about 2 ordinary job lengths of its start) lands inside it
        iters = o["iters"] * (10 if during else 1)
        jid = await self.client.submit(op, size=o["size"], iters=iters, deadline=o["deadline"])
        if fault is not None and during:
            async with asyncio.timeout(o["deadline"]):
                while (await self.client.job(jid))["state"] == "queued":  # noqa: ASYNC110 - bounded
                    await asyncio.sleep(0.005)
            await asyncio.sleep(self.rng.uniform(0, 2 * statistics.median(self.durations)))
            self.inflict(fault)
        rec: dict[str, Any] = await self.client.wait(jid, timeout=o["deadline"] + 30)
        if rec["state"] not in DONE:
            self.tally.problems.append(f"job {jid} ({op}) still {rec['state']} after {o['deadline'] + 30:g}s")
            await self.client.cancel(jid)
            rec = await self.client.wait(jid, timeout=30)
        rec.pop("results", None)
        return rec

    def judge(self, rec: dict[str, Any], fault: Fault | None, after_fault: bool) -> None:
        t, state = self.tally, rec["state"]
        t.jobs += 1
        what = f"job {rec['id']} ({rec['op']}, epoch {rec.get('epoch')})"
        if state == "succeeded":
            t.succeeded += 1
            if fault is None and rec.get("started_at") and rec.get("finished_at"):
                self.durations = [*self.durations[-50:], rec["finished_at"] - rec["started_at"]]
        else:
            t.failed += state == "failed"
            if fault is None or state != "failed" or not names(rec, fault.victim):
                t.problems.append(f"{what} {state}: {rec.get('error')} (fault: {fault})")
        if after_fault:
            t.after_fault += 1
            t.after_fault_ok += state == "succeeded"
            if state != "succeeded":
                t.problems.append(f"{what}, the first job after a fault, did not succeed")
        if fault is None:
            return
        took = None if rec.get("finished_at") is None else round(rec["finished_at"] - fault.at, 3)
        row = {"job": rec["id"], "kind": fault.kind, "position": fault.position, "victim": fault.victim,
               "state": state, "fault_to_end_s": took, "then": fault.then or None,
               "error": str(rec.get("error") or "")[:200] or None}  # fmt: skip
        self.faults.append(row)
        key = f"{fault.kind} {fault.position}"
        t.faults[key] = t.faults.get(key, 0) + 1
        if fault.then == "pause" and state != "succeeded":
            t.problems.append(f"{what}: a {fault.pause:g}s pause of {fault.victim} failed it: {rec.get('error')}")
        elif state == "failed" and took is not None:
            t.fault_to_end[fault.kind].append(took)
            if not 0 <= took <= self.opts["bound"]:
                t.problems.append(f"{what} failed {took:.2f}s after the fault (bound {self.opts['bound']:g}s)")

    async def run(self, jobs: int, plan: dict[int, str], say: Any) -> None:
        after_fault = False
        for i in range(jobs):
            if after_fault and (err := await whole(self.cluster, self.client)):
                self.tally.problems.append(err)
                return
            fault = None
            if i in plan:
                victims = sorted(m for m in self.cluster.daemons if m not in self.cluster.stopped)
                fault = Fault(plan[i], self.rng.choice(POSITIONS), self.rng.choice(victims))
            rec = await self.job(i, fault)
            if fault is not None:
                self.recover(fault)
            self.judge(rec, fault, after_fault)
            after_fault = fault is not None
            if fault is not None:
                say(f"job {rec['id']}: {json.dumps(self.faults[-1])}")
            if died := self.cluster.died():
                self.tally.problems.append(f"died without being killed: {died}")
                return
            if len(self.tally.problems) >= 5:
                return


def spread(xs: list[float]) -> dict[str, float | None]:
    return {
        "n": len(xs),
        "median_s": round(statistics.median(xs), 2) if xs else None,
        "max_s": round(max(xs), 2) if xs else None,
    }


async def chaos(
    *,
    jobs: int = 100,
    kills: int = 10,
    stops: int = 10,
    ranks: int = 3,
    seed: int | None = None,
    size: str = "256KiB",
    iters: int = 20,
    deadline: float = 60.0,
    bound: float = 5.0,
    env: dict[str, str] | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Run the chaos test; return the report (``report["ok"]``, ``report["problems"]``)."""
    say = log or (lambda *a: None)
    seed = secrets.randbits(32) if seed is None else seed
    say(f"chaos: seed {seed}, {jobs} jobs, {kills} kills, {stops} stops, {ranks} ranks")
    rng = random.Random(seed)
    token = secrets.token_hex(16)
    opts = {"size": size, "iters": iters, "deadline": deadline, "bound": bound}
    t0 = time.monotonic()
    fds_before = len(os.listdir("/proc/self/fd"))
    cluster = ChaosCluster(ranks, token, env)
    try:
        await cluster.start()
        async with Client(cluster.address, token=token) as client:
            run = Chaos(cluster, client, rng, opts)
            if err := await whole(cluster, client, 60.0):
                raise RuntimeError(err)
            warm = await client.run("all_reduce", size=size, timeout=deadline)  # links up: the baseline has them
            if warm["state"] != "succeeded":
                raise RuntimeError(f"the warm-up job {warm['state']}: {warm.get('error')}")
            baseline = cluster.sample()
            await run.run(jobs, run.plan(jobs, kills, stops), say)
            end = await ending(cluster, client, baseline, run.tally)
    finally:
        await cluster.stop()
    left = [p.name for p in cluster.procs if p.popen.poll() is None]
    t = run.tally
    if left:
        t.problems.append(f"still running after the shutdown: {left}")
    return {
        "seed": seed, "ranks": ranks, "jobs": t.jobs, "succeeded": t.succeeded, "failed": t.failed,
        "kills": kills, "stops": stops, "faults_by_position": t.faults,
        "stops_then": {w: sum(f["then"] == w for f in run.faults) for w in ("pause", "cont", "kill")},
        "fault_to_failed_end": {k: spread(v) for k, v in t.fault_to_end.items()},
        "bound_s": bound, "after_fault_succeeded": f"{t.after_fault_ok}/{t.after_fault}",
        "processes_started": len(cluster.procs), "processes_left": len(left),
        "fds": end, "client_fds_delta": len(os.listdir("/proc/self/fd")) - fds_before,
        "seconds": round(time.monotonic() - t0, 1), "faults": run.faults, "problems": t.problems,
        "ok": not t.problems and t.jobs == jobs,
    }  # fmt: skip


async def ending(cluster: ChaosCluster, client: Any, baseline: dict[str, Any], tally: Tally) -> dict[str, Any]:
    """The group whole again and the descriptors of the long-lived processes back to their
    baseline (bounded waits); returns {process: (fds at baseline, fds now)}."""
    if err := await whole(cluster, client):
        tally.problems.append(err)
    alive = {p.name: p.pid for p in cluster.procs if p.popen.poll() is None}
    kept = {name: b for name, b in baseline.items() if name in alive}
    await settle(cluster, kept)
    for p in cluster.procs:
        if "Traceback" in (text := cluster.log(p.name)):
            tally.problems.append(f"{p.name} logged a traceback: {text[-600:]}")
    now = cluster.sample()
    out = {}
    for name, b in kept.items():
        out[name] = (b["fds"], now.get(name, {}).get("fds"))
        if out[name][1] is None or out[name][1] > b["fds"]:
            tally.problems.append(f"{name}: {out[name][1]} open descriptors, {b['fds']} at the start")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200, help="jobs in all (default 200)")
    ap.add_argument("--kills", type=int, default=20, help="jobs with a SIGKILLed daemon (default 20)")
    ap.add_argument("--stops", type=int, default=20, help="jobs with a SIGSTOPped daemon (default 20)")
    ap.add_argument("--ranks", type=int, default=3, help="rank daemon processes (default 3)")
    ap.add_argument("--seed", type=int, help="RNG seed (default: random, printed)")
    ap.add_argument("--size", default="256KiB", help="bytes per rank per job (default 256KiB)")
    ap.add_argument("--iters", type=int, default=20, help="iterations per job (default 20)")
    ap.add_argument("--bound", type=float, default=5.0, help="fault -> failed job end, seconds (default 5)")
    ap.add_argument("--json", action="store_true", help="print the report on one line")
    args = ap.parse_args(argv)
    report = asyncio.run(
        chaos(
            jobs=args.jobs, kills=args.kills, stops=args.stops, ranks=args.ranks, seed=args.seed,
            size=args.size, iters=args.iters, bound=args.bound,
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )
    )  # fmt: skip
    print(json.dumps(report, indent=None if args.json else 2, default=str))
    for problem in report["problems"]:
        print("VIOLATION:", problem, file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
