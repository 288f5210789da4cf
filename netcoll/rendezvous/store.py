"""One group instance's key-value store and named barriers: the rules, no sockets.

A :class:`Store` belongs to one instance of a running group (a new generation of the
name gets a new one). Values are kept as msgpack bytes. Every size a request declares
is checked before anything is copied or allocated by it: a value against
``max_kv_value_bytes``, the stored bytes against ``max_kv_bytes``, and the group's keys
plus keys being waited for plus open barriers against ``max_kv_keys``
(:mod:`netcoll.limits`); a refusal is a ``RendezvousError`` naming the limit.

A *decision* (:meth:`Store.decide`) is a set-once value per ``(name, seq)``: the
first value given for it is kept and returned to every caller (a partial
all_reduce's contributors, :mod:`netcoll.algorithms.partial`). The last
:data:`DECISIONS_KEPT` of a name are kept; one asked after it was forgotten is
refused rather than decided again. Each name counts as a key, its values as bytes.

Waiting (``get`` of a key not set yet, ``barrier`` before every rank arrived) is an
asyncio future per waiter; :meth:`Store.close` fails them all when the group goes away,
:meth:`Store.break_barriers` the barriers when a member is gone (they cannot complete).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import RendezvousError, RendezvousTimeout
from ..limits import DEFAULT, Limits
from .groups import INT64_MAX, INT64_MIN, barrier_timeout_message, limit_error, show


def fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail a future its waiters may already have abandoned (no "never retrieved" noise)."""
    if not fut.done():
        fut.set_exception(exc)
        fut.exception()


def pack(key: str, value: Any) -> bytes:
    """``value`` as the msgpack bytes the store keeps (TypeError when it is not msgpack-able)."""
    try:
        packed: bytes = msgpack.packb(value, use_bin_type=True)
    except (OverflowError, ValueError, TypeError) as exc:
        raise TypeError(f"kv_set: the value for key {show(key)} is not msgpack-able: {exc}") from None
    return packed


DECISIONS_KEPT = 4096  # the decisions of one name kept (its latest seqs)


@dataclass(eq=False)
class Decisions:
    """The set-once values of one name, by seq (in the order they were decided), and
    the highest seq forgotten."""

    values: dict[int, bytes] = field(default_factory=dict)
    floor: int = -1


@dataclass(eq=False)
class Barrier:
    """The ranks waiting at one named barrier."""

    arrived: set[int] = field(default_factory=set)
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Store:
    """The key-value store and barriers of the group instance ``group`` of ``world_size`` ranks."""

    def __init__(self, group: str, world_size: int, limits: Limits = DEFAULT) -> None:
        self.group = group
        self.world_size = world_size
        self.limits = limits
        self.kv: dict[str, bytes] = {}
        self.kv_bytes = 0  # sum of the stored values' sizes
        self.kv_waiters: dict[str, set[asyncio.Future[None]]] = {}
        self.barriers: dict[str, Barrier] = {}
        self.decisions: dict[str, Decisions] = {}
        self.broken: str | None = None  # why barriers can no longer complete (a member is gone)

    # -- limits ----------------------------------------------------------------------
    def _check_value(self, key: str, nbytes: int) -> None:
        """Refuse storing ``nbytes`` under ``key`` over a store limit (before any copy)."""
        lim = self.limits
        if nbytes > lim.max_kv_value_bytes:
            raise limit_error(f"value for key {show(key)} of", f"{nbytes} bytes", "max_kv_value_bytes", lim)
        total = self.kv_bytes - len(self.kv.get(key, b"")) + nbytes
        if total > lim.max_kv_bytes:
            raise limit_error(f"key-value store of group {self.group!r} at", f"{total} bytes", "max_kv_bytes", lim)

    def _count_open(self, what: str) -> None:
        """Refuse a new stored key, awaited key or barrier over ``max_kv_keys``."""
        n = len(self.kv) + len(self.kv_waiters) + len(self.barriers) + len(self.decisions)
        if n >= self.limits.max_kv_keys:
            raise limit_error(
                f"{what} in group {self.group!r} with", f"{n} keys and barriers", "max_kv_keys", self.limits
            )

    # -- the store -------------------------------------------------------------------
    def set(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` (msgpack bytes) under ``key``, within the limits; wake its waiters."""
        nbytes = data.nbytes if isinstance(data, memoryview) else len(data)
        if key not in self.kv:
            self._count_open(f"new key {show(key)}")
        self._check_value(key, nbytes)
        packed = bytes(data)
        self.kv_bytes += len(packed) - len(self.kv.get(key, b""))
        self.kv[key] = packed
        for fut in self.kv_waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    async def get(self, key: str, timeout: float | None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` for it to be set."""
        if key not in self.kv:
            if key not in self.kv_waiters:
                self._count_open(f"awaited key {show(key)}")
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.kv_waiters.setdefault(key, set()).add(fut)
            try:
                await asyncio.wait([fut], timeout=timeout)
            finally:
                waiting = self.kv_waiters.get(key)
                if waiting is not None:
                    waiting.discard(fut)
                    if not waiting:
                        del self.kv_waiters[key]
            if not fut.done():
                raise RendezvousTimeout(f"key {key!r} of group {self.group!r} was not set within {timeout:g}s")
            fut.result()  # raises when the group closed meanwhile
            if key not in self.kv:  # set, then deleted before we ran
                raise RendezvousError(f"key {key!r} of group {self.group!r} was deleted right after being set")
        return self.kv[key]

    def add(self, key: str, amount: Any) -> int:
        """Add ``amount`` to the int under ``key`` (0 when unset); the new value."""
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise TypeError(f"amount must be an int, got {show(amount)}")
        if not INT64_MIN <= amount <= INT64_MAX:
            raise ValueError(f"amount must be a 64-bit signed integer, got {show(amount)}")
        try:
            current = msgpack.unpackb(self.kv[key], strict_map_key=False) if key in self.kv else 0
        except Exception as exc:  # noqa: BLE001 - the payload was never validated
            raise TypeError(f"kv_add: key {key!r} does not hold a msgpack int ({exc})") from None
        if not isinstance(current, int) or isinstance(current, bool):
            raise TypeError(f"kv_add: key {key!r} holds a {type(current).__name__}, not an int")
        new = current + amount
        if not INT64_MIN <= new <= INT64_MAX:
            raise ValueError(f"kv_add: key {show(key)} would overflow a 64-bit signed integer ({current} + {amount})")
        self.set(key, msgpack.packb(new))
        return new

    def delete(self, key: str) -> bool:
        """Remove ``key``; whether it was there."""
        old = self.kv.pop(key, None)
        if old is not None:
            self.kv_bytes -= len(old)
        return old is not None

    def decide(self, name: str, seq: Any, data: bytes | memoryview) -> bytes:
        """The value decided for ``(name, seq)``: ``data`` if none was yet (set once),
        else the first one given. RendezvousError for a seq of ``name`` forgotten
        (more than :data:`DECISIONS_KEPT` decisions ago) or over a store limit."""
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= INT64_MAX:
            raise TypeError(f"seq must be a non-negative 64-bit int, got {show(seq)}")
        book = self.decisions.get(name)
        if book is not None and seq in book.values:
            return book.values[seq]
        if book is not None and seq <= book.floor:
            raise RendezvousError(
                f"the decision {show(name)} #{seq} of group {self.group!r} was forgotten "
                f"(only the last {DECISIONS_KEPT} are kept): decide it again under a new seq"
            )
        if book is None:
            self._count_open(f"new decision name {show(name)}")
        nbytes = data.nbytes if isinstance(data, memoryview) else len(data)
        self._check_value(name, nbytes)
        if book is None:
            book = self.decisions[name] = Decisions()
        packed = book.values[seq] = bytes(data)
        self.kv_bytes += len(packed)
        if len(book.values) > DECISIONS_KEPT:
            old = next(iter(book.values))
            self.kv_bytes -= len(book.values.pop(old))
            book.floor = max(book.floor, old)
        return packed

    # -- barriers --------------------------------------------------------------------
    async def barrier(self, rank: int, name: str, timeout: float | None) -> None:
        """Wait at barrier ``name`` until every rank arrived (RendezvousTimeout after ``timeout``)."""
        if self.broken is not None:
            raise RendezvousError(f"barrier {name!r} of group {self.group!r} cannot complete: {self.broken}")
        if name not in self.barriers:
            self._count_open(f"barrier {show(name)}")
        barrier = self.barriers.setdefault(name, Barrier())
        if rank in barrier.arrived:
            raise RendezvousError(f"rank {rank} is already waiting at barrier {name!r}")
        barrier.arrived.add(rank)
        if len(barrier.arrived) == self.world_size:
            del self.barriers[name]
            barrier.done.set_result(None)
            return
        message = ""
        try:
            await asyncio.wait([barrier.done], timeout=timeout)
        finally:
            if not barrier.done.done():
                message = barrier_timeout_message(self.group, name, self.world_size, barrier.arrived, timeout)
                barrier.arrived.discard(rank)
                if not barrier.arrived and self.barriers.get(name) is barrier:
                    del self.barriers[name]
        if not barrier.done.done():
            raise RendezvousTimeout(message)
        barrier.done.result()

    def break_barriers(self, why: str) -> None:
        """A member is gone: no barrier can complete any more (``why`` says who)."""
        self.broken = why
        for b in self.barriers.values():
            fail(b.done, RendezvousError(f"barrier cannot complete: {why}"))
        self.barriers.clear()

    def close(self, err: BaseException) -> None:
        """The group is gone: fail every waiter with ``err``."""
        for futs in self.kv_waiters.values():
            for f in futs:
                fail(f, err)
        self.kv_waiters.clear()
        for b in self.barriers.values():
            fail(b.done, err)
        self.barriers.clear()
