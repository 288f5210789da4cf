"""docs/observability.md states the numbers the code has: the board's heartbeat
interval (issue 38: the page said 1.5 s where the code gives 1 s) and the bounds of
the HTTP views."""

from __future__ import annotations

from pathlib import Path

from netcoll.limits import Limits
from netcoll.rendezvous.liveness import LEASE_BEATS
from netcoll.service import views

DOC = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()


def _fmt(x: float) -> str:
    return f"{x:g}"


def test_the_heartbeat_interval_is_the_codes() -> None:
    liveness = Limits().liveness_timeout_s
    assert f"`LEASE_BEATS = {LEASE_BEATS}`" in DOC
    assert f"`liveness_timeout_s = {liveness}`" in DOC
    assert f"**{_fmt(liveness / LEASE_BEATS)} s by default**" in DOC


def test_the_http_views_bounds_are_the_codes() -> None:
    stated = (
        f"at most {views.MAX_JOBS} queued and {views.MAX_JOBS} recent jobs, {views.MAX_ITEMS} items in any other list"
    )
    assert stated in " ".join(DOC.split())
    assert f"{views.MAX_TEXT} characters in a string, {views.MAX_BODY >> 20} MiB in all" in " ".join(DOC.split())
