"""The certificate recipe of docs/troubleshooting.md ("Certificates outside
compose") works as written: its openssl commands, run as they stand in the page,
make a CA and certificates that netcoll's mutual TLS accepts in both roles, and
whose SANs satisfy ``check_hostname`` (and fail it for an address they do not
name). Skipped without openssl or bash. Loopback only."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import netcoll
from netcoll.mesh.certs import TlsConfig
from netcoll.rpc import RpcClient, RpcServer

pytestmark = pytest.mark.tcp
DOC = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"
TOKEN = "recipe-member-token"


def recipe() -> str:
    """The bash block between the page's recipe markers."""
    text = DOC.read_text()
    block = re.search(r"<!-- recipe:[^>]*-->\s*```bash\n(.*?)```\s*<!-- end recipe -->", text, re.S)
    assert block, "docs/troubleshooting.md lost its recipe markers"
    return block.group(1)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None or shutil.which("bash") is None:
        pytest.skip("openssl and bash are needed to run the recipe")
    where = tmp_path_factory.mktemp("recipe")
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", recipe()],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return where


def _tls(where: Path, name: str, check_hostname: bool = False) -> TlsConfig:
    return TlsConfig(str(where / f"{name}.pem"), str(where / f"{name}.key"), str(where / "ca.pem"), check_hostname)


async def _echo(session: object, params: dict[str, object], payload: memoryview) -> object:
    return params


def test_the_recipe_makes_the_files_netcoll_needs(made: Path) -> None:
    for name in ("node1", "node2", "client"):
        _tls(made, name)  # loads: the key is the certificate's, both PEM, unencrypted
        assert (made / f"{name}.key").stat().st_mode & 0o077 == 0
    assert not list(made.glob("*.csr")) and not list(made.glob("*.ext"))


async def test_its_certificates_pass_mutual_tls_in_both_roles(made: Path) -> None:
    server = RpcServer({"echo": _echo}, token=TOKEN, tls=_tls(made, "node1"))
    await server.start("127.0.0.1", 0)
    try:
        address = f"127.0.0.1:{server.address[1]}"
        for client in ("client", "node2"):  # a job submitter, and another node dialing as a client
            rpc = await RpcClient.connect(address, token=TOKEN, tls=_tls(made, client, check_hostname=True))
            assert await rpc.call("echo", {"from": client}) == {"from": client}
            await rpc.close()
    finally:
        await server.close()


async def test_an_address_outside_the_sans_fails_the_hostname_check(made: Path) -> None:
    server = RpcServer({"echo": _echo}, token=TOKEN, tls=_tls(made, "node1"))
    await server.start("127.0.0.2", 0)
    try:
        address = f"127.0.0.2:{server.address[1]}"
        with pytest.raises(netcoll.AuthenticationError, match="IP address mismatch"):
            await RpcClient.connect(address, token=TOKEN, tls=_tls(made, "client", check_hostname=True), timeout=10)
        rpc = await RpcClient.connect(address, token=TOKEN, tls=_tls(made, "client"))  # the CA alone: accepted
        await rpc.close()
    finally:
        await server.close()
