"""The group's mesh: one link per peer (:mod:`netcoll.links`), and everything
that makes, authenticates and routes for them.

* :mod:`.channel` — :class:`~.channel.Mesh` (the links of one process to every
  world rank) and :class:`~.channel.Channel` (what one algorithm run sees);
* :mod:`.tcpmesh` — the mesh over sockets: the peer port's listener, dialing,
  the peer handshake and the choice of each pair's link; :mod:`.inprocess` — the
  in-process mesh of tests (every rank a task in one event loop);
* :mod:`.mailbox` — frames routed to operations; :mod:`.answers` — a peer's
  timeout answered with where this rank waits;
* :mod:`.handshake`, :mod:`.auth` — the CHALLENGE / HELLO / WELCOME exchange and its
  token proofs, for every netcoll connection; :mod:`.server` — the accepting side
  with its per-source limits; :mod:`.certs` — TLS settings (:class:`~.certs.TlsConfig`);
  :mod:`.sniff` — what a wrong port speaks.

Nothing is imported here: :mod:`.sniff`, :mod:`.auth` and :mod:`.certs` stay light
(``netcoll health`` imports them).
"""
