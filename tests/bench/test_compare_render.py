"""bench/compare.py's report, rendered from a small synthetic results JSON (no process is run):
the sections, the marks, the provenance under every table, and that a re-render is identical."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from bench import compare as bench_compare
from bench import labels, machine, report, report_pages, runners, scaling
from netcoll.bench.common import SweepConfig, geometry, make_row

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = (4, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
#: (alpha s, 1/beta B/s) per implementation: netcoll-SHM is the fastest at large sizes
SPEED = {
    "netcoll-tcp": (60e-6, 0.7e9),
    "netcoll": (40e-6, 3.0e9),
    "gloo": (200e-6, 0.8e9),
    "mpi": (5e-6, 1.0e9),
    "mpi-sm": (3e-6, 2.0e9),
}


def _rows(impl: str, p: int) -> list[dict]:
    alpha, bw = SPEED[impl]
    rows = []
    for op in ("all_reduce", "broadcast"):
        for req in SIZES:
            g = geometry(op, req, np.float32, p)
            alg = {"all_reduce": "auto:ring", "broadcast": "auto:tree"}[op] if impl.startswith("netcoll") else None
            probe = make_row(g, redop="sum", root=0, seconds=1, median_seconds=1, min_seconds=1, wrong=None)
            a, b = scaling.terms({**probe, "algorithm": alg}, scaling.SHARED, 2)
            t = a * alpha + b / bw
            extra = {"algorithm": alg} if alg else {}
            rows.append(
                make_row(
                    g, redop="sum", root=0, seconds=t, median_seconds=t * 0.9, min_seconds=t * 0.8,
                    wrong=0 if alg else None, requested=req, impl=impl, iters=20, warmup=5, **extra,
                )
            )  # fmt: skip
    return rows


def fixture() -> dict:
    cfg = SweepConfig(ops=["all_reduce", "broadcast"], minbytes=4, maxbytes=64 << 20, stepfactor=16).validate()
    runs = {}
    for p in (2, 4, 8, 16):
        impls = {i: _rows(i, p) for i in labels.IMPLS}
        lat = {i: {**rows[0], "iters": 500} for i, rows in impls.items()}
        bands = [{"minbytes": 4, "maxbytes": 64 << 20, "iters": 20, "warmup": 5}]
        if p == 16:
            bands = [
                {"minbytes": 4, "maxbytes": 64 << 10, "iters": 20, "warmup": 5},
                {"minbytes": 1 << 20, "maxbytes": 64 << 20, "iters": 5, "warmup": 1},
            ]
        links = {"netcoll-tcp": ["tcp"], "netcoll": ["shm"]}
        runs[str(p)] = {"world_size": p, "notes": [], "bands": bands, "links": links, "aliases": {}}
        runs[str(p)].update(impls=impls, latency=lat)
    meta = {
        "nproc": 2, "cpu": "Test CPU @ 1 GHz", "kernel": "6.1.0-test", "python": "3.11.7", "numpy": "2.4.6",
        "netcoll": "0.1.0", "commit": "abc1234", "torch": "2.13.0+cpu", "mpi4py": "4.1.2",
        "mpirun": "mpirun (Open MPI) 4.1.4", "platform": "Linux-6.1.0-test-x86_64", "loop": "auto",
        "date": "2026-11-25 12:00 UTC", "config": cfg.to_json(), "command": "python3 bench/compare.py --ranks 2 4 8 16",
        "skipped": {}, "elapsed_s": 600,
    }  # fmt: skip
    return {"meta": meta, "runs": runs, "rss": None}


def _render_twice(tmp_path, compare) -> tuple[str, dict[str, bytes]]:
    src = tmp_path / "results.json"
    src.write_text(report.compact_json(fixture()))
    outs = []
    for k in range(2):
        d = tmp_path / f"r{k}"
        d.mkdir()
        doc = d / "bench.md"
        doc.write_text("# hand\n\n" + report.BEGIN + "\nold\n" + report.END + "\n\nafter\n")
        assert compare.main(["--from-json", str(src), "--doc", str(doc)]) == 0
        outs.append((doc.read_text(), {f: (d / f).read_bytes() for f in sorted(os.listdir(d)) if f.endswith(".png")}))
    assert outs[0] == outs[1], "re-rendering the same JSON gave a different doc or different plots"
    return outs[0]


def test_rerender_from_json_is_deterministic_and_has_every_section(tmp_path) -> None:
    text, pngs = _render_twice(tmp_path, bench_compare)
    assert text.startswith("# hand\n") and text.endswith("after\n") and "\nold\n" not in text
    for heading in (
        "### Targets (issue #4)",
        "### 16 ranks: bus bandwidth (GB/s) at key sizes",
        "### Latency: all_reduce of 4 bytes",
        "### 2 ranks: netcoll-TCP busbw ÷ best of Gloo/MPI-TCP",
        "### 2 ranks: netcoll-SHM busbw ÷ best of Gloo/MPI-TCP/MPI-SM",
        "### Scaling: 2, 4, 8, 16 ranks",
        "**all_reduce: time per call (ms), measured / fitted model**",
    ):
        assert heading in text, heading
    assert "16 ranks: 4 B … 64 KiB 5 + 20, 1 MiB … 64 MiB 1 + 5" in text  # the iteration bands
    # matplotlib comes with the test extra: the plots are always checked
    assert set(pngs) == {f"bench-{p}ranks.png" for p in (2, 4, 8, 16)} | {"bench-scaling.png"}
    assert "](bench-scaling.png)" in text and "](bench-16ranks.png)" in text


def test_the_long_tables_go_to_the_data_page_and_the_doc_links_each(tmp_path) -> None:
    doc = tmp_path / "bench.md"
    doc.write_text("# hand\n\n" + report.BEGIN + "\nold\n" + report.END + "\n")
    report.write_doc(str(doc), report.render(fixture(), {}))
    text, data = doc.read_text(), (tmp_path / "bench-data.md").read_text()
    assert "<details>" not in text and "<details>" not in data and "| size (B) |" in data
    anchors = {report_pages.slug(h) for h in re.findall(r"^## (.*)$", data, re.M)}
    links = re.findall(r"\]\(bench-data\.md#([^)]+)\)", text)
    assert len(links) == len(anchors) >= 5 and set(links) == anchors
    assert "## 16 ranks, absolute numbers" in data and "_Generated 2026-11-25 12:00 UTC" in data


def test_every_table_states_machine_date_versions_and_statistic(tmp_path) -> None:
    text = report.render(fixture(), {})
    lines = text.split("\n")
    starts = [i for i, ln in enumerate(lines) if ln.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))]
    assert len(starts) >= 10
    for i in starts:
        rest = lines[i:]
        nxt = next((k for k, ln in enumerate(rest) if ln.startswith("### ")), len(rest))
        prov = [ln for ln in rest[:nxt] if ln.startswith("_Machine:")]
        assert prov, f"table at line {i} ({lines[i][:60]}) has no provenance line before the next section"
        p = prov[0]
        for part in ("Test CPU @ 1 GHz, 2 cores, Linux 6.1.0-test", "Date: 2026-11-25 12:00 UTC", "Python 3.11.7",
                     "numpy 2.4.6", "netcoll 0.1.0 at abc1234", "torch 2.13.0+cpu", "Open MPI 4.1.4",
                     "mpi4py 4.1.2", "Statistic: "):  # fmt: skip
            assert part in p, (part, p)


def test_comparison_table_marks_netcoll_cells_at_or_above_the_best_peer() -> None:
    text = report.render(fixture(), {})
    table = text.split("### 4 ranks: bus bandwidth (GB/s) at key sizes", 1)[1].split("###", 1)[0]
    rows = {tuple(c.strip() for c in ln.split("|")[1:3]): ln for ln in table.split("\n") if ln.startswith("| all")}
    assert {k[1] for k in rows} == {"netcoll-TCP", "netcoll-SHM", "Gloo", "MPI-TCP", "MPI-SM"}
    shm = rows[("all_reduce", "netcoll-SHM")].split("|")[3:7]
    tcp = rows[("all_reduce", "netcoll-TCP")].split("|")[3:7]
    assert "**" in shm[3] and "**" not in tcp[3]  # 64 MiB: SHM beats MPI-SM (2.0 GB/s), TCP does not
    assert "**" not in shm[0]  # 64 KiB: MPI-SM's 3 us steps win
    assert "**" not in rows[("all_reduce", "MPI-SM")]  # only netcoll cells are marked


def test_labels_name_the_links_used_and_read_old_results() -> None:
    run = labels.norm_run({"world_size": 4, "impls": {"netcoll": [{"op": "x"}], "gloo": []}})
    assert set(run["impls"]) == {"netcoll-tcp", "gloo"} and run["links"] == {"netcoll-tcp": ["tcp"]}
    assert labels.norm_run(run)["impls"].keys() == run["impls"].keys()  # idempotent
    assert labels.label("netcoll", {"links": {"netcoll": ["shm"]}}) == "netcoll-SHM"
    assert labels.label("netcoll", {"links": {"netcoll": ["tcp"]}}) == "netcoll-TCP (default)"
    aliased = {"links": {"netcoll": ["tcp"]}, "aliases": {"netcoll": "netcoll-tcp"}}
    assert labels.label("netcoll-tcp", aliased) == "netcoll-TCP (= default)"
    assert labels.label("mpi-sm") == "MPI-SM"


def test_results_json_keeps_latency_links_and_bands() -> None:
    res = fixture()
    back = json.loads(report.compact_json(res))
    run = back["runs"]["16"]
    assert run["latency"]["netcoll"]["iters"] == 500 and run["links"]["netcoll"] == ["shm"]
    assert run["bands"][1]["iters"] == 5 and len(run["impls"]["mpi-sm"]) == len(res["runs"]["16"]["impls"]["mpi-sm"])


def test_plan_bands_times_fewer_calls_of_large_sizes_in_large_worlds() -> None:
    compare = bench_compare
    cfg = SweepConfig(ops=["all_reduce"], minbytes=4, maxbytes=64 << 20, stepfactor=4, iters=20, warmup=5).validate()
    assert compare.plan_bands(cfg, 4) == [cfg]
    small, large = compare.plan_bands(cfg, 16)
    assert small.sizes() + large.sizes() == cfg.sizes() and large.sizes()[0] == 1 << 20
    assert (small.iters, small.warmup) == (20, 5) and (large.iters, large.warmup) == (5, 1)
    assert compare.plan_bands(cfg, 8)[1].iters == 10
    assert compare.plan_bands(cfg, 16, scale=False) == [cfg]
    tiny = SweepConfig(ops=["all_reduce"], minbytes=4, maxbytes=64 << 10, iters=3, warmup=1).validate()
    assert compare.plan_bands(tiny, 16) == [tiny]  # nothing large, or nothing to cut


def test_provenance_and_mpi_commands() -> None:
    old = {"platform": "Linux-6.18.44-fc-v669-x86_64-with-glibc2.36", "mpirun": "mpirun (Open MPI) 4.1.4"}
    assert machine.kernel(old) == "6.18.44" and machine.open_mpi(old) == "Open MPI 4.1.4"
    tcp, default = runners.mpirun_command(4, "tcp"), runners.mpirun_command(4, "default")
    assert "tcp,self" in tcp and "btl" in tcp
    assert "tcp,self" not in default and "pml" not in default
    for cmd in (tcp, default):  # Open MPI's own sockets stay on loopback either way
        assert cmd[cmd.index("btl_tcp_if_include") + 1] == "lo" and cmd[cmd.index("oob_tcp_if_include") + 1] == "lo"
    with pytest.raises(ValueError):
        runners.mpirun_command(2, "ib")
    assert re.search(r"Statistic: .*maximum over ranks", machine.provenance({}))


def test_one_peer_launch_is_split_back_into_its_configs() -> None:
    events = [
        {"event": "hello", "rank": 0},
        {"event": "row", "row": {"op": "all_reduce", "requested": 4, "band": 0}},
        {"event": "row", "row": {"op": "all_reduce", "requested": 1 << 20, "band": 1}},
        {"event": "unsupported", "op": "reduce", "size": 8, "band": 1, "reason": "no"},
        {"event": "row", "row": {"op": "all_reduce", "requested": 4, "iters": 500, "band": 2}},
    ]
    parts = runners._split(events, 3)
    assert [[r["requested"] for r in p["rows"]] for p in parts] == [[4], [1 << 20], [4]]
    assert parts[1]["unsupported"][0]["op"] == "reduce" and not parts[0]["unsupported"]
    assert all("band" not in r for p in parts for r in p["rows"])
