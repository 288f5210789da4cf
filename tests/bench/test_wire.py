"""bench/wire.py (issue 36.4): the figures it derives from every rank's lines (the slowest
rank per call, the median over repetitions, the ratios), its cases, and the docs' tables
kept equal to bench/wire-results.json. Nothing here builds namespaces or times anything."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

from bench import wire, wire_report

ROOT = Path(__file__).resolve().parents[2]


def _args(**over: Any) -> argparse.Namespace:
    args = wire.build_parser().parse_args([])
    for k, v in over.items():
        setattr(args, k, v)
    return args


def _line(case: str, rep: int, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"kind": "all_reduce", "case": case, "rep": rep, "seconds": seconds, "cpu": 0.1, "err": 0.0,
            "right": True, **extra}  # fmt: skip


def _hello(*links: str) -> dict[str, Any]:
    return {"kind": "hello", "rank": 0, "links": list(links or ("tcp",))}


def test_the_slowest_rank_per_call_then_the_median_and_the_ratios() -> None:
    lines = [
        [_hello(), _line("gloo", 0, 1.0), _line("gloo", 1, 2.0), _line("gloo", 2, 1.0), _line("netcoll fp16", 0, 0.5)],
        [_hello(), _line("gloo", 0, 1.5), _line("gloo", 1, 1.0), _line("gloo", 2, 0.9), _line("netcoll fp16", 0, 0.25)],
    ]
    res = wire_report.summarize(_args(ranks=2, size=1 << 30), lines, {"netem": False}, command="x")
    rows = {r["case"]: r for r in res["all_reduce"]}
    assert rows["gloo"]["samples_s"] == [1.5, 2.0, 1.0]  # each call: its slowest rank
    assert rows["gloo"]["seconds"] == 1.5  # the median over repetitions
    assert rows["netcoll fp16"]["vs_gloo"] == 3.0
    assert rows["gloo"]["busbw_gbs"] == pytest.approx((1 << 30) / 1.5 / 1e9, rel=1e-3)
    assert res["delay_s"] == 0.0 and res["ddp"] == []


def test_a_wrong_result_is_recorded() -> None:
    lines = [[_hello(), _line("netcoll int8", 0, 1.0, right=False, err=0.5)], [_hello(), _line("netcoll int8", 0, 1.0)]]
    res = wire_report.summarize(_args(), lines, {}, command="x")
    assert res["all_reduce"][0]["right"] is False and res["all_reduce"][0]["max_rel_err"] == 0.5


def test_the_run_is_refused_unless_every_rank_used_the_asked_links() -> None:
    ok = [[_hello("tls"), _line("netcoll none", 0, 1.0)], [_hello("tls"), _line("netcoll none", 0, 1.0)]]
    res = wire_report.summarize(_args(link="tls"), ok, {}, command="x")
    assert res["link"] == "tls"
    assert "netcoll's links TLS" in "\n".join(wire_report._run_table("tls", res))
    mixed = [[_hello("tls"), _line("netcoll none", 0, 1.0)], [_hello("tcp", "tls"), _line("netcoll none", 0, 1.0)]]
    with pytest.raises(RuntimeError, match="not tls alone"):
        wire_report.summarize(_args(link="tls"), mixed, {}, command="x")
    with pytest.raises(RuntimeError, match="not tcp alone"):
        wire_report.summarize(_args(), ok, {}, command="x")


def test_cases_gloo_then_every_algorithm_and_codec() -> None:
    got = [c["label"] for c in wire.cases(_args(algorithms="ring,weighted", codecs="none"))]
    assert got == ["gloo", "netcoll none ring", "netcoll none weighted"]
    assert [c["label"] for c in wire.cases(_args(no_gloo=True))] == [f"netcoll {c}" for c in wire_report_codecs()]
    hooked = [c["label"] for c in wire.ddp_cases(_args(ddp_hook="m:f"))]
    assert hooked == ["gloo", "netcoll none", "netcoll fp16", "netcoll fp16 + hook"]


def wire_report_codecs() -> list[str]:
    return ["none", "fp16", "bf16", "int8"]


@pytest.mark.parametrize("doc", wire_report.DOCS)
def test_the_docs_tables_are_the_committed_json(doc: str) -> None:
    body = (ROOT / doc).read_text()
    block = re.search(re.escape(wire_report.BEGIN) + ".*?" + re.escape(wire_report.END), body, re.S)
    assert block is not None, f"{doc} has no generated wire-results section"
    assert block.group(0) == wire_report.tables(str(ROOT / "bench" / "wire-results.json")), (
        f"{doc} differs from bench/wire-results.json: python3 -m bench.wire --render-docs bench/wire-results.json"
    )
