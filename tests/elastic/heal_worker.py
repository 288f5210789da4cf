"""One rank of tests/elastic/test_heal_processes.py, under ``netcoll run``: the last
``joiners`` ranks are joiners (``comm._joined``, as ``regroup`` marks a newcomer), the
others hold ``live_state``; every rank heals and prints its state's fingerprint."""

from __future__ import annotations

import asyncio
import json
import sys

import netcoll
import netcoll.elastic
from tests.elastic.states import fingerprint, live_state, stale_state

MARK = "HEALED "


async def main(joiners: int, scale: int) -> None:
    async with netcoll.connect(collective_timeout=120) as comm:
        comm._joined = comm.rank >= comm.world_size - joiners
        state = stale_state() if comm.joined else live_state(scale=scale)
        w = state["model"]["w"]
        got = await netcoll.elastic.heal(comm, state, slice_bytes=1 << 16, chunk_bytes=1 << 14, timeout=120)
        kinds = sorted({s["kind"] for s in comm.link_stats().values()})
        line = {"rank": comm.rank, "joined": comm.joined, "fingerprint": fingerprint(got), "step": got["step"]}
        print(MARK + json.dumps({**line, "in_place": got["model"]["w"] is w, "kinds": kinds}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
