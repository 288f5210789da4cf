"""bench/tls.py: its throwaway CA makes a usable TLS config, the suite it records is the
one netcoll's contexts negotiate, and the docs' table comes from its JSON alone;
bench/tls_connection.py measures one connection of each kind."""

from __future__ import annotations

import json
from pathlib import Path

from bench import tls, tls_connection
from netcoll.mesh import tlstuning
from netcoll.mesh.certs import TlsConfig


def test_the_throwaway_pki_is_a_working_tls_config(tmp_path: Path) -> None:
    env = tls.make_pki(str(tmp_path))
    config = TlsConfig(cert=env["NETCOLL_TLS_CERT"], key=env["NETCOLL_TLS_KEY"], ca=env["NETCOLL_TLS_CA"])
    assert config.server_context() is not config.client_context()
    assert (Path(env["NETCOLL_TLS_KEY"]).stat().st_mode & 0o777) == 0o600


def test_the_runs_cipher_is_what_two_netcoll_contexts_negotiate(tmp_path: Path) -> None:
    got = tls.negotiated(tls.make_pki(str(tmp_path)))
    version, suite = got.split()
    assert version in ("TLSv1.2", "TLSv1.3")
    if tlstuning._libssl() is not None:  # tuned: AES-128-GCM first (mesh/tlstuning.py)
        assert (version, suite) == ("TLSv1.3", "TLS_AES_128_GCM_SHA256")


def test_render_shows_every_cell_of_every_run(tmp_path: Path) -> None:
    cell = {"ranks": 2, "bytes": 16 << 20, "tcp_gbs": 2.014, "tls_gbs": 1.2, "ratio": 0.6}
    cell.update(tcp_cpu_ms=8.04, tls_cpu_ms=16.0, cpu_ratio=0.5)
    other = dict(cell, ranks=4, bytes=1 << 20, ratio=0.25)
    run = {
        "cells": [cell, other],
        "date": "2026-11-29 05:30 UTC",
        "machine": {"commit": "abc1234", "nproc": 2, "cpu": "Xeon", "python": "3.11.7"},
        "openssl": "OpenSSL 3.0.19",
        "reps": 5,
        "iters": 5,
        "load_before": 0.1,
    }
    path = tmp_path / "tls.json"
    current = dict(run, cipher="TLSv1.3 TLS_AES_128_GCM_SHA256")
    path.write_text(json.dumps({"statistic": "the median", "runs": {"before": run, "current": current}}))
    lines = tls.render(str(path)).splitlines()
    assert lines[2] == "| before | 2 | 16 MiB | 2.01 GB/s | 1.20 GB/s | **0.60** | 8.0 ms | 16.0 ms | **0.50** |"
    assert lines[3].startswith("| before | 4 | 1 MiB | 2.01 GB/s | 1.20 GB/s | **0.25** |")
    assert lines[4].startswith("| current | 2 | 16 MiB |")
    assert "before: 2026-11-29 05:30 UTC, 2 CPUs (Xeon), Python 3.11.7, OpenSSL 3.0.19, 5 repetitions" in lines[-1]
    assert (
        "current: 2026-11-29 05:30 UTC, 2 CPUs (Xeon), Python 3.11.7, OpenSSL 3.0.19, TLSv1.3 TLS_AES_128" in lines[-1]
    )
    assert lines[-1].endswith("Statistic: the median._")


def test_the_docs_show_the_committed_figures() -> None:
    """docs/reliability.md's table is bench/tls-results.json rendered (re-render after a new run)."""
    root = Path(__file__).resolve().parents[2]
    table = tls.render(str(root / "bench" / "tls-results.json"))
    assert table in (root / "docs" / "reliability.md").read_text()


async def test_one_connection_is_measured_over_tcp_and_tls(tmp_path: Path) -> None:
    pki = tls.make_pki(str(tmp_path))
    for kind in ("tcp", "tls"):
        per_block = await tls_connection.measure(kind, 3 << 20, 2, 2, pki)  # the message is checked once
        assert len(per_block) == 2 and all(ms > 0 for ms in per_block)
