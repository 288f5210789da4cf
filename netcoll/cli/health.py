"""``netcoll health URL``: exit 0 iff GET URL answers 200 (container healthchecks).

Plain sockets and the standard library only: this runs every few seconds and
must load neither numpy nor pydantic.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import FORMATTER, CliError, add_tls_arguments

if TYPE_CHECKING:
    from ..transport.tls import TlsConfig
    from .common import Subparsers

HELP = "GET a health URL: exit 0 on 200 (for healthchecks)"
MAX_RESPONSE = 65536


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "health",
        formatter_class=FORMATTER,
        help=HELP,
        description="GET URL (default path /readyz) with a timeout; exit 0 iff it answers 200.",
    )
    sp.add_argument("url", metavar="URL", help="e.g. http://127.0.0.1:29401/readyz (or HOST:PORT)")
    sp.add_argument("--timeout", type=float, default=2.0, metavar="SECONDS", help="default 2")
    sp.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    add_tls_arguments(sp)
    sp.set_defaults(handler=run)
    return sp


def _tls(ns: argparse.Namespace) -> TlsConfig | None:
    """The TLS files from the flags, else from NETCOLL_TLS_* (a CliError, exit 2, when unusable)."""
    from ..transport.tls import TlsConfig, TlsConfigError

    try:
        if ns.tls_cert or ns.tls_key or ns.tls_ca:
            return TlsConfig.from_paths(ns.tls_cert, ns.tls_key, ns.tls_ca)
        return TlsConfig.from_env()
    except TlsConfigError as exc:
        raise CliError(f"invalid configuration: {exc}", 2) from None


def run(ns: argparse.Namespace) -> int:
    status, body = http_get(ns.url, ns.timeout, tls=_tls(ns))
    first = body.strip().splitlines()[0] if body.strip() else ""
    if status == 200:
        if not ns.quiet:
            print(first or "ok")
        return 0
    raise CliError(f"{ns.url}: HTTP {status}{': ' + first[:200] if first else ''}")


def http_get(url: str, timeout: float = 2.0, tls: TlsConfig | None = None) -> tuple[int, str]:
    """GET ``url`` (``http://host:port/path``, or ``host:port`` for ``/readyz``);
    return (status, body). Plain sockets: no heavy imports. Raises CliError.
    With ``tls`` (netcoll's mutual TLS) the request goes over TLS whatever the
    scheme says, presenting the certificate and checking the server's against the CA."""
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
    if parts.scheme == "https" and tls is None:
        return _https_get(url, timeout)
    path = (parts.path or "/readyz") + (f"?{parts.query}" if parts.query else "")
    data = _exchange(url, parts.hostname, port, path, timeout, tls)
    head, _, body = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    fields = status_line.split()
    if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
        raise CliError(f"{url}: not an HTTP response ({status_line[:60]!r})")
    return int(fields[1]), body.decode("utf-8", "replace")


def _exchange(url: str, host: str, port: int, path: str, timeout: float, tls: TlsConfig | None = None) -> bytes:
    """Send the request; the response's first MAX_RESPONSE bytes (CliError if none came)."""
    import socket
    import ssl

    host_header = f"[{host}]" if ":" in host else host
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host_header}:{port}\r\nUser-Agent: netcoll-health\r\n"
        "Accept: */*\r\nConnection: close\r\n\r\n"
    ).encode("ascii", "replace")
    data = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as plain:
            sock = plain
            if tls is not None:  # the TLS socket takes over the descriptor (and closes it)
                sock = tls.client_context().wrap_socket(plain, server_hostname=tls.server_hostname(host))
            with sock:
                sock.settimeout(timeout)
                sock.sendall(request)
                while len(data) < MAX_RESPONSE:
                    chunk = sock.recv(MAX_RESPONSE)
                    if not chunk:
                        break
                    data += chunk
    except socket.gaierror as exc:
        raise CliError(f"{url}: cannot resolve {host!r} ({exc.strerror or exc})") from None
    except ssl.SSLError as exc:
        from ..transport.tls import describe_failure

        if not data:
            raise CliError(f"{url}: TLS handshake failed: {describe_failure(exc)}") from None
    except OSError as exc:
        if not data:
            reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc)).lower()
            raise CliError(f"{url}: {reason}") from None
    if tls is not None and not data:  # TLS 1.3: a refused client certificate shows only as a close
        raise CliError(f"{url}: the TLS server closed the connection unanswered (is this certificate of its CA?)")
    return data


def _https_get(url: str, timeout: float) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read(MAX_RESPONSE).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(MAX_RESPONSE).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"{url}: {getattr(exc, 'reason', exc)}") from None
