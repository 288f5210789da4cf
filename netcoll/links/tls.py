"""A link over one mutually authenticated TLS connection.

The connection is a TCP link's (:class:`~netcoll.links.connection.FramedProtocol`),
whose socket runs TLS (:func:`~netcoll.links.connection.start_tls`, from the
settings of :class:`~netcoll.mesh.certs.TlsConfig`) before the peer handshake:
OpenSSL on the socket itself (:class:`~netcoll.links.tlstransport.TlsTransport`).
Framing, flow control (credits, RTS/CTS) and closing are the TCP link's; what
differs is below the framing: every byte is encrypted straight from the
caller's buffer into TLS records and decrypted straight into the posted
buffer, instead of going to the kernel with zero-copy ``sendmsg``, and an
orderly close sends TLS ``close_notify`` after BYE (TLS has no half-close).
What that costs against plain TCP: ``docs/reliability.md``, "What TLS costs".
"""

from __future__ import annotations

from .tcp import TcpLink


class TlsLink(TcpLink):
    """One peer over TLS (``kind == "tls"`` in ``link_stats()`` and job records)."""

    kind = "tls"


__all__ = ["TlsLink"]
