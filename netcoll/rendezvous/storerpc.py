"""The store's RPC methods (``kv_set``, ``kv_get``, ``kv_add``, ``kv_delete``,
``kv_decide``, ``barrier``): a member's request routed to its running group's
:class:`~.store.Store`, each parameter checked against the limits first."""

from __future__ import annotations

from typing import Any

from ..limits import Limits
from ..rpc import Handler, Reply, Session
from .groups import key_param, timeout_param
from .membership import Membership
from .store import pack


def store_methods(membership: Membership, limits: Limits) -> dict[str, Handler]:
    """The handlers of the store's RPC methods over ``membership``'s groups."""

    async def kv_set(session: Session, params: dict[str, Any], payload: memoryview) -> dict[str, Any]:
        group, _ = membership.running(session, params)
        key = key_param(params, limits=limits)
        group.store.set(key, pack(key, params["value"]) if "value" in params else payload)
        return {}

    async def kv_get(session: Session, params: dict[str, Any], _: memoryview) -> Reply:
        group, _m = membership.running(session, params)
        key, timeout = key_param(params, limits=limits), timeout_param(params, limits=limits)
        return Reply({"key": key}, await group.store.get(key, timeout))

    async def kv_add(session: Session, params: dict[str, Any], _: memoryview) -> int:
        group, _m = membership.running(session, params)
        return group.store.add(key_param(params, limits=limits), params.get("amount", 1))

    async def kv_delete(session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        group, _m = membership.running(session, params)
        return {"deleted": group.store.delete(key_param(params, limits=limits))}

    async def kv_decide(session: Session, params: dict[str, Any], payload: memoryview) -> Reply:
        group, _m = membership.running(session, params)
        key = key_param(params, limits=limits)
        return Reply({"key": key}, group.store.decide(key, params.get("seq"), payload))

    async def barrier(session: Session, params: dict[str, Any], _: memoryview) -> dict[str, Any]:
        group, member = membership.running(session, params)
        name = key_param(params, "name", limits=limits)
        timeout = timeout_param(params, limits=limits)
        assert member.rank is not None
        await group.store.barrier(member.rank, name, timeout)
        return {}

    return {
        "kv_set": kv_set,
        "kv_get": kv_get,
        "kv_add": kv_add,
        "kv_delete": kv_delete,
        "kv_decide": kv_decide,
        "barrier": barrier,
    }


__all__ = ["store_methods"]
