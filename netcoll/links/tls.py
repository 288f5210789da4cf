"""A link over one mutually authenticated TLS connection.

The connection is a TCP link's (:class:`~netcoll.links.connection.FramedProtocol`
on a :class:`~netcoll.links.sockettransport.SocketTransport`), which runs TLS
(asyncio's TLS layer: :func:`~netcoll.links.connection.start_tls`, from the
settings of :class:`~netcoll.mesh.certs.TlsConfig`) before the peer handshake.
Framing, flow control (credits, RTS/CTS) and closing are the TCP link's; what
differs is below the framing: every byte is encrypted, so a large payload is
copied once into TLS records instead of going to the kernel with ``sendmsg``
(the zero-copy fast path of plain TCP is not used), and an orderly close sends
TLS ``close_notify`` after BYE (TLS has no half-close).
"""

from __future__ import annotations

from .tcp import TcpLink


class TlsLink(TcpLink):
    """One peer over TLS (``kind == "tls"`` in ``link_stats()`` and job records)."""

    kind = "tls"


__all__ = ["TlsLink"]
