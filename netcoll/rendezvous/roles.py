"""Roles and refusals of the coordinator's RPC methods: which credential may call what,
and a log line for every refusal (a limit refusal as a WARNING).

Every method a :class:`~.coordinator.Coordinator` serves goes through :func:`guarded`
(members only, unless registered for clients) and its own methods through
:func:`logged`.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import AuthenticationError, RendezvousError, RendezvousTimeout
from ..escape import escape
from ..mesh import auth
from ..rpc import Handler, Session

log = logging.getLogger("netcoll.rendezvous")


def credential(session: Session) -> str:
    """The role a session proved (``auth.MEMBER`` / ``auth.CLIENT``); an in-process
    call with no connection behind it is the operator's: a member."""
    proto = session.proto
    if proto is None:
        return auth.MEMBER
    return proto.credential or auth.CLIENT  # not checked by a handshake: the least trust


def guarded(method: str, handler: Handler, *, clients: bool) -> Handler:
    """``handler``, refusing a client-token session unless ``clients``."""
    if clients:
        return handler

    async def members_only(session: Session, params: dict[str, Any], payload: memoryview) -> Any:
        if credential(session) != auth.MEMBER:
            log.warning("%s from %s:%s refused: a client session may not call it", method, *session.peer[:2])
            raise AuthenticationError(
                f"{method} is for members only: this connection proved the client token (NETCOLL_CLIENT_TOKEN), "
                "which may submit, watch, get and cancel jobs and read status; rank daemons and "
                "netcoll.connect need the member token NETCOLL_TOKEN"
            )
        return await handler(session, params, payload)

    return members_only


def logged(method: str, handler: Handler) -> Handler:
    """``handler``, logging every refusal it raises (a limit refusal as a WARNING)."""

    async def run(session: Session, params: dict[str, Any], payload: memoryview) -> Any:
        try:
            return await handler(session, params, payload)
        except RendezvousTimeout:
            raise  # not a refusal; the handler logs what it needs
        except (RendezvousError, TypeError, ValueError) as exc:
            limit = getattr(exc, "limit", None)
            log.log(
                logging.WARNING if limit else logging.INFO,
                "%s from %s:%s refused%s: %s",
                method,
                *session.peer[:2],
                f" (limit {limit})" if limit else "",
                escape(str(exc), 500),
            )
            raise

    return run
