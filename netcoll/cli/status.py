"""``netcoll status``: members, the queue and recent jobs."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..escape import escape
from .common import FORMATTER, JsonDoc, add_client_arguments, flags, print_json, run_client
from .connect import connected
from .progress import plural

if TYPE_CHECKING:
    from ..config import StatusConfig
    from .common import Subparsers

HELP = "show members, queue and recent jobs"


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "status",
        formatter_class=FORMATTER,
        help=HELP,
        description="Members (rank, address, epoch, state, current job), the queue and recent jobs.",
    )
    sp.add_argument("--jobs", type=int, metavar="N", help="recent jobs to show (default 10)")
    add_client_arguments(sp)
    sp.set_defaults(handler=run)
    return sp


def run(ns: argparse.Namespace) -> int:
    from ..config import StatusConfig

    with JsonDoc(bool(ns.json_output), coordinator=ns.coordinator) as doc:  # --json: one object, whatever happens
        cfg = StatusConfig.load(flags(ns))
        doc["coordinator"] = cfg.coordinator
        status = run_client(_status(cfg))
    if cfg.json_output:
        print_json({"coordinator": cfg.coordinator, **status})
    else:
        print_status(status, cfg.coordinator, cfg.jobs)
    return 0


async def _status(cfg: StatusConfig) -> dict[str, Any]:
    """The job service's view; at a coordinator without one (``netcoll run``'s, an embedded
    one), the rendezvous' (groups, members, the arrival board) under ``"rendezvous_only"``."""
    async with connected(cfg) as client:
        try:
            return await client.status()
        except ValueError as exc:
            if "unknown method" not in str(exc):
                raise
        return {"rendezvous_only": True, **await client.groups()}


def print_status(status: dict[str, Any], coordinator: str, njobs: int) -> None:
    """The cluster as text: a summary line, the members, the recent jobs (at a coordinator
    without a job service: its groups and their members)."""
    if status.get("rendezvous_only"):
        print_groups(status, coordinator)
        return
    members = status.get("members") or []
    jobs = status.get("jobs") or []
    current = status.get("current_job")
    running = next((j for j in jobs if j.get("id") == current), None)
    print(
        f"coordinator {coordinator}: {len(members)} rank daemon{'s' if len(members) != 1 else ''}, "
        f"epoch {status.get('epoch')}, {status.get('queued', 0)} queued"
        + (f", running job {current} ({running['op'] if running else '?'})" if current is not None else "")
    )
    if members or not status.get("board"):  # (embedded groups only: their board says it all)
        _print_members(members)
    shown = jobs[-njobs:] if njobs else []
    if shown:
        _print_jobs(shown)
    _print_board(status.get("board") or [])


def print_groups(status: dict[str, Any], coordinator: str) -> None:
    """A coordinator without a job service (``netcoll run``'s, an embedded one): each group,
    its members (rank, address, liveness), then the arrival board."""
    groups = status.get("groups") or []
    print(f"coordinator {coordinator}: no job service (netcoll run's, or embedded); {plural(len(groups), 'group')}")
    for g in groups:
        members = g.get("members") or []
        name, state = escape(g.get("name"), 100), escape(g.get("state"), 20)
        print(
            f"group {name!r}: {len(members)} of {g.get('world_size')} ranks, {state}, generation {g.get('generation')}"
        )
        if members:
            print(f"  {'rank':>4}  {'member':<34}{'address':<22}liveness")
        for m in sorted(members, key=lambda m: (m.get("rank") is None, m.get("rank") or 0)):
            rank = "-" if m.get("rank") is None else str(m.get("rank"))
            address = escape(f"{m.get('host')}:{m.get('port')}", 60)
            quiet = f" ({m['unresponsive_s']:g}s)" if isinstance(m.get("unresponsive_s"), (int, float)) else ""
            print(
                f"  {rank:>4}  {escape(m.get('member_id'), 32):<34}{address:<22}{escape(m.get('liveness'), 20)}{quiet}"
            )
    board = status.get("board") or []
    _print_board(board)
    if not board and groups:
        print("nothing stuck in flight (an operation shows here once ranks have waited in it for a few seconds)")


def _print_board(board: list[dict[str, Any]]) -> None:
    """The hang explainer: each operation ranks are in, who arrived and who not."""
    from ..rendezvous.board import lines

    if board:
        print("in flight (from the ranks' heartbeats):")
        for line in lines(board):
            print("  " + line)


def _print_members(members: list[dict[str, Any]]) -> None:
    if not members:
        print("  no rank daemons registered (start some: netcoll rank --coordinator HOST:PORT)")
        return
    print(f"  {'rank':>4}  {'member':<34}{'address':<22}{'http':>6}  {'state':<10}{'job':>5}  hint")
    for m in members:
        rank, job, hint, http = (
            "-" if m.get(k) is None else str(m[k]) for k in ("rank", "current_job", "rank_hint", "http_port")
        )
        member, address, state = (escape(m.get(k), 60) for k in ("member_id", "address", "state"))
        print(f"  {rank:>4}  {member:<34}{address:<22}{escape(http, 6):>6}  {state:<10}{job:>5}  {hint}")
    if any(m.get("rank") is None for m in members):
        print("  (rank '-': joins at the next job, which starts a new epoch)")


def _print_jobs(jobs: list[dict[str, Any]]) -> None:
    from ..service.local import gbps, human_time

    print("recent jobs:")
    print(
        f"  {'id':>4}  {'collective':<15}{'state':<11}{'ranks':>5}{'time/iter':>12}{'busbw GB/s':>12}  verified  "
        "error / waiting for"
    )
    for j in jobs:
        verified = {True: "yes", False: "NO", None: "-"}.get(j.get("verified"), "-")
        err = escape(j.get("error") or j.get("waiting") or "", 400)  # a queued job: what it waits for
        op, state = escape(j.get("op"), 40), escape(j.get("state"), 20)
        print(
            f"  {j.get('id'):>4}  {op:<15}{state:<11}{j.get('world_size') or 0:>5}"
            f"{human_time(j.get('time_s')):>12}{gbps(j.get('busbw')):>12}  {verified:<8}  "
            f"{err[:100] + ('...' if len(err) > 100 else '')}"
        )
    if any(j.get("time_s") is not None for j in jobs):
        print("  (time/iter: the mean of each iteration's slowest rank; netcoll submit shows each rank's own)")
