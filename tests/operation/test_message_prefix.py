"""A failure's message names its operation once (issue 38, item 3): never "all_reduce #1
of group 'g' failed after 0.009s: all_reduce #1 of group 'g' failed: ...", in the log
line or in another rank's abort."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from netcoll.errors import CollectiveAborted, PeerLost
from netcoll.operation import detail
from tests.support.worlds import memory_world

WHERE = "all_reduce #1 of group 'default'"


def test_detail_drops_the_operation_it_begins_with() -> None:
    assert detail(f"{WHERE} failed: lost connection to rank 2", WHERE) == "lost connection to rank 2"
    assert detail(f"{WHERE} timed out after 3s on rank 1: waiting", WHERE) == "timed out after 3s on rank 1: waiting"
    assert detail("all_reduce #2 of group 'default' failed: x", WHERE) == "all_reduce #2 of group 'default' failed: x"
    assert detail("something else", WHERE) == "something else"


async def test_the_failure_log_line_names_the_operation_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "netcoll")
    hub, comms = memory_world(2)
    hub.kill(1)
    with pytest.raises(PeerLost) as lost:
        await comms[0].all_reduce(np.ones(2))
    where = f"all_reduce #{lost.value.seq} of group 'default'"
    assert str(lost.value).startswith(f"{where} failed: lost connection to rank 1")
    lines = [r.getMessage() for r in caplog.records if "failed after" in r.getMessage()]
    assert len(lines) == 1 and lines[0].count(where) == 1, lines
    assert lines[0].startswith(f"{where} failed after ") and ": lost connection to rank 1" in lines[0]


def test_an_abort_quotes_the_other_ranks_reason_without_its_prefix() -> None:
    from netcoll.operation import Operation

    async def run() -> CollectiveAborted:
        op = Operation("default", 1, "fp", (0, 1, 2), "all_reduce")
        op.start()
        op.on_abort({"origin": 2, "cause": "lost", "reason": f"{WHERE} failed: lost connection to rank 1"}, 0)
        assert isinstance(op.error, CollectiveAborted)
        return op.error

    error = asyncio.run(run())
    assert str(error) == f"{WHERE} aborted by rank 2 (lost): lost connection to rank 1"
