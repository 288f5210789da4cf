"""``netcoll health``: a server that closes without answering is named as such."""

from __future__ import annotations

import socket
import threading

import pytest

from netcoll.cli.common import CliError
from netcoll.cli.health import http_get


def test_closed_without_answer() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        conn, _ = srv.accept()
        conn.recv(1024)
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(CliError, match="not an HTTP response \\(closed without answering; does it require TLS"):
            http_get(f"127.0.0.1:{srv.getsockname()[1]}", 2.0)
    finally:
        t.join(5)
        srv.close()


def _answering(reply: bytes, accepts: list[int]) -> tuple[socket.socket, threading.Thread]:
    """A loopback server that answers every connection with ``reply`` (counting them)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(5)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepts.append(1)
            with conn:
                conn.recv(1024)
                conn.sendall(reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, t


def test_retries_only_what_may_pass_later() -> None:
    """5xx answers are tried again; an answer that is not HTTP is final at once."""
    for reply, want in ((b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n", 3), (b"SSH-2.0-nope\r\n", 1)):
        accepts: list[int] = []
        srv, t = _answering(reply, accepts)
        try:
            try:
                status, _ = http_get(f"127.0.0.1:{srv.getsockname()[1]}", 2.0, retries=2)
                assert status == 503
            except CliError as exc:
                assert "not an HTTP response" in str(exc)
        finally:
            srv.shutdown(socket.SHUT_RDWR)  # wakes serve()'s accept (closing alone leaves it waiting 5 s)
            srv.close()
            t.join(5)
        assert not t.is_alive()
        assert len(accepts) == want, (reply, accepts)


def test_refused_connections_are_tried_again() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(CliError, match="refused"):
        http_get(f"127.0.0.1:{port}", 1.0, retries=1)
