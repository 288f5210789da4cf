"""``netcoll submit --progress``: a job's progress on stderr while it waits and runs.

The events come from :meth:`netcoll.Client.progress`. On a terminal, one line
redrawn in place with a carriage return (no curses)::

    job 7 all_reduce [#########...........] 9/20 iters  2.2 GiB sent  412.0 MiB/s  4/4 ranks  5.6 s

Anywhere else (a log file, a pipe, CI), one line per update, at most one a
second while running (a change of state or of what the job waits for is always
shown)::

    netcoll submit: job 7 queued: waiting for 2 more ranks (has 2 of 4)
    netcoll submit: job 7 running: 9/20 iterations, 2.2 GiB sent, 412.0 MiB/s, 4/4 ranks reporting, 5.6 s
    netcoll submit: job 7 succeeded
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from ..escape import escape

BAR_WIDTH = 20
LINE_INTERVAL = 1.0  # seconds between two "running" lines when stderr is not a terminal


def human_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``2.2 GiB`` (binary units, one decimal)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def plural(n: int, word: str) -> str:
    """``1 iteration``, ``2 iterations``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _numbers(event: dict[str, Any]) -> tuple[int, int, int, int, int, float]:
    def num(key: str) -> int:
        value = event.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    elapsed = event.get("elapsed_s")
    seconds = float(elapsed) if isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool) else 0.0
    return num("iteration"), num("of"), num("bytes_sent"), num("ranks_reporting"), num("world_size"), seconds


def _rate(sent: int, seconds: float) -> str:
    return f"{human_bytes(sent / seconds)}/s" if seconds > 0 else "-"


def describe(event: dict[str, Any]) -> str:
    """One event as words (the non-terminal form, without the ``job N`` prefix)."""
    state = escape(event.get("state"), 20)
    if state == "queued":
        return f"queued: {escape(event.get('waiting') or 'next in line', 200)}"
    if state != "running":
        return state
    done, of, sent, ranks, world, seconds = _numbers(event)
    return (
        f"running: {done}/{plural(of, 'iteration')}, {human_bytes(sent)} sent, {_rate(sent, seconds)}, "
        f"{ranks}/{world} ranks reporting, {seconds:.1f} s"
    )


def bar(event: dict[str, Any]) -> str:
    """One event as the terminal's line (without the ``job N op`` prefix)."""
    if event.get("state") != "running":
        return describe(event)
    done, of, sent, ranks, world, seconds = _numbers(event)
    filled = BAR_WIDTH * min(done, of) // of if of else 0
    return (
        f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{of} iters  {human_bytes(sent)} sent  "
        f"{_rate(sent, seconds)}  {ranks}/{world} ranks  {seconds:.1f} s"
    )


class ProgressDisplay:
    """Shows progress events on ``out`` (stderr): a redrawn bar on a terminal, else lines."""

    def __init__(self, job_id: int, op: str, out: IO[str] | None = None, *, tty: bool | None = None) -> None:
        self.out = out if out is not None else sys.stderr
        self.tty = self.out.isatty() if tty is None else tty
        self.prefix = f"job {job_id} {escape(op, 40)}"
        self.job_id = job_id
        self.width = 0  # length of the line drawn last (terminal)
        self.last_key: tuple[Any, ...] | None = None
        self.last_line = 0.0
        self.running: dict[str, Any] | None = None  # the last "running" event (terminal)

    def show(self, event: dict[str, Any]) -> None:
        if event.get("topic") == "done":
            self.finish(str(event.get("state")))
        elif self.tty:
            self.running = event if event.get("state") == "running" else self.running
            self._draw(f"{self.prefix} {bar(event)}")
        else:
            self._line(event)

    def _draw(self, text: str) -> None:
        self.out.write("\r" + text + " " * max(self.width - len(text), 0))
        self.out.flush()
        self.width = len(text)

    def _line(self, event: dict[str, Any]) -> None:
        key = (event.get("state"), event.get("waiting"))
        now = time.monotonic()
        if key == self.last_key and now - self.last_line < LINE_INTERVAL:
            return
        self.last_key, self.last_line = key, now
        self.out.write(f"netcoll submit: job {self.job_id} {describe(event)}\n")
        self.out.flush()

    def finish(self, state: str | None = None) -> None:
        """The job ended: end the terminal's line (the bar full if it succeeded); say how
        it ended (lines). Ranks report every half second, so the last report seldom
        covers the last iteration."""
        if self.tty:
            if self.running is not None and state is not None:
                last = dict(self.running, iteration=self.running.get("of")) if state == "succeeded" else self.running
                self._draw(f"{self.prefix} {bar(last)}  {escape(state, 20)}")
                self.running = None
            if self.width:
                self.out.write("\n")
                self.width = 0
        elif state is not None and self.last_key != ("done",):
            self.out.write(f"netcoll submit: job {self.job_id} {escape(state, 20)}\n")
            self.last_key = ("done",)
        self.out.flush()
