"""``netcoll.connect``: join a group at a coordinator and get a Communicator.

Steps: dial the coordinator (authenticated), open this rank's peer port on the
address the coordinator connection went out from (so what we advertise is
routable by construction), join the group (the coordinator assigns ``rank``
when it is None; an elastic newcomer waits until a regroup admits it), link to
every peer (:class:`~netcoll.mesh.tcpmesh.TcpMesh`, per epoch:
:mod:`netcoll.epochs`), and hand out a :class:`Communicator`. Leaving the ``async with`` closes links in order (peers
see an orderly BYE, not a crash) and leaves the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import numbers
from collections.abc import AsyncIterator, Mapping
from typing import Any

from . import settings
from .comm import DEFAULT_TIMEOUT, Communicator
from .epochs import Epochs
from .errors import ConfigError
from .launched import install_excepthook, record_failure
from .links.factory import LinkConfig
from .mesh import auth
from .mesh.certs import TlsConfig
from .mesh.certs import coerce as coerce_tls
from .mesh.tcpmesh import Listener
from .rendezvous import dial

COORDINATOR_ENV = settings.registry.COORDINATOR.name
WORLD_SIZE_ENV = settings.registry.WORLD_SIZE.name
RANK_ENV = settings.registry.RANK.name
LOCAL_HOST_ENV = settings.registry.LOCAL_HOST.name
MIN_STEP = 1.0  # seconds a step of the rendezvous gets at least, however little of the timeout is left


def from_env(
    address: str | None, world_size: int | None, rank: int | None, environ: Mapping[str, str] | None = None
) -> tuple[str, int, int | None]:
    """Fill what the caller left out from the environment ``netcoll run`` sets:
    ``address`` from ``NETCOLL_COORDINATOR``, ``world_size`` from
    ``NETCOLL_WORLD_SIZE`` and, when no address was given, ``rank`` from
    ``NETCOLL_RANK`` (optional: unset lets the coordinator assign one).
    A needed variable that is unset or invalid is a :class:`ConfigError` naming it."""
    if address is None:
        address = settings.coordinator(environ)
        if not address:
            raise ConfigError(
                f"no coordinator address: pass one, or set {COORDINATOR_ENV}=HOST:PORT (netcoll run sets it)"
            )
        if rank is None:
            rank = settings.rank(environ)
    if world_size is None:
        world_size = settings.world_size(environ)
        if world_size is None:
            raise ConfigError(f"no world size: pass world_size=, or set {WORLD_SIZE_ENV} (netcoll run sets it)")
    return address, world_size, rank


def _check_args(world_size: object, rank: object, group: object, timeout: object) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    size = int(world_size)
    if rank is not None and (
        isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= int(rank) < size
    ):
        raise ValueError(f"rank must be None or an int in 0..{size - 1}, got {rank!r}")
    if not isinstance(group, str) or not group or "/" in group:
        raise ValueError(f"group must be a non-empty name without '/', got {group!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not float(timeout) > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


@contextlib.asynccontextmanager
async def connect(
    address: str | None = None,
    *,
    world_size: int | None = None,
    rank: int | None = None,
    group: str = "default",
    token: str | None = None,
    timeout: float = 60.0,
    collective_timeout: float = DEFAULT_TIMEOUT,
    listen_host: str | None = None,
    listen_port: int = 0,
    advertise_host: str | None = None,
    local_host: str | None = None,
    member_id: str | None = None,
    segment_bytes: int | None = None,
    recv_window: int | None = None,
    tls: TlsConfig | Mapping[str, Any] | None = None,
    insecure: bool = False,
    elastic: bool = False,
) -> AsyncIterator[Communicator]:
    """Join ``group`` at the coordinator at ``address`` as one of ``world_size`` ranks.

    Called with no arguments (under ``netcoll run``), it reads the environment
    (:func:`from_env`): ``NETCOLL_COORDINATOR``, ``NETCOLL_WORLD_SIZE``,
    ``NETCOLL_RANK`` (optional) and the token variables.

    Args:
        address: the coordinator, ``"host:port"`` (default: ``$NETCOLL_COORDINATOR``).
        world_size: ranks in the group, every member must agree (default: ``$NETCOLL_WORLD_SIZE``).
        rank: this member's rank, or None to have the coordinator assign one (with no
            ``address``: ``$NETCOLL_RANK`` if set).
        group: the group's name; several groups can meet at one coordinator.
        token: the member token (default: ``$NETCOLL_TOKEN``, else the contents of the
            file ``$NETCOLL_TOKEN_FILE``); every link is authenticated. A client token
            (``NETCOLL_CLIENT_TOKEN``) cannot join a group.
        timeout: seconds for the whole rendezvous: reaching the coordinator (a refused
            connection is tried again with backoff: it may not be up yet), joining and
            linking to peers. No coordinator within it: :class:`~netcoll.RendezvousTimeout`
            naming the address.
        collective_timeout: default deadline of each collective (each call may pass ``timeout=``).
        listen_host / listen_port: where to open this rank's peer port (default: the
            local address of the coordinator connection, an ephemeral port).
        advertise_host: the host peers should dial (default: as the coordinator saw us).
        local_host: source address for the coordinator connection (e.g. ``127.0.0.3``), and so
            the address this rank listens on and advertises (default: ``$NETCOLL_LOCAL_HOST``,
            which ``netcoll run --local-addr`` sets, else the system's choice).
        recv_window: bytes each peer link holds for receives not posted yet before the
            sender waits (default: ``$NETCOLL_RECV_WINDOW``, else 64 MiB; see docs/protocol.md).
        tls: mutual TLS for the coordinator connection and every peer link (a
            :class:`~netcoll.TlsConfig` or a mapping of ``cert``/``key``/``ca`` paths;
            default: ``$NETCOLL_TLS_CERT`` / ``_KEY`` / ``_CA`` when set). Links are then
            ``"tls"`` links, never plain TCP.
        insecure: allow this rank's peer port on a non-loopback address with neither
            a token nor TLS (else :class:`~netcoll.InsecureListenerError`).
        elastic: join the *running* group ``group`` as a newcomer: return once a
            ``regroup`` of its members admits this process (ranked after them, in
            arrival order), with ``comm.joined`` True; ``world_size`` and ``rank`` are
            not used. No regroup within ``timeout``: :class:`~netcoll.RegroupTimeout`.

    Every Communicator it yields can :meth:`~netcoll.Communicator.regroup`; leaving
    the ``async with`` closes whichever epoch's Communicator is current.
    """
    if not isinstance(elastic, bool):
        raise TypeError(f"elastic must be True or False, got {elastic!r}")
    if elastic and rank is not None:
        raise ValueError("an elastic newcomer takes no rank: a regroup ranks it after the members")
    address, world_size, rank = from_env(address, 1 if elastic and world_size is None else world_size, rank)
    rank = None if elastic else rank
    install_excepthook()  # under netcoll run: failures caused elsewhere leave their one line to the launcher
    local_host = local_host or settings.local_host()
    _check_args(world_size, rank, group, timeout)
    links = LinkConfig.from_env(window=recv_window)  # a bad window or NETCOLL_TRANSPORT fails before any I/O
    if token is None:
        token = auth.token_from_env(auth.MEMBER_TOKEN_ENV)
    secure = TlsConfig.from_env() if tls is None else coerce_tls(tls)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout  # the whole rendezvous: reaching the coordinator, joining, linking

    def left() -> float:
        return max(deadline - loop.time(), MIN_STEP)

    async with contextlib.AsyncExitStack() as stack:
        rdv = await dial(address, token=token, timeout=timeout, local_host=local_host, tls=secure)
        stack.push_async_callback(rdv.close)
        listener = Listener(token=token, tls=secure, insecure=insecure)
        await listener.start(listen_host or rdv.local_address[0], listen_port)
        stack.push_async_callback(listener.close)
        epochs = Epochs(
            rdv,
            listener,
            group=group,
            token=token,
            links=links,
            collective_timeout=collective_timeout,
            segment_bytes=segment_bytes,
        )
        stack.push_async_callback(epochs.close)
        if elastic:
            admitted = await epochs.join_elastic(member_id=member_id, advertise_host=advertise_host, timeout=timeout)
            comm = await epochs.open(admitted, left(), joined=True)
        else:
            joined = await rdv.join(
                group=group,
                world_size=world_size,
                rank=rank,
                member_id=member_id,
                listen_port=listener.address[1],
                advertise_host=advertise_host,
                timeout=left(),
            )
            first = {"rank": joined.rank, "world_size": joined.world_size, "session": joined.session}
            peers = [{"host": p.host, "port": p.port} for p in joined.peers]
            comm = await epochs.open({**first, "peers": peers, "epoch": 0}, left())
        try:
            yield comm
        except BaseException as exc:
            record_failure(exc)
            raise
