"""``netcoll health URL``: exit 0 iff GET URL answers 200 (container healthchecks).

:mod:`http.client` only: this runs every few seconds and must load neither
numpy nor pydantic. ``--retries N`` tries a refused connection or a 5xx answer
again after a backoff with full jitter.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import FORMATTER, CliError, add_tls_arguments

if TYPE_CHECKING:
    from ..mesh.certs import TlsConfig
    from .common import Subparsers

HELP = "GET a health URL: exit 0 on 200 (for healthchecks)"
MAX_RESPONSE = 65536
RETRY_BASE = 0.2  # seconds: the first retry waits up to this, doubling after


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "health",
        formatter_class=FORMATTER,
        help=HELP,
        description="GET URL (default path /readyz) with a timeout; exit 0 iff it answers 200.",
    )
    sp.add_argument("url", metavar="URL", help="e.g. http://127.0.0.1:29401/readyz (or HOST:PORT)")
    sp.add_argument("--timeout", type=float, default=2.0, metavar="SECONDS", help="default 2")
    sp.add_argument(
        "--retries",
        type=int,
        default=2,
        metavar="N",
        help="try a failed connection or 5xx answer again N times, backing off with jitter (default 2)",
    )
    sp.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    add_tls_arguments(sp)
    sp.set_defaults(handler=run)
    return sp


def _tls(ns: argparse.Namespace) -> TlsConfig | None:
    """The TLS files from the flags, else from NETCOLL_TLS_* (a CliError, exit 2, when unusable)."""
    from ..mesh.certs import TlsConfig, TlsConfigError

    try:
        if ns.tls_cert or ns.tls_key or ns.tls_ca:
            return TlsConfig.from_paths(ns.tls_cert, ns.tls_key, ns.tls_ca)
        return TlsConfig.from_env()
    except TlsConfigError as exc:
        raise CliError(f"invalid configuration: {exc}", 2) from None


def run(ns: argparse.Namespace) -> int:
    status, body = http_get(ns.url, ns.timeout, retries=ns.retries, tls=_tls(ns))
    first = body.strip().splitlines()[0] if body.strip() else ""
    if status == 200:
        if not ns.quiet:
            print(first or "ok")
        return 0
    raise CliError(f"{ns.url}: HTTP {status}{': ' + first[:200] if first else ''}")


def http_get(url: str, timeout: float = 2.0, tls: TlsConfig | None = None, *, retries: int = 0) -> tuple[int, str]:
    """GET ``url`` (``http://host:port/path``, or ``host:port`` for ``/readyz``) with
    :mod:`http.client`; return (status, body). A failed connection or a 5xx answer is
    tried again up to ``retries`` times, after a backoff with full jitter
    (``uniform(0, RETRY_BASE * 2**attempt)``). With ``tls`` (netcoll's mutual TLS) the
    request goes over TLS whatever the scheme says, presenting the certificate and
    checking the server's against the CA. Raises CliError."""
    import random
    import time
    from urllib.parse import urlsplit

    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"not an http URL: {url!r}", 2)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise CliError(f"bad port in {url!r}", 2) from None
    path = (parts.path or "/readyz") + (f"?{parts.query}" if parts.query else "")
    for attempt in range(max(0, retries) + 1):
        try:
            status, body = _get(parts.scheme, parts.hostname, port, path, timeout, tls)
        except _Unreachable:  # refused, reset, timed out: it may be starting; anything else is final
            if attempt >= retries:
                raise
        else:
            if status < 500 or attempt >= retries:
                return status, body
        time.sleep(random.uniform(0, RETRY_BASE * 2**attempt))
    raise AssertionError("unreachable")  # the last attempt returned or raised


class _Unreachable(CliError):
    """The connection failed (refused, reset, timed out): worth another try."""


def _get(scheme: str, host: str, port: int, path: str, timeout: float, tls: TlsConfig | None) -> tuple[int, str]:
    """One GET; the status and the body's first MAX_RESPONSE bytes."""
    import http.client
    import socket
    import ssl

    from ..mesh.sniff import TLS_SETTINGS, http_met

    url = f"{scheme}://{host}:{port}{path}"
    conn: http.client.HTTPConnection
    if tls is not None:
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=tls.client_context())
    elif scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=timeout)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"User-Agent": "netcoll-health", "Accept": "*/*", "Connection": "close"})
        resp = conn.getresponse()
        return int(resp.status), resp.read(MAX_RESPONSE).decode("utf-8", "replace")
    except socket.gaierror as exc:
        raise CliError(f"{url}: cannot resolve {host!r} ({exc.strerror or exc})") from None
    except ssl.SSLError as exc:
        from ..mesh.certs import describe_failure

        raise CliError(f"{url}: TLS handshake failed: {describe_failure(exc)}") from None
    except ConnectionResetError as exc:  # http.client.RemoteDisconnected is one too
        if tls is not None:  # TLS 1.3: a refused client certificate shows only as a close
            raise CliError(
                f"{url}: the TLS server closed the connection unanswered (is this certificate of its CA?)"
            ) from None
        if isinstance(exc, http.client.RemoteDisconnected):
            raise CliError(
                f"{url}: not an HTTP response (closed without answering; does it require TLS? "
                f"pass the TLS files: {TLS_SETTINGS})"
            ) from None
        raise _Unreachable(f"{url}: {_reason(exc)}") from None
    except http.client.HTTPException as exc:
        line = exc.args[0] if isinstance(exc, http.client.BadStatusLine) and exc.args else ""
        met = http_met(f"{host}:{port}", str(line).encode("latin-1", "replace"), tls is not None)
        if met is not None:
            raise CliError(f"{url}: not an HTTP response: {met}") from None
        raise CliError(f"{url}: not an HTTP response ({type(exc).__name__}: {str(exc)[:60]!r})") from None
    except OSError as exc:
        raise _Unreachable(f"{url}: {_reason(exc)}") from None
    finally:
        conn.close()


def _reason(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return (exc.strerror or str(exc)).lower()
