"""A coordinator and rank daemons as subprocesses on loopback, for the robustness harnesses
(:mod:`.fuzz_live`, :mod:`.chaos`, :mod:`.soak`): started with free ports and a token, each
waited for through its ready file, sampled for RSS and open descriptors, stopped with
SIGTERM (then SIGKILL) at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from ...service import Client

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def nfds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    address: tuple[str, int]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def sample(self) -> dict[str, float]:
        return {"rss_mib": round(rss_mib(self.pid), 2), "fds": nfds(self.pid)}


class Cluster:
    """A coordinator and ``daemons`` rank daemons as subprocesses on 127.0.0.1."""

    def __init__(self, daemons: int, token: str, env: dict[str, str] | None = None) -> None:
        self.n, self.token = daemons, token
        self.env = dict(os.environ, NETCOLL_TOKEN=token, NETCOLL_LOG_LEVEL="error", **(env or {}))
        self.env.pop("NETCOLL_COORDINATOR", None)
        self.tmp = tempfile.TemporaryDirectory(prefix="netcoll-fuzz-")
        self.procs: list[Proc] = []

    @property
    def coordinator(self) -> Proc:
        return self.procs[0]

    @property
    def address(self) -> str:
        host, port = self.coordinator.address
        return f"{host}:{port}"

    def _spawn(self, name: str, args: list[str], timeout: float = 20.0) -> Proc:
        """Start one process and wait (blocking, bounded) for its ready file."""
        ready = os.path.join(self.tmp.name, name + ".json")
        with open(os.path.join(self.tmp.name, name + ".log"), "wb") as err:
            popen = subprocess.Popen(
                [sys.executable, "-m", "netcoll", *args, "--http-port", "off", "--ready-file", ready],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        proc = Proc(name, popen, ("", 0))
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while not os.path.exists(ready):
            if popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: {self.log(name)}")
            time.sleep(0.05)
        with open(ready) as f:
            info = json.load(f)
        address = info.get("address") or info.get("peers") or info.get("listen")
        if isinstance(address, str):
            host, port = address.rsplit(":", 1)
            proc.address = (host, int(port))
        elif isinstance(address, list):
            proc.address = (str(address[0]), int(address[1]))
        return proc

    def log(self, name: str) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self.tmp.name, name + ".log")) as f:
            return f.read()[-2000:]
        return ""

    async def start(self) -> None:
        self._spawn("coordinator", ["coordinator", "--host", "127.0.0.1", "--port", "0"])
        for i in range(self.n):
            self._spawn(
                f"rank{i}",
                ["rank", "--coordinator", self.address, "--host", "127.0.0.1", "--port", "0"],
            )
        async with Client(self.address, token=self.token) as client, asyncio.timeout(30):
            while len(await client.members()) < self.n:  # noqa: ASYNC110 - bounded by the timeout
                await asyncio.sleep(0.1)

    def dead(self) -> list[str]:
        return [p.name for p in self.procs if p.popen.poll() is not None]

    def sample(self) -> dict[str, dict[str, float]]:
        return {p.name: p.sample() for p in self.procs if p.popen.poll() is None}

    async def stop(self) -> None:
        for p in reversed(self.procs):
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            while p.popen.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 - bounded
                await asyncio.sleep(0.05)
            if p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait(5)
        self.tmp.cleanup()

    async def __aenter__(self) -> Cluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def settle(cluster: Cluster, baseline: dict[str, dict[str, float]], seconds: float = 10.0) -> None:
    """Wait (bounded) until every target's fd count is back to its baseline."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = cluster.sample()
        if all(now.get(k, {}).get("fds", 1e9) <= v["fds"] for k, v in baseline.items()):
            return
        await asyncio.sleep(0.1)
