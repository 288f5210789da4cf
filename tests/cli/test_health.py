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
        with pytest.raises(CliError, match="not an HTTP response \\(closed without answering\\)"):
            http_get(f"127.0.0.1:{srv.getsockname()[1]}", 2.0)
    finally:
        t.join(5)
        srv.close()
