"""What a rank started by ``netcoll run`` does for its launcher (docs/training.md, "Failures").

``netcoll run`` gives each rank a file of its own, ``$NETCOLL_ERROR_FILE``. When an
exception ends a communicator's block, :func:`record_failure` notes it there *before* the
rank leaves the group (so before any peer can fail because of it): when, the error, and
what kind of failure it is, with the ranks it points at (:class:`Note`):

* ``error`` -- its own (any exception not below, a mismatch included): a candidate cause;
* ``lost`` -- a peer's link broke (``PeerLost``): points at that peer;
* ``aborted`` / ``cancelled`` -- another rank failed the collective and said why: points
  at the ranks that rank blamed (a lost peer) or at that rank itself;
* ``timeout`` -- the deadline passed, here or (told by an abort) on another rank: points at
  the ranks at the end of the wait chain (they never delivered: not called yet, stuck, or
  too slow); at none for a deadlock.

The launcher reads the notes (:func:`read_note`) to lead with the rank that failed first
and to give each of the others one line (:mod:`netcoll.cli.runfail`).

Under ``netcoll run`` an uncaught exception is shown accordingly (:func:`install_excepthook`,
which :func:`netcoll.connect` calls when ``$NETCOLL_ERROR_FILE`` is set): one that was noted
as caused elsewhere prints nothing here -- the launcher prints its one line, after the rank
that failed first --, and a traceback leaves out netcoll's own frames (``netcoll/``,
``concurrent/futures``, ``asyncio``): ``NETCOLL_TRACEBACK=full`` shows them all.

The exception may be wrapped (a framework re-raising it as ``RuntimeError``): the first
netcoll collective error in its chain (``__cause__``, ``__context__``) decides the kind.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from . import settings, waits
from .errors import CollectiveAborted, CollectiveCancelled, CollectiveError, CollectiveTimeout, MismatchError, PeerLost

ERROR_FILE_ENV: Final = settings.registry.ERROR_FILE.name
TRACEBACK_ENV: Final = settings.registry.TRACEBACK.name
#: the kinds that point at another rank: the launcher reports them in one line
CAUSED_ELSEWHERE: Final = frozenset({"lost", "aborted", "cancelled", "timeout"})
MAX_ERROR: Final = 1000  # characters of the error kept in a note
_NOTED: Final = "_netcoll_noted"  # attribute an exception gets once noted: its kind
_CHAIN_MAX: Final = 16
_STDLIB: Final = Path(contextlib.__file__).resolve().parent
#: where frames are netcoll's own (or the futures and asyncio machinery under it), not the user's
_INTERNAL: Final = tuple(
    str(p) + os.sep for p in (Path(__file__).resolve().parent, _STDLIB / "concurrent" / "futures", _STDLIB / "asyncio")
)


@dataclass(frozen=True)
class Note:
    """A rank's error note: ``time`` (Unix), ``error`` (``"Type: message"``, one line),
    ``kind`` (above), ``blame`` (the world ranks it points at), ``op`` (``"all_reduce #3"``
    or ""), ``at`` (``"train.py:12"``: where in the rank's own code, or "")."""

    time: float
    error: str
    kind: str = "error"
    blame: tuple[int, ...] = ()
    op: str = ""
    at: str = ""

    @property
    def caused_elsewhere(self) -> bool:
        return self.kind in CAUSED_ELSEWHERE


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or while handling, and so on (bounded)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < _CHAIN_MAX:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _kind(err: CollectiveError) -> str:
    if isinstance(err, MismatchError):
        return "error"
    if isinstance(err, CollectiveTimeout):
        return "timeout"
    if isinstance(err, PeerLost):
        return "lost"
    if isinstance(err, CollectiveCancelled):
        return "cancelled"
    if isinstance(err, CollectiveAborted):
        return "aborted"
    return "error"


def _blame(err: CollectiveError, kind: str) -> tuple[int, ...]:
    """The world ranks ``err`` points at: the end of its wait chain when it has one."""
    if kind == "error":
        return ()
    ranks: list[int] = list(err.ranks)
    if err.waits:
        told = waits.summary(err.waits)
        ranks = told.ends if (told.ends or told.cycles) else ranks  # a deadlock: no one rank to point at
    world = getattr(err, "world_ranks", None) or {}
    return tuple(sorted({int(world.get(r, r)) for r in ranks}))


def _is_internal(filename: str) -> bool:
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return path.startswith(_INTERNAL)


def where_in_user_code(exc: BaseException) -> str:
    """``"train.py:12"``: the innermost frame of ``exc``'s traceback outside netcoll (and
    the standard library's futures and asyncio), or ""."""
    found = ""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _is_internal(code.co_filename) and not code.co_filename.startswith("<"):
            found = f"{os.path.basename(code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def note_of(exc: BaseException, now: float | None = None) -> Note:
    """What to note of ``exc`` (pure: no file, no clock unless ``now`` is None)."""
    err = next((e for e in chain(exc) if isinstance(e, CollectiveError)), None)
    kind = "error" if err is None else _kind(err)
    if kind == "aborted" and err is not None and err.waits:
        kind = "timeout"  # aborted by a rank whose deadline passed: the same wait chain
    shown = exc if err is None or kind == "error" else err
    text = " ".join(f"{type(shown).__name__}: {shown}".split())[:MAX_ERROR]
    op = f"{err.op} #{err.seq}" if err is not None and err.op is not None and err.seq is not None else ""
    return Note(
        time=time.time() if now is None else now,
        error=text,
        kind=kind,
        blame=() if err is None else _blame(err, kind),
        op=op,
        at=where_in_user_code(exc),
    )


def record_failure(exc: BaseException) -> None:
    """Note the error that ended a communicator's block in ``$NETCOLL_ERROR_FILE`` (if set
    and not written yet). ``netcoll run`` sets one per rank: the rank that failed first
    wrote first (the others failed after it left), whichever process exited first."""
    path = settings.error_file()
    if not path or isinstance(exc, GeneratorExit):
        return
    note = note_of(exc)
    with contextlib.suppress(AttributeError, TypeError):
        setattr(exc, _NOTED, note.kind)
    try:
        with open(path, "x", encoding="utf-8") as f:
            json.dump(note.__dict__, f)
    except OSError:
        pass


def read_note(path: str) -> Note | None:
    """The note at ``path`` (None: none, or not one: the file is the rank's, so untrusted)."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        blame = tuple(int(r) for r in raw.get("blame") or ())[:64]
        kind = str(raw.get("kind") or "error")
        return Note(
            time=float(raw["time"]),
            error=str(raw["error"])[:MAX_ERROR],
            kind=kind if kind in CAUSED_ELSEWHERE else "error",
            blame=blame,
            op=str(raw.get("op") or "")[:200],
            at=str(raw.get("at") or "")[:200],
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def trimmed(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without netcoll's own frames (nor futures' and asyncio's): the frames of the
    rank's own code, which is where a user looks."""
    kept = []
    while tb is not None:
        if not _is_internal(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    out: types.TracebackType | None = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


ExceptHook = Callable[[type[BaseException], BaseException, types.TracebackType | None], Any]


def _hook(previous: ExceptHook) -> ExceptHook:
    def hook(kind: type[BaseException], exc: BaseException, tb: types.TracebackType | None) -> Any:
        if settings.traceback_full():
            return previous(kind, exc, tb)
        if getattr(exc, _NOTED, None) in CAUSED_ELSEWHERE:
            return None  # the launcher says it, in one line, after the rank that failed first
        for e in chain(exc):
            with contextlib.suppress(AttributeError, TypeError):
                e.__traceback__ = trimmed(e.__traceback__)
        return previous(kind, exc, exc.__traceback__)

    hook.netcoll = True  # type: ignore[attr-defined]
    return hook


def install_excepthook() -> None:
    """Under ``netcoll run`` (``$NETCOLL_ERROR_FILE`` set): report uncaught exceptions as
    the module docstring says. Once per process; other hooks set before are called."""
    if settings.error_file() and not getattr(sys.excepthook, "netcoll", False):
        sys.excepthook = _hook(sys.excepthook)


__all__ = [
    "CAUSED_ELSEWHERE",
    "ERROR_FILE_ENV",
    "Note",
    "chain",
    "install_excepthook",
    "note_of",
    "read_note",
    "record_failure",
    "trimmed",
    "where_in_user_code",
]
