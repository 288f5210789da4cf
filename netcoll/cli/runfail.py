"""The story of a failed ``netcoll run``: which rank failed first and why, from how the
ranks exited and what they noted (:mod:`netcoll.launched`). Pure functions: the
launcher's :class:`~netcoll.cli.supervisor.Supervisor` feeds them what it saw.

Which rank is *the cause* (docs/training.md, "Failures"):

1. a rank that noted an error of its own (kind ``error``): the earliest such note;
2. else, following what the notes point at (a lost peer; the end of a wait chain; the
   rank that aborted), a rank pointed at that noted nothing: it died (its exit says how)
   or never arrived (still running, or stopped by the launcher); a rank pointed at that
   noted an error caused elsewhere points further;
3. else the first rank to exit failing.

A victim -- a rank whose note says its failure came from elsewhere (a timeout or an abort
is never the cause while another rank raised or never arrived) -- gets one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..escape import escape
from ..launched import Note

LINE_MAX = 400  # characters of a rank's error in the launcher's lines


@dataclass(frozen=True)
class Cause:
    """The cause of a failed run: the ``rank`` (or ranks) and what happened to it, in
    words (``"rank 2 failed: ValueError: boom"``, ``"rank 3 never arrived at ..."``)."""

    ranks: tuple[int, ...]
    text: str


def _ranks(ranks: list[int] | tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def shown(error: str) -> str:
    """A rank's error as a launcher line shows it: escaped, bounded."""
    text = escape(error, LINE_MAX + 1)
    return text if len(text) <= LINE_MAX else text[: LINE_MAX - 3] + "..."


def _unnoted_causes(notes: Mapping[int, Note]) -> dict[int, list[int]]:
    """Ranks that notes point at, directly or through other caused-elsewhere notes, and
    that noted nothing themselves: rank -> the ranks whose notes point at it."""
    found: dict[int, list[int]] = {}
    for start, note in sorted(notes.items()):
        todo, seen = list(note.blame), {start}
        while todo:
            r = todo.pop(0)
            if r in seen:
                continue
            seen.add(r)
            theirs = notes.get(r)
            if theirs is None:
                found.setdefault(r, []).append(start)
            elif theirs.caused_elsewhere:
                todo.extend(theirs.blame)
    return found


def _pointing(notes: Mapping[int, Note], ranks: list[int]) -> str:
    """How the ranks pointing at a silent rank failed: ``"ranks 0, 1 timed out waiting for
    it in all_reduce #0"``, ``"rank 3 lost its connection to it"``, ``"rank 2 was aborted
    because of it"``."""
    parts = []
    for kinds, said in (
        (("timeout",), "timed out waiting for it"),
        (("lost",), "lost {its} connection to it"),
        (("aborted", "cancelled"), "{was} aborted because of it"),
    ):
        these = sorted(r for r in ranks if notes[r].kind in kinds)
        if not these:
            continue
        one = len(these) == 1
        text = said.format(its="its" if one else "their", was="was" if one else "were")
        op = next((notes[r].op for r in these if notes[r].op), "") if kinds == ("timeout",) else ""
        parts.append(f"{_ranks(these)} {text}{' in ' + op if op else ''}")
    return "; ".join(parts)


def find_cause(notes: Mapping[int, Note], exits: Mapping[int, str], failed: list[int]) -> Cause | None:
    """The cause, by the rules above. ``notes``: each rank's note; ``exits``: how ranks that
    failed *on their own* (before the launcher stopped any) exited (``"exited with status
    1"``, ``"was killed by SIGKILL"``); ``failed``: the ranks that exited failing, in order."""
    own = [(note.time, r) for r, note in notes.items() if not note.caused_elsewhere]
    if own:
        r = min(own)[1]
        return Cause((r,), f"rank {r} failed: {shown(notes[r].error)}")
    silent = _unnoted_causes(notes)
    if silent:
        died = sorted(r for r in silent if r in exits)
        if died:  # pointed at, and it ended on its own: how it ended is the story
            return Cause(tuple(died), "; ".join(f"rank {r} {exits[r]} ({_pointing(notes, silent[r])})" for r in died))
        ranks = sorted(silent)
        if all(notes[p].kind == "lost" for r in ranks for p in silent[r]):
            return Cause(
                tuple(ranks),
                f"{_ranks(ranks)} {'was' if len(ranks) == 1 else 'were'} lost "
                f"({'; '.join(_pointing(notes, silent[r]) for r in ranks)})",
            )
        how = "; ".join(_pointing(notes, silent[r]) for r in ranks)
        return Cause(tuple(ranks), f"{_ranks(ranks)} never arrived ({how})")
    first = next((r for r in failed if r in exits or r in notes), None)
    if first is None:
        return None
    if first in notes:
        return Cause((first,), f"rank {first} failed: {shown(notes[first].error)}")
    return Cause((first,), f"rank {first} {exits[first]}")


def victim_line(rank: int, note: Note) -> str:
    """One line for a rank that failed because of the cause: its error, and where in its
    code it was (``"rank 0: PeerLost: ... (train.py:12)"``)."""
    at = f" (at {escape(note.at, 200)})" if note.at else ""
    return f"rank {rank}: {shown(note.error)}{at}"


__all__ = ["Cause", "LINE_MAX", "find_cause", "shown", "victim_line"]
