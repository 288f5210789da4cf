"""A tiny HTTP/1.1 server for health checks and metrics (the metrics themselves:
:mod:`netcoll.service.metrics`).

Every ``netcoll coordinator`` and ``netcoll rank`` process can serve:

========== ==================================================================
GET        answer
========== ==================================================================
/livez     ``200 ok`` while the event loop runs
/readyz    ``200 ok`` when ready (coordinator: listening; rank: registered
           with the coordinator), else ``503`` and the reason
/metrics   Prometheus text exposition (``503`` and why without ``prometheus_client``)
/jobs      coordinator only: the running job, the queue and recent jobs, as JSON
/status    coordinator only: members, queue, recent jobs and the arrival board
           (what ``netcoll status`` shows), as JSON
========== ==================================================================

(``/jobs`` and ``/status``: :mod:`netcoll.service.views`, bounded in size.)
``HEAD`` works too; anything else is ``404`` / ``405``. No token is needed, as
for a Prometheus scrape: the endpoints are read-only (no control, no job
arrays, no secrets), but ``/jobs`` and ``/status`` show job errors and member
addresses, so an HTTP port reachable from untrusted networks wants TLS or
``--http-host`` on a private address (the port binds the listener's host by
default). Requests are
bounded (8 KiB of request line and headers, ``http_timeout_s`` to send them
and to take the answer, ``http_max_conns`` connections at once: see
:mod:`netcoll.limits`), every response closes the connection, and nothing a
client sends can take the server down.

Idle clients cannot starve the health checks: at the connection cap a new
connection closes the oldest one that is only lingering after its answer or
still waiting for its request (as nginx reuses idle keep-alive connections
when it runs out), so a fresh ``GET /livez`` is always served; only when
every connection is busy answering is the new one told ``503``.

With TLS (``tls=``, the process's ``--tls-*`` files) the port speaks HTTPS
and requires a client certificate of the CA, as every netcoll listener does:
probe it with ``netcoll health`` given the same TLS files (not a plain
``httpGet`` probe).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..escape import escape
from ..limits import DEFAULT as DEFAULT_LIMITS
from ..limits import Limits
from .metrics import MetricsUnavailable
from .views import JSON_TYPE, render

if TYPE_CHECKING:
    from ..mesh.certs import TlsConfig
    from ..rendezvous.coordinator import Coordinator
    from .daemon import RankDaemon

log = logging.getLogger("netcoll.http")

MAX_REQUEST = 8192
LINGER = 1.0
PATHS = ("/livez", "/readyz", "/metrics")
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Ready = Callable[[], "tuple[bool, str]"]
#: ``/metrics``: the exposition text, or (content type, text)
Metrics = Callable[[], "str | tuple[str, str]"]
#: a read-only JSON view (``/jobs``, ``/status``): the document to serve
View = Callable[[], Any]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpServer:
    """Serves ``/livez``, ``/readyz`` (``ready()`` -> (ok, reason)),
    ``/metrics`` (``metrics()`` -> exposition text, or (content type, text); it
    raises :class:`MetricsUnavailable` for a 503) and ``views``: path -> a
    function returning the JSON document to serve there (the coordinator's
    ``/jobs`` and ``/status``)."""

    def __init__(
        self,
        *,
        ready: Ready,
        metrics: Metrics,
        name: str = "netcoll",
        limits: Limits | None = None,
        tls: TlsConfig | None = None,
        views: Mapping[str, View] | None = None,
    ) -> None:
        self.tls = tls
        self.ready = ready
        self.metrics = metrics
        self.views = dict(views or {})
        self.paths = (*PATHS, *self.views)
        self.name = name
        self.limits = DEFAULT_LIMITS if limits is None else limits
        self.address: tuple[str, int] = ("", 0)
        self.requests = 0
        self.evicted = 0  # idle connections closed to make room for new ones
        self.refused = 0  # connections answered 503 because every slot was busy answering
        self._server: asyncio.Server | None = None
        #: open connections in accept order -> their state: "waiting" for the request,
        #: "answering", or "lingering" after the answer
        self._writers: dict[asyncio.StreamWriter, str] = {}

    @property
    def url(self) -> str:
        host, port = self.address[:2]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        scheme = "http" if self.tls is None else "https"
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_REQUEST)
        sock = self._server.sockets[0].getsockname()
        self.address = (str(sock[0]), int(sock[1]))
        return self.address

    async def close(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        try:
            await asyncio.wait_for(server.wait_closed(), 2.0)
        except TimeoutError:
            pass

    # -- one connection ----------------------------------------------------------------------
    def _make_room(self) -> bool:
        """At the cap, close the oldest lingering, else the oldest waiting connection."""
        if len(self._writers) < max(1, self.limits.http_max_conns):
            return True
        for state in ("lingering", "waiting"):
            victim = next((w for w, s in self._writers.items() if s == state), None)
            if victim is not None:
                del self._writers[victim]
                self.evicted += 1
                victim.transport.abort()
                return True
        return False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._make_room():
            self.refused += 1
            log.debug("HTTP: %d connections busy answering; refusing one", len(self._writers))
            try:
                writer.write(self._response(503, "too many connections\n"))
            except (ConnectionError, OSError):
                pass
            writer.transport.close()
            return
        self._writers[writer] = "waiting"
        if self.tls is not None and not await self._start_tls(writer):
            return
        try:
            try:
                async with asyncio.timeout(self.limits.http_timeout_s):
                    method, path = await self._read_request(reader)
            except _BadRequest as exc:
                await self._send(writer, exc.status, f"{exc}\n", head=False)
                return
            except TimeoutError:
                await self._send(writer, 408, "request timed out\n", head=False)
                return
            self.requests += 1
            if writer in self._writers:
                self._writers[writer] = "answering"
            status, body, ctype = self._route(method, path)
            await self._send(
                writer,
                status,
                body,
                ctype=ctype,
                head=method == "HEAD",
                extra="Allow: GET, HEAD\r\n" if status == 405 else "",
            )
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.debug("HTTP request failed", exc_info=True)
        finally:
            if writer in self._writers:
                self._writers[writer] = "lingering"
            try:
                await self._linger(reader, writer)
            finally:
                self._writers.pop(writer, None)

    async def _start_tls(self, writer: asyncio.StreamWriter) -> bool:
        """Mutual TLS on a new connection, within ``http_timeout_s``; the connection holds
        its slot meanwhile (so the limits and idle eviction above apply to handshakes too).
        False (the connection closed) when it fails: a client without TLS or a certificate
        of the CA."""
        assert self.tls is not None
        raw = writer.transport
        try:
            await writer.start_tls(self.tls.server_context(), ssl_handshake_timeout=self.limits.http_timeout_s)
            ok = writer.transport is not None
        except (OSError, TimeoutError, AttributeError) as exc:  # AttributeError: asyncio (3.11) when the
            log.debug("HTTP: TLS handshake failed: %r", exc)  # connection closed, or was evicted, mid-handshake
            ok = False
        if not ok:
            raw.abort()
            if writer.transport is None:  # asyncio leaves none; StreamWriter.__del__ needs one
                setattr(writer, "_transport", raw)  # noqa: B010
            self._writers.pop(writer, None)
        return ok

    @staticmethod
    async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Half-close, then discard what the client still sends (briefly) before closing:
        closing with unread input would reset the connection and could lose the answer."""
        try:
            if writer.can_write_eof() and not writer.is_closing():
                writer.write_eof()
            async with asyncio.timeout(LINGER):
                budget = MAX_REQUEST * 8
                while budget > 0:
                    chunk = await reader.read(65536)
                    if not chunk:
                        break
                    budget -= len(chunk)
        except (TimeoutError, ConnectionError, OSError, ValueError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
        total = 0
        lines: list[bytes] = []
        while True:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                raise _BadRequest(431, "request line or headers too long") from None
            total += len(line)
            if total > MAX_REQUEST:
                raise _BadRequest(431, "request line or headers too long")
            if not line:  # EOF before the blank line: answer what we have, if anything
                if not lines:
                    raise ConnectionResetError("client closed before sending a request")
                break
            if line in (b"\r\n", b"\n"):
                if lines:
                    break
                continue  # tolerate leading empty lines (RFC 9112 2.2)
            lines.append(line)
        try:
            request_line = lines[0].decode("ascii").strip()
        except UnicodeDecodeError:
            raise _BadRequest(400, "request line is not ASCII") from None
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise _BadRequest(400, "malformed request line")
        method, target, version = parts
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            raise _BadRequest(505, f"unsupported version {version}")
        if target.startswith(("http://", "https://")):  # absolute form
            target = "/" + target.split("://", 1)[1].partition("/")[2]
        path = target.split("?", 1)[0].split("#", 1)[0] or "/"
        return method.upper(), path

    def _route(self, method: str, path: str) -> tuple[int, str, str]:
        text = "text/plain; charset=utf-8"
        if path != "/" and path.endswith("/"):
            path = path.rstrip("/")
        if path not in self.paths and path != "/":
            return 404, f"not found: {escape(path, 100)} (try {', '.join(self.paths)})\n", text
        if method not in ("GET", "HEAD"):
            return 405, f"method {method} not allowed\n", text
        if path == "/":
            return 200, f"{self.name}: {' '.join(self.paths)}\n", text
        if path == "/livez":
            return 200, "ok\n", text
        try:
            view = self.views.get(path)
            if view is not None:
                return 200, render(view()), JSON_TYPE
            if path == "/readyz":
                ok, reason = self.ready()
                return (200, "ok\n", text) if ok else (503, f"not ready: {reason}\n", text)
            body = self.metrics()
            if isinstance(body, tuple):
                return 200, body[1], body[0]
            return 200, body, METRICS_TYPE
        except MetricsUnavailable as exc:
            return 503, f"{exc}\n", text
        except Exception as exc:  # noqa: BLE001
            log.warning("HTTP %s failed: %r", escape(path, 100), exc)
            return 500, f"internal error: {exc!r}\n", text

    @staticmethod
    def _response(
        status: int, body: str, *, ctype: str = "text/plain; charset=utf-8", head: bool = False, extra: str = ""
    ) -> bytes:
        data = body.encode("utf-8")
        header = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
            f"Cache-Control: no-store\r\nConnection: close\r\n{extra}\r\n"
        ).encode("ascii")
        return header if head else header + data

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: str,
        *,
        ctype: str = "text/plain; charset=utf-8",
        head: bool = False,
        extra: str = "",
    ) -> None:
        writer.write(self._response(status, body, ctype=ctype, head=head, extra=extra))
        try:
            async with asyncio.timeout(self.limits.http_timeout_s):
                await writer.drain()
        except TimeoutError:
            pass


def coordinator_ready(coord: Coordinator, stopping: Callable[[], bool] = lambda: False) -> Ready:
    def ready() -> tuple[bool, str]:
        if stopping():
            return False, "shutting down"
        try:
            _ = coord.address  # raises while not listening
        except RuntimeError:
            return False, "not listening"
        return True, "listening"

    return ready


def rank_ready(daemon: RankDaemon, stopping: Callable[[], bool] = lambda: False) -> Ready:
    def ready() -> tuple[bool, str]:
        if stopping():
            return False, "draining"
        if not daemon.registered:
            return False, f"not registered with the coordinator at {daemon.coordinator}"
        return True, "registered"

    return ready


__all__ = [
    "PATHS",
    "HttpServer",
    "coordinator_ready",
    "rank_ready",
]
