"""Mutual TLS end to end (issue 10): a ``netcoll coordinator`` and two ``netcoll rank``
processes with ``NETCOLL_TLS_*``, a job from ``netcoll submit`` over TLS (links
``tls``), the HTTPS health port probed by ``netcoll health``, and bad TLS files
refused at startup (exit 2, one line). A throwaway CA made here; loopback only."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from netcoll.cli.common import CliError
from netcoll.cli.health import http_get
from netcoll.mesh.certs import TlsConfig
from tests.cli.test_cli import Cluster, base_env, metric, one_error_line, run_cli
from tests.cli.test_cli import pytestmark as cli_marks
from tests.support.tlsca import issue, make_ca

pytestmark = cli_marks
#: the tests on the module's one cluster run on one pytest-xdist worker (see test_cli.ON_THE_CLUSTER)
ON_THE_CLUSTER = pytest.mark.xdist_group("cli-tls-cluster")


class TlsCluster(Cluster):
    """The CLI tests' cluster with every process on mutual TLS (from the environment)."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        ca = make_ca(tmp, "ca")
        self.files = issue(ca, tmp, "node")
        self.tls = TlsConfig(**self.files)
        self.env.update(
            NETCOLL_TLS_CERT=self.files["cert"], NETCOLL_TLS_KEY=self.files["key"], NETCOLL_TLS_CA=self.files["ca"]
        )

    def wait_members(self, n: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, text = http_get(f"{self.http}/metrics", 5.0, tls=self.tls)
            if status == 200 and metric(text, "netcoll_members") == n:
                return
            time.sleep(0.1)
        raise AssertionError(f"want {n} members\n" + self.logs())


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    c = TlsCluster(tmp_path_factory.mktemp("tls-cluster"))
    try:
        c.start_coordinator()
        c.ensure(2)
        yield c
    finally:
        c.close()


@ON_THE_CLUSTER
def test_job_over_tls(tls_cluster: TlsCluster) -> None:
    assert tls_cluster.http.startswith("https://")
    proc, record = tls_cluster.submit_json("all_reduce", "--size", "1MiB")
    assert proc.returncode == 0 and record["state"] == "succeeded", (record, tls_cluster.logs())
    kinds = {kind for per_rank in record["links"].values() for kind in per_rank.values()}
    # never plain TCP: TLS, or shared memory between ranks on this host (protocol.md §5.4)
    assert kinds and kinds <= {"tls", "shm"}, record["links"]


@ON_THE_CLUSTER
def test_health_over_tls(tls_cluster: TlsCluster) -> None:
    url = f"{tls_cluster.http}/readyz"
    ok = run_cli("health", url, "--timeout", "5", env=tls_cluster.env)
    assert ok.returncode == 0, ok.stderr
    files = tls_cluster.files  # the flags work as the variables do
    flags = ["--tls-cert", files["cert"], "--tls-key", files["key"], "--tls-ca", files["ca"]]
    assert run_cli("health", url, *flags, env=base_env()).returncode == 0
    plain = run_cli("health", url.replace("https://", "http://"), "--timeout", "5", env=base_env())
    assert plain.returncode == 1, plain.stderr  # a plaintext request to the TLS port gets no answer
    with pytest.raises(CliError):  # a client without a certificate is refused
        http_get(url, 5.0)


@ON_THE_CLUSTER
def test_bad_tls_files_exit_2(tls_cluster: TlsCluster, tmp_path: Path) -> None:
    files = tls_cluster.files
    proc = run_cli(
        "coordinator", "--port", "0", "--http-port", "off",
        "--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", files["key"], "--tls-ca", files["ca"],
        env=base_env(),
    )  # fmt: skip
    assert proc.returncode == 2 and "--tls-cert" in one_error_line(proc) and "no such file" in proc.stderr
    other = issue(make_ca(tmp_path, "other"), tmp_path, "other")
    mismatched = base_env(NETCOLL_TLS_CERT=files["cert"], NETCOLL_TLS_KEY=other["key"], NETCOLL_TLS_CA=files["ca"])
    proc = run_cli("rank", "--port", "0", "--http-port", "off", env=mismatched)
    assert proc.returncode == 2 and "NETCOLL_TLS_CERT" in one_error_line(proc) and "mismatch" in proc.stderr
    partial = base_env(NETCOLL_TLS_CERT=files["cert"])
    proc = run_cli("status", "--coordinator", tls_cluster.address, env=partial)
    assert proc.returncode == 2 and "NETCOLL_TLS_KEY" in one_error_line(proc)


def test_bench_local_cluster_takes_the_tls_flags(tmp_path: Path) -> None:
    """``netcoll bench --ranks N --tls-*``: the flags reach the local coordinator and ranks
    (they used to read only NETCOLL_TLS_*, so the flags were dropped and the run was plain TCP)."""
    files = issue(make_ca(tmp_path, "ca"), tmp_path, "node")
    proc = run_cli(
        "bench", "--ranks", "2", "--op", "all_reduce", "-b", "4", "-e", "4", "-n", "2", "-w", "1",
        "--tls-cert", files["cert"], "--tls-key", files["key"], "--tls-ca", files["ca"],
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tls, loopback" in proc.stdout, proc.stdout
