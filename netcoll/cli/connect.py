"""Opening a :class:`~netcoll.service.client.Client` for a command, with errors a
user can act on: unreachable (and why), wrong token, refused, connection lost."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from .common import CliError
from .errors import one_line

if TYPE_CHECKING:
    from ..config import ClientConfig
    from ..service.client import Client


def describe_unreachable(address: str, exc: BaseException) -> str:
    """Why ``address`` cannot be reached, as a short lowercase reason."""
    import socket

    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            pass
    except socket.gaierror as err:
        return f"cannot resolve {host!r} ({err.strerror or err})"
    except OSError as err:
        if isinstance(err, TimeoutError) or err.errno is None:
            return str(err) or "timed out"
        return (err.strerror or str(err)).lower()
    return str(exc) or type(exc).__name__


async def _open(cfg: ClientConfig) -> Client:
    """A connected Client, or a CliError saying why not."""
    from ..errors import AuthenticationError, NetcollError, ProtocolError
    from ..service.client import Client

    client = Client(
        cfg.coordinator,
        token=cfg.token,
        client_token=cfg.client_token,
        timeout=cfg.connect_timeout,
        tls=cfg.tls_config(),
    )
    try:
        await client.__aenter__()
    except AuthenticationError as exc:
        text = one_line(exc)
        hint = (
            ""
            if "NETCOLL_TOKEN" in text or "NETCOLL_CLIENT_TOKEN" in text or "TLS" in text
            else " (set NETCOLL_CLIENT_TOKEN to the coordinator's client token, or NETCOLL_TOKEN to its member token)"
        )
        raise CliError(f"authentication with the coordinator at {cfg.coordinator} failed: {text}{hint}") from None
    except (OSError, TimeoutError) as exc:
        raise CliError(
            f"cannot reach the coordinator at {cfg.coordinator}: {describe_unreachable(cfg.coordinator, exc)}"
        ) from None
    except ProtocolError as exc:  # not a netcoll server there (an HTTP port, TLS...): the message says what
        raise CliError(f"cannot talk to the coordinator at {cfg.coordinator}: {one_line(exc)}") from None
    except NetcollError as exc:
        raise CliError(f"the coordinator at {cfg.coordinator} refused the connection: {one_line(exc)}") from None
    return client


@asynccontextmanager
async def connected(cfg: ClientConfig) -> AsyncIterator[Client]:
    """``async with connected(cfg) as client``: errors become one-line CliErrors."""
    client = await _open(cfg)
    try:
        yield client
    except ConnectionError as exc:
        raise CliError(f"lost the connection to the coordinator at {cfg.coordinator}: {one_line(exc)}") from None
    finally:
        await client.close()
