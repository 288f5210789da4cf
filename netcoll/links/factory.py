"""Which kind of link joins two ranks, decided from capabilities both sides
announce in the peer handshake (``link`` in HELLO and WELCOME, see
``docs/protocol.md`` §5.2), and the settings every link gets.

A capability is a bit: TCP (plain); TLS (the same framing over mutual TLS:
offered instead of TCP, never besides it, when TLS is configured, so a rank
with TLS never links in plain text); SHM (shared memory, :mod:`.shm`, offered
besides TCP or TLS and announced per pair: only with a segment the peer can
map, see :mod:`netcoll.mesh.tcpmesh`); MEMORY is the in-process test hub. Each side announces
the kinds it can make (only the forced one when ``NETCOLL_TRANSPORT`` names
one), so both compute the same choice: the first kind, in :data:`PREFERENCE`
order, that both announce and this process has a maker for. A new link kind
is an addition: a bit, a place in :data:`PREFERENCE`, and a maker registered
with :meth:`LinkFactory.register`.

Environment (read by :meth:`LinkConfig.from_env`):

``NETCOLL_TRANSPORT``    ``auto`` (default) or a link kind to force (``tcp``,
                         ``tls``, ``shm``): benchmarks compare like with like;
                         ``shm`` fails the link when shared memory is impossible
``NETCOLL_RECV_WINDOW``  bytes of eager DATA a link accepts before the
                         receiver returns credit (default 64 MiB; ``4M``,
                         ``64MiB``, ``1G`` are understood)
``NETCOLL_SHM_BYTES``    bytes of each direction's ring of a shared-memory link
                         (a multiple of 4 KiB, 64 KiB to 1 GiB; default 4 MiB, less
                         beyond 9 ranks: :func:`~.shmring.auto_ring`)
``NETCOLL_SHM_LANE``     ``0``: no lanes (:mod:`.lane`); checked here, read where links are made
``NETCOLL_SHM_CMA``      ``0``/``1``/``auto``: direct DATA never, always, or while ranks
                         outnumber cores (:mod:`.cma`); the same
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .. import settings
from ..errors import ProtocolError
from . import cma, delayline, lane
from .base import Link
from .shmring import check_ring

#: version of the link protocol announced in the handshake (1: credits + RTS/CTS)
LINK_VERSION: Final = 1
DEFAULT_WINDOW: Final = 64 << 20
MIN_WINDOW: Final = 1024

TCP: Final = 1 << 0
TLS: Final = 1 << 1  # TLS links (links/tls.py)
SHM: Final = 1 << 2  # shared-memory links between ranks on one host (links/shm.py)
MEMORY: Final = 1 << 3  # in-process links of the test hub
BITS: Final[dict[str, int]] = {"tcp": TCP, "tls": TLS, "shm": SHM, "memory": MEMORY}
#: most preferred first
PREFERENCE: Final = ("shm", "tls", "tcp", "memory")


@dataclass(frozen=True, slots=True)
class LinkConfig:
    """Settings of every link a mesh makes.

    Args:
        window: receive window in bytes (eager DATA held before credit returns).
        transport: ``"auto"`` or the link kind to force (``"tcp"``).
        shm_bytes: the ring size of each direction of a shared-memory link
            (None: by the number of peers, :func:`~.shmring.auto_ring`).
    """

    window: int = DEFAULT_WINDOW
    transport: str = "auto"
    shm_bytes: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < MIN_WINDOW:
            raise ValueError(f"the receive window must be an int of at least {MIN_WINDOW} bytes, got {self.window!r}")
        if self.transport != "auto" and self.transport not in BITS:
            raise ValueError(f"transport must be 'auto' or one of {', '.join(BITS)}, got {self.transport!r}")
        if self.shm_bytes is not None:
            check_ring(self.shm_bytes)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, window: int | None = None, transport: str | None = None
    ) -> LinkConfig:
        """Arguments win over ``NETCOLL_RECV_WINDOW`` / ``NETCOLL_TRANSPORT``,
        which win over the defaults (an empty variable counts as unset)."""
        if env is None:  # these are read where links are made: a bad value fails here, before any I/O
            lane.enabled()
            cma.enabled()
            delayline.configured()
        if window is None:
            window = settings.recv_window(env)
            window = DEFAULT_WINDOW if window is None else window
        if transport is None:
            transport = settings.transport(env)
            if transport != "auto" and transport not in BITS:
                raise ValueError(f"NETCOLL_TRANSPORT must be 'auto' or one of {', '.join(BITS)}, got {transport!r}")
        shm_bytes = settings.shm_bytes(env)
        if shm_bytes is not None:
            try:
                shm_bytes = check_ring(shm_bytes, "NETCOLL_SHM_BYTES")
            except ValueError as exc:
                msg = str(exc)
                raise ValueError(msg if msg.startswith("NETCOLL_SHM_BYTES") else f"NETCOLL_SHM_BYTES: {msg}") from None
        return cls(window=window, transport=transport, shm_bytes=shm_bytes)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What one side announces: link protocol version, kinds (bits), window."""

    bits: int
    window: int = DEFAULT_WINDOW
    version: int = LINK_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # keys later kinds add (host id, ...)

    def to_wire(self) -> dict[str, Any]:
        return {**self.extra, "v": self.version, "caps": self.bits, "window": self.window}

    @classmethod
    def from_wire(cls, obj: object, who: str = "the peer") -> Capabilities:
        """Parse the ``link`` map of a HELLO/WELCOME; a peer without one (an
        older netcoll) or with a malformed one is refused."""
        if not isinstance(obj, dict):
            raise ProtocolError(
                f"{who} announced no link capabilities (a netcoll without flow control?); "
                "every rank must run the same netcoll version"
            )
        v, bits, window = obj.get("v"), obj.get("caps"), obj.get("window")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (v, bits, window)):
            raise ProtocolError(f"{who} sent malformed link capabilities {obj!r}")
        assert isinstance(v, int) and isinstance(bits, int) and isinstance(window, int)
        if v < LINK_VERSION:
            raise ProtocolError(f"{who} speaks link protocol {v}; this rank needs {LINK_VERSION}")
        if window < MIN_WINDOW:
            raise ProtocolError(f"{who} announced a receive window of {window} bytes (minimum {MIN_WINDOW})")
        extra = {k: val for k, val in obj.items() if k not in ("v", "caps", "window")}
        return cls(bits=bits, window=window, version=v, extra=extra)


def kinds_of(bits: int) -> list[str]:
    return [k for k in PREFERENCE if bits & BITS[k]]


def choose(mine: Capabilities, theirs: Capabilities, available: tuple[str, ...] | list[str] = PREFERENCE) -> str:
    """The link kind for a pair: the most preferred one both announce and this
    side can make. The same answer on both sides when both can make it."""
    common = mine.bits & theirs.bits
    for kind in PREFERENCE:
        if common & BITS[kind] and kind in available:
            return kind
    raise ProtocolError(
        f"no common link kind: this rank offers {kinds_of(mine.bits) or 'none'}, "
        f"the peer offers {kinds_of(theirs.bits) or 'none'}"
    )


Maker = Callable[..., Link]


class LinkFactory:
    """Announces this side's capabilities and makes the chosen link.

    Args:
        config: the settings (window, forced kind).
        offers: the kinds this mesh can make (e.g. ``("tcp",)``); with a
            forced kind only that one is announced.
    """

    def __init__(self, config: LinkConfig, offers: tuple[str, ...]) -> None:
        self.config = config
        if config.transport != "auto":
            if config.transport not in offers:
                raise ValueError(
                    f"NETCOLL_TRANSPORT={config.transport} but this transport makes {', '.join(offers)} links"
                )
            offers = (config.transport,)
        self.offers = offers
        self.makers: dict[str, Maker] = {}

    def register(self, kind: str, maker: Maker) -> None:
        if kind not in BITS:
            raise ValueError(f"unknown link kind {kind!r}")
        self.makers[kind] = maker

    def capabilities(self, exclude: tuple[str, ...] = ()) -> Capabilities:
        """What this side announces (``exclude``: kinds it cannot make for this pair)."""
        bits = 0
        for kind in self.offers:
            if kind not in exclude:
                bits |= BITS[kind]
        return Capabilities(bits=bits, window=self.config.window)

    def choose(self, theirs: Capabilities, exclude: tuple[str, ...] = ()) -> str:
        """The kind for a pair whose peer announced ``theirs`` (``exclude`` as above)."""
        mine = self.capabilities(exclude)
        return choose(mine, theirs, tuple(k for k in self.offers if k in self.makers and k not in exclude))

    def make(self, kind: str, **kwargs: Any) -> Link:
        try:
            maker = self.makers[kind]
        except KeyError:
            raise ProtocolError(f"this rank cannot make {kind!r} links") from None
        return maker(**kwargs)


__all__ = [
    "LINK_VERSION",
    "DEFAULT_WINDOW",
    "MIN_WINDOW",
    "TCP",
    "TLS",
    "SHM",
    "MEMORY",
    "BITS",
    "PREFERENCE",
    "LinkConfig",
    "Capabilities",
    "LinkFactory",
    "choose",
    "kinds_of",
]
