"""``heal(comm, state)``: bring joiners' state up to date from the live members
(DESIGN.md, "Elastic groups"; the transfer is :mod:`.transfer`).

Every rank of the group calls it at the same point; ranks with ``comm.joined``
False are *sources* (live members), the others *joiners*. In order:

1. ``all_gather`` of one row per rank: its joined flag and the digest of its
   state's layout (:mod:`.layout`). No joiner: return (nothing else moves).
   No source: :class:`~.errors.NoSources`. Sources with different digests:
   their layouts are gathered to name the first difference
   (:class:`~.errors.LayoutMismatch`), on every rank.
2. The first source sends the layout to each joiner, which checks it against
   the digest and makes the arrays it lacks (or holds in another shape or
   dtype, or not C-contiguous and writeable); a 1-byte ``all_gather`` tells
   every rank whether every joiner could (else :class:`~.errors.HealError`
   on every rank).
3. Round 1 (:mod:`.transfer`): slice ``i`` from source ``i mod k`` to every
   joiner, all sources at once, each slice's CRC-32 checked.
4. ``all_gather`` of each rank's bad slices. Any: round 2 sends each bad slice
   again, from the *next* source (the same one when there is one source), then
   another ``all_gather``; still bad: :class:`~.errors.ChecksumMismatch` on
   every rank.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..tensors import is_tensor, to_tensor
from . import layout as lay
from .errors import ChecksumMismatch, HealError, LayoutMismatch, NoSources
from .stream import Stream, slices
from .transfer import LAYOUT_TAG, Deadline, Round, Task, recv_round, send_round

if TYPE_CHECKING:
    from ..comm import Communicator

#: default slice (one checksum, one source) and chunk (one message) sizes, bytes
SLICE_BYTES = 64 << 20
CHUNK_BYTES = 16 << 20
#: messages in flight per (source, joiner) pair
WINDOW = 2
#: the smallest slice_bytes and chunk_bytes taken
MIN_BYTES = 4096


async def heal(
    comm: Communicator,
    state: Mapping[str, Any],
    *,
    timeout: float | None = None,
    slice_bytes: int = SLICE_BYTES,
    chunk_bytes: int = CHUNK_BYTES,
    checksum: bool = True,
    joined: bool | None = None,
) -> dict[str, Any]:
    """Collective: make every joiner's state equal to the live members' (bit for bit).

    Args:
        comm: the group (after ``regroup``); ``comm.joined`` says who is a joiner.
        state: a mapping of str keys to numpy arrays, CPU torch tensors, scalars
            (int, float, bool, str, bytes, None; a step counter) or nested mappings of
            these (:mod:`netcoll.elastic.layout`). Live members must hold the same keys,
            shapes, dtypes and scalar values; a joiner's may be empty or stale.
        timeout: seconds the whole heal may take (default: ``comm.timeout``).
        slice_bytes: the stream is cut in slices of about this size, spread over the
            live members (one checksum each); chunk_bytes: one message's bytes (at least
            4096 each; the first live member's values are the ones used, on every rank).
        checksum: check each slice's CRC-32 on the joiners (the first live member's choice
            holds). It costs a pass over the data on every rank (measured in
            docs/training.md, "Healing a joiner"); links already checksum what they carry
            (TCP's 16-bit sum, shared memory none), so leave it on unless that pass shows.
        joined: whether this rank is a joiner (default: ``comm.joined``). Only the
            Communicator a newcomer's admitting regroup returned has ``joined`` True, so a
            joiner whose heal failed (its state is not the group's) passes ``joined=True``
            to the heal after the next ``regroup``, lest it serve its half-healed state.

    Returns:
        On a live member: ``state`` itself (``dict(state)`` if it is another mapping).
        On a joiner: a new dict (nested dicts new too) with the live members' entries:
        its own arrays/tensors where dtype and shape match and the memory is C-contiguous
        and writeable (filled in place), new ones elsewhere (a tensor when the members hold
        one and torch is loaded); scalars are the members'. Joiner keys the members lack
        are left out.

    Raises:
        TypeError: at the call: ``state`` not a mapping, or (live member) a value that
            is not one of the above (the error names its path).
        ValueError: at the call: ``slice_bytes``/``chunk_bytes`` under 4096, ``timeout``
            not positive.
        NoSources, LayoutMismatch, ChecksumMismatch: on every rank (:mod:`.errors`).
        CollectiveError: a transfer failed (``CollectiveTimeout``, ``PeerLost``, ...).
    """
    _check(slice_bytes, chunk_bytes, timeout)
    joined = bool(comm.joined if joined is None else joined)
    entries, arrays = lay.flatten(state, strict=not joined)
    encoded = lay.encode(entries)
    deadline = Deadline(comm.timeout if timeout is None else timeout)
    digest = np.frombuffer(lay.digest(encoded), np.int64)
    row = np.array([int(joined), *digest, slice_bytes, chunk_bytes, int(bool(checksum))], np.int64)
    table = await comm.all_gather(row, timeout=deadline.left())
    joiners = tuple(r for r in range(comm.world_size) if table[r, 0])
    sources = tuple(r for r in range(comm.world_size) if not table[r, 0])
    if not joiners:
        return _same(state)
    if not sources:
        raise NoSources(f"heal: all {comm.world_size} ranks are joiners; no live member holds the state")
    if len({_digest(table, r) for r in sources}) > 1:
        raise await _mismatch(comm, table, sources, encoded, deadline)
    out, refused = None, None
    if joined:
        try:
            entries, arrays, out = await _receive_layout(comm, sources[0], _digest(table, sources[0]), state, deadline)
        except HealError as exc:
            refused = exc
    elif comm.rank == sources[0]:
        blob = np.frombuffer(encoded, np.uint8)
        for w in [comm.send(blob, j, LAYOUT_TAG, timeout=deadline.left()) for j in joiners]:
            await w
    await _agree_layout(comm, refused, sources[0], deadline)
    stream = Stream([arrays[e.path] for e in entries if e.dtype is not None])
    first = table[sources[0]]  # the first live member's slice and chunk sizes and checksum choice
    await _transfer(comm, stream, sources, joiners, (int(first[3]), int(first[4]), bool(first[5])), deadline)
    return _same(state) if out is None else out


async def _agree_layout(comm: Communicator, refused: HealError | None, sender: int, deadline: Deadline) -> None:
    """Every rank learns whether every joiner took the layout (a 1-byte all_gather), so a
    joiner that could not use it fails every rank at once instead of leaving the live
    members to send into a deadline."""
    flags = await comm.all_gather(np.array([refused is not None], np.uint8), timeout=deadline.left())
    if refused is not None:
        raise refused
    if flags.any():
        ranks = [int(r) for r in np.flatnonzero(flags)]
        raise HealError(f"heal: rank(s) {ranks} could not use the state layout rank {sender} sent (see their error)")


def _check(slice_bytes: int, chunk_bytes: int, timeout: float | None) -> None:
    for what, v in (("slice_bytes", slice_bytes), ("chunk_bytes", chunk_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or not MIN_BYTES <= v < 1 << 62:
            raise ValueError(f"heal: {what} must be an int of at least {MIN_BYTES}, got {v!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"heal: timeout must be positive seconds, got {timeout!r}")


def _digest(table: np.ndarray, rank: int) -> bytes:
    """Rank ``rank``'s layout digest, from the first all_gather's table."""
    return bytes(table[rank, 1:3].tobytes())


async def _transfer(
    comm: Communicator,
    stream: Stream,
    sources: tuple[int, ...],
    joiners: tuple[int, ...],
    how: tuple[int, int, bool],
    deadline: Deadline,
) -> None:
    """Steps 3 and 4: the slices from every source, and once more from the next for the corrupt."""
    (slice_bytes, chunk_bytes, check), k = how, len(sources)
    if min(slice_bytes, chunk_bytes) < MIN_BYTES:
        raise HealError(f"heal: rank {sources[0]} sent slice/chunk sizes {how[:2]} (at least {MIN_BYTES} each)")
    cuts = slices(stream.nbytes, k, slice_bytes)
    plan = Round(chunk_bytes, WINDOW, deadline, check)
    first = [Task(i, a, b, sources[i % k], joiners) for i, (a, b) in enumerate(cuts) if b > a]
    bad = await _round(comm, stream, first, len(cuts), plan)
    if not bad:
        return
    still = await _round(comm, stream, _retry(bad, cuts, sources), len(cuts), plan)
    if still:
        j, i = still[0]
        them = (sources[i % k], sources[(i + 1) % k])
        raise ChecksumMismatch(
            f"heal: slice {i} (stream bytes {cuts[i][0]}..{cuts[i][1]}) arrived corrupt on rank {j} from rank "
            f"{them[0]} and again from rank {them[1]}"
            + (f" ({len(still)} corrupt slice(s) in all)" if len(still) > 1 else ""),
            slice=i,
            joiner=j,
            sources=tuple(dict.fromkeys(them)),
        )


def _same(state: Mapping[str, Any]) -> dict[str, Any]:
    """A live member's result: its own state (a dict of it when it is another mapping)."""
    return state if isinstance(state, dict) else dict(state)


async def _round(
    comm: Communicator, stream: Stream, tasks: list[Task], nslices: int, how: Round
) -> list[tuple[int, int]]:
    """Run one transfer round; every rank learns the (joiner, slice) pairs that arrived corrupt."""
    flags = np.zeros(max(nslices, 1), np.uint8)
    if any(comm.rank in t.joiners for t in tasks):  # a joiner (comm.joined, or heal's joined=)
        for t in await recv_round(comm, stream, tasks, how):
            flags[t.slice] = 1
    else:
        await send_round(comm, stream, tasks, how)
    table = await comm.all_gather(flags, timeout=how.deadline.left())
    return [(int(j), int(i)) for j, i in zip(*np.nonzero(table), strict=True)]


def _retry(bad: list[tuple[int, int]], cuts: list[tuple[int, int]], sources: tuple[int, ...]) -> list[Task]:
    """Round 2: each corrupt slice again, from the next source, to the joiners that lack it."""
    by_slice: dict[int, list[int]] = {}
    for j, i in bad:
        by_slice.setdefault(i, []).append(j)
    k = len(sources)
    return [Task(i, *cuts[i], sources[(i + 1) % k], tuple(js)) for i, js in sorted(by_slice.items())]


async def _mismatch(
    comm: Communicator, table: np.ndarray, sources: tuple[int, ...], encoded: bytes, deadline: Deadline
) -> LayoutMismatch:
    """Every rank gathers every layout and names the first difference between source groups."""
    layouts = await comm.all_gather(np.frombuffer(encoded, np.uint8), uneven=True, timeout=deadline.left())
    groups: dict[bytes, list[int]] = {}
    for r in sources:
        groups.setdefault(_digest(table, r), []).append(r)
    ranks_a, ranks_b = list(groups.values())[:2]
    left = lay.decode(bytes(layouts[ranks_a[0]]), sender=ranks_a[0])
    right = lay.decode(bytes(layouts[ranks_b[0]]), sender=ranks_b[0])
    more = f" ({len(groups)} different states in all)" if len(groups) > 2 else ""
    return LayoutMismatch(
        f"heal: the live members hold different states{more}: ranks {ranks_a} and ranks {ranks_b} differ at "
        f"{lay.difference(left, right)}"
    )


async def _receive_layout(
    comm: Communicator, source: int, want: bytes, state: Mapping[str, Any], deadline: Deadline
) -> tuple[list[lay.Entry], dict[lay.Path, np.ndarray], dict[str, Any]]:
    """A joiner's side of step 2: the layout, checked, and the state it will fill."""
    blob = bytes(np.asarray(await comm.recv(source, LAYOUT_TAG, timeout=deadline.left())).reshape(-1).view(np.uint8))
    if lay.digest(blob) != want:
        raise LayoutMismatch(f"heal: the layout rank {source} sent does not match its digest (corrupt in transit)")
    entries = lay.decode(blob, sender=source)
    mine = _leaves(state)
    arrays: dict[lay.Path, np.ndarray] = {}
    out: dict[str, Any] = {}
    for e in entries:
        value: Any = e.value if e.kind != "dict" else {}
        if e.dtype is not None:
            arrays[e.path], value = _target(e, mine.get(e.path))
        node = out
        for key in e.path[:-1]:
            node = node.setdefault(key, {})
        node[e.path[-1]] = value
    return entries, arrays, out


def _target(e: lay.Entry, held: Any) -> tuple[np.ndarray, Any]:
    """Where a joiner's entry ``e`` lands: (the array written, the value returned)."""
    _, have = lay.flatten({"x": held}, strict=False) if held is not None else ([], {})
    arr = have.get(("x",))
    if arr is not None and _fits(arr, e) and (not is_tensor(held) or _plain(held)):
        return arr, held
    new = np.empty(e.shape, e.dtype)
    return new, (to_tensor(new) if e.kind == "tensor" and _torch_loaded() else new)


def _fits(arr: np.ndarray, e: lay.Entry) -> bool:
    """Whether a joiner's array can take entry ``e`` in place."""
    return arr.dtype == e.dtype and arr.shape == e.shape and arr.flags.c_contiguous and arr.flags.writeable


def _plain(t: Any) -> bool:
    """A tensor whose numpy view is its own memory (not a lazily conjugated/negated one)."""
    return not (t.is_conj() or t.is_neg())


def _torch_loaded() -> bool:
    return "torch" in sys.modules


def _leaves(state: Mapping[str, Any], at: tuple[str, ...] = ()) -> dict[lay.Path, Any]:
    """A joiner's own values by path (whatever they are)."""
    out: dict[lay.Path, Any] = {}
    if len(at) >= lay.MAX_DEPTH:
        return out
    for k, v in state.items():
        if isinstance(k, str):
            if isinstance(v, Mapping):
                out.update(_leaves(v, (*at, k)))
            else:
                out[(*at, k)] = v
    return out


__all__ = ["CHUNK_BYTES", "SLICE_BYTES", "heal"]
