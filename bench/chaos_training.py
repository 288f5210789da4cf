"""Chaos, measured (issue 35 item 6): a training run of ``--steps`` steps on 4 ranks
where a rank is SIGKILLed every ``--kill-every`` steps and a replacement joins.

Each rank (this module with ``--worker``, a process of its own) trains a small MLP
in numpy (:mod:`bench.chaoslib`) through ``netcoll.sync``: per step one
``all_reduce`` (average) of the gradients and the loss, then SGD with momentum.
Around the step, the loop of docs/training.md ("Elastic DDP"): on a
``NetcollError`` (and every ``--regroup-every`` steps) ``regroup``; after a
change, the survivors agree on one state (the most advanced one's) and
``heal`` gives joiners the parameters, momentum and step. Batch ``step`` is fixed
by the step number and split over whichever ranks are live, so a step done again
is the same step and the run's parameters follow the run without failures.

The parent starts a coordinator and 4 ranks; whenever the ranks have finished step
``k * --kill-every + --kill-offset`` (2: not a regroup's step) and the group is 4
again, it waits a random part of a step (seeded) and SIGKILLs one (rank ``k mod
4`` for the ``k``-th kill), and starts a replacement at once, which
connects with ``elastic=True`` and is admitted by the next regroup. Measured per
failure, from the ranks' own clocks (one host): seconds from the kill to the
next completed step on the survivors (and to the error, and to the regroup),
steps lost (the step in progress when the rank died, done again), steps
repeated (completed steps done again: 0 here, as the survivors take the most
advanced state), and the replacement's seconds from its start to its
admission. At the end: every rank's parameters bit-identical, and their loss on
a fixed evaluation batch against the same steps in one process without
failures.

    python3 -m bench.chaos_training                                   # 220 steps, a kill every 20
    python3 -m bench.chaos_training --json bench/chaos-training-results.json
    python3 -m bench.chaos_training --render bench/chaos-training-results.json   # the table
    python3 -m bench.chaos_training --docs bench/chaos-training-results.json     # ... into docs/training.md

Loopback only: the coordinator and the ranks listen on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import sys
import time
from typing import Any

from bench import chaoslib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs", "training.md")
BEGIN, END = "<!-- chaos-results -->", "<!-- /chaos-results -->"
RANKS = 4
Event = dict[str, Any]


class Proc:
    """One rank process and the JSON events it printed."""

    def __init__(self, proc: asyncio.subprocess.Process, started: float) -> None:
        self.proc, self.started = proc, started
        self.events: list[Event] = []
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                print(line.decode(errors="replace").rstrip(), file=sys.stderr)

    def last(self, kind: str) -> Event | None:
        return next((e for e in reversed(self.events) if e["event"] == kind), None)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


async def spawn(address: str, rank: int | None, opts: argparse.Namespace) -> Proc:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    cmd = [
        sys.executable,
        "-m",
        "bench.chaos_training",
        "--worker",
        address,
        "--rank",
        str(-1 if rank is None else rank),
    ]
    cmd += ["--steps", str(opts.steps), "--regroup-every", str(opts.regroup_every), "--pause", str(opts.pause)]
    started = time.time()
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, env=env, cwd=ROOT)
    return Proc(proc, started)


def progress(procs: list[Proc]) -> tuple[int, int]:
    """The highest step any live rank finished, and the world it was finished in."""
    steps = [e for p in procs if p.alive for e in [p.last("step")] if e is not None]
    best = max(steps, key=lambda e: e["step"], default=None)
    return (best["step"], best["world"]) if best else (0, RANKS)


async def chaos(address: str, opts: argparse.Namespace) -> tuple[list[Proc], list[Event]]:
    """Run the ranks, kill one every ``kill_every`` steps, start its replacement."""
    procs = [await spawn(address, r, opts) for r in range(RANKS)]
    kills: list[Event] = []
    rng = random.Random(opts.seed)
    deadline = time.monotonic() + opts.limit
    while any(p.alive for p in procs):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the run did not end within {opts.limit}s")
        step, world = progress(procs)
        due = (len(kills) + 1) * opts.kill_every + opts.kill_offset
        if step >= due and world == RANKS and due + opts.kill_every <= opts.steps:  # time for a replacement
            k = len(kills)
            await asyncio.sleep(rng.uniform(0, opts.pause))  # anywhere in the step
            victim = next(p for p in procs if p.alive and (e := p.last("step")) and e["rank"] == k % RANKS)
            t = time.time()
            os.kill(victim.proc.pid, signal.SIGKILL)
            await victim.proc.wait()
            kills.append({"kill": k, "time": t, "step": step, "victim_rank": k % RANKS, "victim": victim})
            procs.append(await spawn(address, None, opts))
            print(f"step {step}: SIGKILL rank {k % RANKS}; replacement started", flush=True)
        await asyncio.sleep(0.005)
    return procs, kills


def measure(procs: list[Proc], kills: list[Event]) -> list[dict[str, Any]]:
    """Per failure: recovery, detection and regroup seconds, steps lost and repeated, join seconds."""
    rows = []
    for n, kill in enumerate(kills):
        t, victim = kill["time"], kill["victim"]
        t_next = kills[n + 1]["time"] if n + 1 < len(kills) else float("inf")
        survivors = [p for p in procs if p is not victim and p.started < t and any(e["time"] > t for e in p.events)]
        firsts, fails, regroups, lost, repeated = [], [], [], 0, 0
        for p in survivors:
            after = [e for e in p.events if t < e["time"] < t_next]
            regroup = next(e for e in after if e["event"] == "regrouped" and e["world"] == RANKS - 1)
            fail = next((e for e in after if e["event"] == "failed" and e["time"] < regroup["time"]), None)
            first = next(e for e in after if e["event"] == "step" and e["time"] > regroup["time"])
            firsts.append(first["time"])
            regroups.append(regroup["time"])
            if fail is not None:
                fails.append(fail["time"])
                lost = max(lost, fail["step"] + 1 - regroup["step"])  # in progress at the failure, done again
            before = max(e["step"] for e in p.events if e["event"] == "step" and e["time"] < regroup["time"])
            repeated = max(repeated, before - regroup["step"])  # completed, then undone
        joiner = next((p for p in procs if p.started >= t and p.last("joined")), None)
        joined = joiner.last("joined") if joiner else None
        rows.append(
            {
                "kill_step": kill["step"],
                "victim_rank": kill["victim_rank"],
                "recovery_s": round(max(firsts) - t, 4),
                "detect_s": round(min(fails) - t, 4) if fails else None,
                "regroup_s": round(max(regroups) - t, 4),
                "steps_lost": lost,
                "steps_repeated": repeated,
                "join_s": round(joined["time"] - joiner.started, 3) if joiner and joined else None,
                "joined_at_step": joined["step"] if joined else None,
            }
        )
    return rows


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    import netcoll

    procs: list[Proc] = []
    async with netcoll.Coordinator() as coord:
        try:
            procs, kills = await chaos(coord.address, opts)
        finally:
            for p in procs:
                if p.alive:
                    p.proc.kill()
                    await p.proc.wait()
                await asyncio.gather(p.reader, return_exceptions=True)
    ends = [p for p in procs if p.proc.returncode == 0]
    done = [e for p in ends for e in [p.last("done")] if e is not None]
    failures = measure(procs, kills)
    return {
        "failures": failures,
        "final": chaoslib.compare(done, opts.steps),
        "exits": [p.proc.returncode for p in procs],
    }


def _cell(value: Any, fmt: str = "{:.2f}") -> str:
    return "–" if value is None else fmt.format(value)


def render(path: str) -> str:
    """A ``--json`` file as the Markdown of docs/training.md ("Chaos, measured")."""
    with open(path) as f:
        data = json.load(f)
    lines = [
        "| kill at step | rank killed | kill → next step done (s) | kill → error seen (s) | kill → regrouped (s)"
        " | steps lost | steps repeated | replacement: start → admitted (s) | admitted at step |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["failures"]:
        lines.append(
            f"| {r['kill_step']} | {r['victim_rank']} | {r['recovery_s']:.3f} | {_cell(r['detect_s'], '{:.3f}')}"
            f" | {r['regroup_s']:.3f} | {r['steps_lost']} | {r['steps_repeated']} | {_cell(r['join_s'])}"
            f" | {_cell(r['joined_at_step'], '{}')} |"
        )
    rec = [r["recovery_s"] for r in data["failures"]]
    fin, c, m = data["final"], data["config"], data["machine"]
    lines += [
        "",
        f"{len(rec)} failures in {c['steps']} steps at {c['ranks']} ranks: kill → next completed step median "
        f"{statistics.median(rec):.3f} s, worst {max(rec):.3f} s (goal: under 5 s); steps lost at most "
        f"{max(r['steps_lost'] for r in data['failures'])} (goal: at most the step in progress), steps repeated "
        f"at most {max(r['steps_repeated'] for r in data['failures'])}. Final parameters: bit-identical on the "
        f"{fin['ranks']} ranks: {'yes' if fin['identical'] else 'NO'}; loss on the evaluation batch "
        f"{fin['eval_loss']:.6f} against {fin['reference_eval_loss']:.6f} for the same {c['steps']} steps without "
        f"failures (one process): {fin['loss_diff_pct']:.2g} % apart (goal: within 1 %); max |parameter difference| "
        f"{fin['max_param_diff']:.1e}.",
        "",
        f"_{data['date']}; {m['cpus']} CPUs ({m['cpu']}), Python {m['python']}, numpy {m['numpy']}, netcoll "
        f"{m['netcoll']} ({m['commit']}); load average {data['load_before']} → {data['load_after']}; a step of "
        f"{c['batch']} samples plus {c['pause']} s of stand-in work, regroup every {c['regroup_every']} steps; "
        f"from `{os.path.relpath(path, ROOT)}`._",
    ]
    return "\n".join(lines)


def docs_with(text: str, table: str) -> str:
    """``text`` (docs/training.md) with ``table`` between the markers."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def ok(result: dict[str, Any]) -> bool:
    """Right (not fast): 4 ranks at the end, bit-identical, as without failures, no step lost beyond one."""
    fin, failures = result["final"], result["failures"]
    right = bool(fin["identical"]) and fin["ranks"] == RANKS and fin["loss_diff_pct"] < 1.0
    return right and bool(failures) and all(f["steps_lost"] <= 1 and f["steps_repeated"] == 0 for f in failures)


def main() -> None:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--worker", metavar="ADDRESS", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=220)
    ap.add_argument("--kill-every", type=int, default=20)
    ap.add_argument("--kill-offset", type=int, default=2, help="kill after step k*kill_every + this (not at a regroup)")
    ap.add_argument("--seed", type=int, default=35, help="of the kills' delays into the step")
    ap.add_argument("--regroup-every", type=int, default=5, help="steps between regroups (a replacement gets in)")
    ap.add_argument("--pause", type=float, default=0.1, help="seconds of stand-in work per step")
    ap.add_argument("--limit", type=float, default=900.0, help="seconds the run may take")
    ap.add_argument("--json", help="write the figures (and the machine) to this file")
    ap.add_argument("--render", metavar="JSON", help="print a --json file as Markdown, and stop")
    ap.add_argument("--docs", metavar="JSON", help="write a --json file's table into docs/training.md, and stop")
    args = ap.parse_args()
    if args.worker:
        rank = None if args.rank < 0 else args.rank
        chaoslib.run_rank(args.worker, rank, args.steps, args.regroup_every, args.pause)
        return
    if args.render:
        print(render(args.render))
        return
    if args.docs:
        with open(DOCS) as page:
            text = docs_with(page.read(), render(args.docs))
        with open(DOCS, "w") as page:
            page.write(text)
        return
    from bench.machine import facts, loadavg

    before = loadavg()
    result = asyncio.run(run(args))
    config = {"steps": args.steps, "ranks": RANKS, "kill_every": args.kill_every, "kill_offset": args.kill_offset}
    config |= {"seed": args.seed}
    config |= {"regroup_every": args.regroup_every, "pause": args.pause, "batch": chaoslib.BATCH}
    f = facts()
    machine = {k: f[k] for k in ("cpu", "kernel", "python", "numpy", "netcoll", "commit")} | {"cpus": f["nproc"]}
    data: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine}
    data["config"] = config
    data |= {"load_before": before, "load_after": loadavg(), **result}
    print(json.dumps({k: data[k] for k in ("failures", "final", "exits")}, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(data, out, indent=1)
    sys.exit(0 if ok(result) else 1)


if __name__ == "__main__":
    main()
