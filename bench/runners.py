"""Running one implementation's sweep at one world size, as rank processes on this machine.

The implementations (keys of a run's ``impls`` in ``bench/results.json``):

* ``netcoll-tcp``: :func:`netcoll.bench.local.run_local` with ``NETCOLL_TRANSPORT=tcp``;
* ``netcoll``: the same with ``NETCOLL_TRANSPORT=auto``, netcoll's default, whose link kind
  (``tcp`` today, ``shm`` once that link exists) is read from ``comm.link_stats()`` by a probe
  (:mod:`bench.linkprobe`) under the same environment, or from the run's ``meta["links"]``
  when netcoll's benchmark reports it;
* ``gloo``: ``torch.distributed`` with the gloo backend (``bench/peers.py``);
* ``mpi``: Open MPI restricted to TCP (``--mca pml ob1 --mca btl tcp,self``) and mpi4py;
* ``mpi-sm``: Open MPI with its defaults (no ``btl`` restriction: ob1 over ``vader``, its
  shared-memory transport, between ranks on one host).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from netcoll.bench.common import SweepConfig
from netcoll.bench.local import child_env, run_local

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS_PY = os.path.join(HERE, "peers.py")
LINKPROBE_PY = os.path.join(HERE, "linkprobe.py")

#: NETCOLL_TRANSPORT of each netcoll implementation
TRANSPORT = {"netcoll-tcp": "tcp", "netcoll": "auto"}


def peer_available(peer: str) -> str | None:
    """None when ``peer`` can run here, else why not (with how to install it)."""
    if peer == "gloo":
        if importlib.util.find_spec("torch") is None:
            return (
                "torch is not installed; install the CPU build (pip install torch==2.13.0 from a CPU "
                "wheel index or a local wheel), not the multi-GB CUDA one"
            )
        return None
    if peer in ("mpi", "mpi-sm"):
        missing = []
        if shutil.which("mpirun") is None:
            missing.append("mpirun (apt-get install -y openmpi-bin libopenmpi-dev)")
        if importlib.util.find_spec("mpi4py") is None:
            missing.append("mpi4py (pip install mpi4py)")
        return ("not installed: " + ", ".join(missing)) if missing else None
    return f"unknown peer {peer!r}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """Set environment variables for the rank processes started inside (restored after)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def run_processes(cmds: list[list[str]], env: dict[str, str], limit: float) -> list[dict[str, Any]]:
    """Run the commands, each in its own session; return the JSON events of their stdout.
    Every process group is killed on any way out; a nonzero exit raises RuntimeError."""
    procs: list[asyncio.subprocess.Process] = []
    events: list[dict[str, Any]] = []
    tails: list[list[str]] = []

    async def pump(i: int, p: asyncio.subprocess.Process) -> None:
        assert p.stdout is not None and p.stderr is not None

        async def out() -> None:
            async for raw in p.stdout:  # type: ignore[union-attr]
                line = raw.decode(errors="replace").strip()
                try:
                    events.append(json.loads(line))
                except ValueError:
                    if line:
                        tails[i].append(line)

        async def err() -> None:
            async for raw in p.stderr:  # type: ignore[union-attr]
                tails[i].append(raw.decode(errors="replace").rstrip())
                del tails[i][:-30]

        await asyncio.gather(out(), err())
        await p.wait()

    try:
        for cmd in cmds:
            tails.append([])
            procs.append(
                await asyncio.create_subprocess_exec(
                    *cmd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env=env,
                    start_new_session=True,
                )
            )
        await asyncio.wait_for(asyncio.gather(*(pump(i, p) for i, p in enumerate(procs))), limit)
    finally:
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                await asyncio.shield(p.wait())
    bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        i, code = bad[0]
        raise RuntimeError(f"process {i} exited with code {code}: " + "\n".join(tails[i][-12:]))
    return events


def _split(events: list[dict[str, Any]], bands: int) -> list[dict[str, Any]]:
    """One result per config of the launch (rows and events carry ``band``)."""
    out: list[dict[str, Any]] = [{"rows": [], "unsupported": []} for _ in range(bands)]
    for e in events:
        k = int(e.get("band", e.get("row", {}).get("band", 0)))
        if e.get("event") == "row":
            row = dict(e["row"])
            row.pop("band", None)
            out[k]["rows"].append(row)
        elif e.get("event") == "unsupported":
            out[k]["unsupported"].append(e)
    return out


def _configs(cfgs: list[SweepConfig]) -> str:
    return json.dumps([c.to_json() for c in cfgs])


async def run_gloo(cfgs: list[SweepConfig], n: int, limit: float) -> list[dict[str, Any]]:
    """Every config in one launch of ``n`` Gloo rank processes; one result per config."""
    init = f"tcp://127.0.0.1:{_free_port()}"
    env = child_env({"GLOO_SOCKET_IFNAME": "lo"})
    conf = _configs(cfgs)
    cmds = [
        [sys.executable, PEERS_PY, "gloo", "--rank", str(r), "--world-size", str(n), "--init", init, "--config", conf]
        for r in range(n)
    ]
    return _split(await run_processes(cmds, env, limit), len(cfgs))


def mpirun_command(n: int, transport: str = "tcp") -> list[str]:
    """``mpirun`` for ``n`` local ranks: ``tcp`` restricts Open MPI to its TCP transport;
    ``default`` leaves the transport to Open MPI (shared memory, ``vader``, on one host).
    Both keep Open MPI's own sockets on loopback."""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), "--bind-to", "none"]
    if transport == "tcp":
        cmd += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]
    elif transport != "default":
        raise ValueError(f"MPI transport must be tcp or default, got {transport!r}")
    cmd += ["--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
    return [*cmd, "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS"]


async def run_mpi(cfgs: list[SweepConfig], n: int, limit: float, transport: str = "tcp") -> list[dict[str, Any]]:
    """Every config in one ``mpirun``; one result per config."""
    env = child_env({"OMPI_MCA_rmaps_base_oversubscribe": "1"})
    cmd = [*mpirun_command(n, transport), sys.executable, PEERS_PY, "mpi", "--config", _configs(cfgs)]
    return _split(await run_processes([cmd], env, limit), len(cfgs))


async def probe_links(n: int, transport: str, limit: float = 180.0) -> list[str]:
    """The link kinds (sorted, distinct) that ``n`` netcoll ranks on this machine use with
    ``NETCOLL_TRANSPORT=transport``: each rank connects, runs one all-pairs all_reduce
    (so every pair of ranks has talked) and reports ``comm.link_stats()``."""
    import netcoll

    env = child_env({"NETCOLL_TRANSPORT": transport})
    async with netcoll.Coordinator(host="127.0.0.1") as coord:
        cmds = [
            [sys.executable, LINKPROBE_PY, "--address", coord.address, "--world-size", str(n), "--rank", str(r)]
            for r in range(n)
        ]
        events = await run_processes(cmds, env, limit)
    return sorted({k for e in events if e.get("event") == "links" for k in e["kinds"].values()})


async def run_netcoll(cfg: SweepConfig, n: int, limit: float, loop: str, transport: str) -> dict[str, Any]:
    """netcoll's sweep with ``NETCOLL_TRANSPORT=transport`` (``tcp`` or ``auto``)."""
    with environ(NETCOLL_TRANSPORT=transport):
        res = await run_local(cfg, n, limit=limit, loop=loop)
    rows = res["rows"]
    for r in rows:
        r["impl"] = "netcoll-tcp" if transport == "tcp" else "netcoll"
    links = res["meta"].get("links")  # when netcoll's benchmark reports its links
    kinds = sorted({str(k) for k in links.values()}) if isinstance(links, dict) and links else None
    return {"rows": rows, "meta": res["meta"], "unsupported": [], "links": kinds}


async def run_impl(impl: str, cfgs: list[SweepConfig], n: int, limit: float, loop: str) -> list[dict[str, Any]]:
    """``impl``'s runs of ``cfgs`` at ``n`` ranks, one result per config: the peers in one launch
    (their start-up is the slow part at 16 ranks), netcoll one local cluster per config."""
    if impl in TRANSPORT:
        return [await run_netcoll(c, n, limit, loop, TRANSPORT[impl]) for c in cfgs]
    if impl == "gloo":
        return await run_gloo(cfgs, n, limit)
    if impl in ("mpi", "mpi-sm"):
        got = await run_mpi(cfgs, n, limit, "tcp" if impl == "mpi" else "default")
        for part in got:
            for r in part["rows"]:
                r["impl"] = impl
        return got
    raise ValueError(f"unknown implementation {impl!r}")


async def measure_rss(n: int, loop: str) -> dict[str, Any]:
    """Peak RSS per rank during a 64 MiB all_reduce (unverified, so only the collective's own
    buffers), with netcoll's default transport."""
    cfg = SweepConfig(
        ops=["all_reduce"], minbytes=64 << 20, maxbytes=64 << 20, iters=5, warmup=1, check=False
    ).validate()
    res = await run_local(cfg, n, loop=loop)
    row = res["rows"][0]
    bare = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-c",
            "import resource, numpy, netcoll; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)",
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        "world_size": n,
        "message_bytes": row["size"],
        "peak_rss_bytes": row["peak_rss_bytes"],
        "baseline_rss_bytes": row["baseline_rss_bytes"],
        "growth_bytes": row["rss_growth_bytes"],
        "import_rss_bytes": int(bare.stdout.strip()),
        "time_us": row["time_us"],
        "busbw": row["busbw"],
    }
