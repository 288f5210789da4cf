"""``netcoll.Client``: submit collective jobs to a coordinator and get results.

async with netcoll.Client("coord:29400") as client:
    job = await client.run("all_reduce", size="64MiB", iters=5)     # generated + verified
    print(job["state"], job["busbw"], job["verified"])
    y = await client.run("all_reduce", inputs=[a0, a1, a2, a3])      # your arrays, one per rank
    print(y["result"])
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np

from ..arrays import array_from_meta, as_array, meta_of
from ..mesh import auth
from ..mesh.certs import TlsConfig
from ..mesh.certs import coerce as coerce_tls
from ..rpc import RpcClient
from .jobs import JobSpec

#: collectives whose result is the same on every rank (rank 0's copy is returned)
_SHARED = ("all_reduce", "all_gather", "broadcast")


def _pack(inputs: Any, mode: str | None) -> tuple[dict[str, Any], bytes]:
    arrays = [np.ascontiguousarray(as_array(a, "inputs")) for a in (inputs if isinstance(inputs, list) else [inputs])]
    if mode is None:
        mode = "per_rank" if isinstance(inputs, list) else "same"
    desc = {"mode": mode, "arrays": [meta_of(a) for a in arrays]}
    return desc, b"".join(a.reshape(-1).view(np.uint8).tobytes() for a in arrays)


class Client:
    """A connection to a coordinator's job service.

    Args:
        address: ``host:port`` of the coordinator.
        token: the member token (the operator's: it may do everything; default: none).
        client_token: the client token (``NETCOLL_CLIENT_TOKEN`` on the coordinator):
            enough to submit, watch, get and cancel jobs and read status. When given it
            is used rather than ``token`` (the least trust that does the job).
        timeout: seconds to connect.
        tls: mutual TLS (a :class:`~netcoll.TlsConfig` or a mapping of ``cert``/``key``/``ca``
            paths; default: none) -- needed when the coordinator runs with TLS.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        client_token: str | None = None,
        timeout: float = 10.0,
        tls: TlsConfig | Mapping[str, Any] | None = None,
    ) -> None:
        self.address, self.token, self.client_token, self.timeout = address, token, client_token, timeout
        self.tls = coerce_tls(tls)
        self.rpc: RpcClient | None = None

    async def __aenter__(self) -> Client:
        token: str | None = self.token
        credential: str = auth.MEMBER
        if self.client_token is not None:
            token, credential = self.client_token, auth.CLIENT
        self.rpc = await RpcClient.connect(
            self.address, token=token, timeout=self.timeout, role="client", credential=credential, tls=self.tls
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.rpc is not None:
            await self.rpc.close()
            self.rpc = None

    def _rpc(self) -> RpcClient:
        if self.rpc is None:
            raise RuntimeError("use `async with Client(...)` first")
        return self.rpc

    async def submit(
        self, op: str | JobSpec, *, inputs: Any = None, inputs_mode: str | None = None, **fields: Any
    ) -> int:
        """Queue a job; return its id. ``inputs``: one array (every rank gets it;
        for broadcast/scatter only the root) or a list with one array per rank."""
        if not isinstance(op, JobSpec) and inputs is not None:
            fields.setdefault("data", "inline")
            first = inputs[0] if isinstance(inputs, list) and inputs else inputs
            if "dtype" not in fields and hasattr(first, "dtype"):
                fields["dtype"] = str(first.dtype)  # so op/dtype rules (avg, bitwise) check the real arrays
        spec = op if isinstance(op, JobSpec) else JobSpec(op=op, **fields)
        params: dict[str, Any] = {"spec": spec.model_dump()}
        payload = b""
        if inputs is not None:
            if inputs_mode is None and not isinstance(inputs, list) and spec.op in ("broadcast", "scatter"):
                inputs_mode = "root"
            params["inputs"], payload = _pack(inputs, inputs_mode)
        reply = await self._rpc().call("submit", params, payload or None, timeout=60.0)
        return int(reply["id"])

    async def wait(self, job_id: int, timeout: float | None = None) -> dict[str, Any]:
        """Wait for the job to end (or ``timeout``); return its record with
        ``result`` (an array, a list of per-rank arrays, or None)."""
        rec, payload = await self._rpc().call_payload(
            "wait", {"id": job_id, "timeout": timeout}, timeout=None if timeout is None else timeout + 30
        )
        results = rec.pop("results", [])
        arrays = {
            r["rank"]: array_from_meta(r["meta"], payload[r["offset"] : r["offset"] + r["nbytes"]]).copy()
            for r in results
            if r.get("meta")
        }
        if not arrays:
            rec["result"] = None
        elif rec["op"] in _SHARED or rec["op"] in ("reduce", "gather"):
            rec["result"] = next(iter(arrays.values()))
        else:
            rec["result"] = [arrays.get(r) for r in range(rec["world_size"])]
        return rec  # type: ignore[no-any-return]

    result = wait

    async def run(self, op: str | JobSpec, *, timeout: float | None = None, **kw: Any) -> dict[str, Any]:
        """Submit and wait. A job with ``trace=True`` comes back with its Chrome trace
        under ``"trace"`` (see :meth:`trace`)."""
        job_id = await self.submit(op, **kw)
        rec = await self.wait(job_id, timeout)
        if (op.trace if isinstance(op, JobSpec) else kw.get("trace")) and rec.get("state") != "cancelled":
            rec["trace"] = await self.trace(job_id)
        return rec

    async def trace(self, job_id: int) -> dict[str, Any]:
        """The timeline of a finished job submitted with ``trace=True``: a Chrome trace
        (Trace Event Format: ``json.dump`` it and open it in https://ui.perfetto.dev)
        merged from every rank's send/receive/reduce spans (:mod:`netcoll.service.timeline`).
        KeyError when the coordinator has none for it."""
        _, payload = await self._rpc().call_payload("trace", {"id": job_id}, timeout=60.0)
        doc: dict[str, Any] = json.loads(bytes(payload))
        return doc

    async def job(self, job_id: int) -> dict[str, Any]:
        return await self._rpc().call("job", {"id": job_id})  # type: ignore[no-any-return]

    async def cancel(self, job_id: int) -> dict[str, Any]:
        return await self._rpc().call("cancel", {"id": job_id})  # type: ignore[no-any-return]

    async def members(self) -> list[dict[str, Any]]:
        return await self._rpc().call("members", {})  # type: ignore[no-any-return]

    async def status(self) -> dict[str, Any]:
        """Members (rank, address, epoch, state, current job), queue and recent jobs."""
        return await self._rpc().call("cluster", {})  # type: ignore[no-any-return]

    async def groups(self) -> dict[str, Any]:
        """The rendezvous' own view, which every coordinator serves (one without a job
        service too: ``netcoll run``'s, an embedded :class:`~netcoll.Coordinator`):
        ``{"groups": [{name, world_size, state, generation, members: [{rank, member_id,
        host, port, connected, liveness}]}], "board": [...]}`` (the arrival board)."""
        return await self._rpc().call("status", {})  # type: ignore[no-any-return]

    async def progress(self, job_id: int) -> AsyncIterator[dict[str, Any]]:
        """The job's progress as it happens, then its final record::

            async for event in client.progress(job_id):
                print(event["state"], event.get("waiting") or event.get("iteration"))

        Each event is a dict with ``topic`` and ``state``. ``topic="progress"`` while
        the job is not finished: ``state="queued"`` with ``waiting`` (what it waits for,
        e.g. "waiting for 2 more ranks (has 2 of 4)", or None), then ``state="running"``
        with ``iteration`` (timed iterations done on every reporting rank) of ``of``,
        ``bytes_sent`` (payload bytes all ranks have sent in this job, warm-up included),
        ``ranks_reporting`` of ``world_size``, and ``elapsed_s`` since it started. An
        event comes when something changed, at most every 0.25 s; ranks report every
        0.5 s. The last event has ``topic="done"``: the job's record (as :meth:`job`),
        whose ``state`` is succeeded, failed or cancelled. One iterator per client at
        a time (they share the connection's event stream)."""
        rpc = self._rpc()
        watch = asyncio.ensure_future(rpc.call("watch", {"id": job_id}))
        try:
            while True:
                get = asyncio.ensure_future(rpc.events.get())
                done, _ = await asyncio.wait({watch, get}, return_when=asyncio.FIRST_COMPLETED)
                if get in done:
                    header, _payload = get.result()
                    if header.get("topic") == "progress" and header.get("id") == job_id:
                        yield dict(header)
                else:
                    get.cancel()
                    yield {"topic": "done", **watch.result()}
                    return
        finally:
            watch.cancel()

    # -- named buffers kept on the ranks --------------------------------------------------
    async def put(self, name: str, arrays: Any, **fields: Any) -> dict[str, Any]:
        """Keep ``arrays`` (one per rank, or one for all) on the ranks as ``name``."""
        return await self.run("put", inputs=arrays, output=name, **fields)

    async def get(self, name: str, **fields: Any) -> list[np.ndarray]:
        rec = await self.run("get", input=name, data="buffer", **fields)
        if rec["state"] != "succeeded":
            raise KeyError(rec["error"])
        return rec["result"]  # type: ignore[no-any-return]

    async def delete(self, name: str, **fields: Any) -> dict[str, Any]:
        return await self.run("delete", input=name, data="buffer", **fields)
