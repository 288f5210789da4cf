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

``waiting_only`` (``netcoll submit`` without ``--progress`` off a terminal) shows the
queued lines only: a job waiting for ranks says so, and nothing more.

The rate is the bytes all ranks sent between two reports over the time between them
(the time to generate the data before the first send is not in it). A finished job's
last line shows the job's own numbers from its record -- time per iteration and bus
bandwidth, as the summary below it -- never the bytes of the last report, which
seldom covers the last iteration.
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


def rate(event: dict[str, Any], before: dict[str, Any] | None) -> str:
    """Bytes per second sent between the report ``before`` and ``event`` (``-`` without
    an earlier report that had sent something, or no time between them)."""
    if before is None:
        return "-"
    _, _, sent, _, _, seconds = _numbers(event)
    _, _, sent0, _, _, seconds0 = _numbers(before)
    if sent0 <= 0 or seconds <= seconds0 or sent < sent0:
        return "-"
    return f"{human_bytes((sent - sent0) / (seconds - seconds0))}/s"


def describe(event: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """One event as words (the non-terminal form, without the ``job N`` prefix); ``before``:
    the previous running event (for the rate)."""
    state = escape(event.get("state"), 20)
    if state == "queued":
        return f"queued: {escape(event.get('waiting') or 'next in line', 200)}"
    if state != "running":
        return state
    done, of, sent, ranks, world, seconds = _numbers(event)
    return (
        f"running: {done}/{plural(of, 'iteration')}, {human_bytes(sent)} sent, {rate(event, before)}, "
        f"{ranks}/{world} ranks reporting, {seconds:.1f} s"
    )


def _filled(done: int, of: int) -> str:
    filled = BAR_WIDTH * min(done, of) // of if of else 0
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}]"


def bar(event: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """One event as the terminal's line (without the ``job N op`` prefix)."""
    if event.get("state") != "running":
        return describe(event)
    done, of, sent, ranks, world, seconds = _numbers(event)
    return (
        f"{_filled(done, of)} {done}/{of} iters  {human_bytes(sent)} sent  "
        f"{rate(event, before)}  {ranks}/{world} ranks  {seconds:.1f} s"
    )


def final_bar(rec: dict[str, Any]) -> str:
    """A succeeded job's last line, from its record: every iteration done, its time per
    iteration and bus bandwidth (the numbers of the summary), ranks, seconds it ran."""
    from ..service.local import gbps, human_time

    spec = rec.get("spec") or {}
    iters = spec.get("iters")
    of = iters if isinstance(iters, int) else 0
    world = rec.get("world_size") or 0
    started, finished = rec.get("started_at"), rec.get("finished_at")
    ran = f"  {finished - started:.1f} s" if isinstance(started, float) and isinstance(finished, float) else ""
    busbw = f"  busbw {gbps(rec.get('busbw'))} GB/s" if rec.get("busbw") is not None else ""
    return f"{_filled(of, of)} {of}/{of} iters  {human_time(rec.get('time_s'))}/iter{busbw}  {world}/{world} ranks{ran}"


class ProgressDisplay:
    """Shows progress events on ``out`` (stderr): a redrawn bar on a terminal, else lines;
    ``waiting_only``: only what a queued job waits for (lines, whatever ``out`` is)."""

    def __init__(
        self,
        job_id: int,
        op: str,
        out: IO[str] | None = None,
        *,
        tty: bool | None = None,
        waiting_only: bool = False,
    ) -> None:
        self.out = out if out is not None else sys.stderr
        self.waiting_only = waiting_only
        self.tty = not waiting_only and (self.out.isatty() if tty is None else tty)
        self.prefix = f"job {job_id} {escape(op, 40)}"
        self.job_id = job_id
        self.width = 0  # length of the line drawn last (terminal)
        self.last_key: tuple[Any, ...] | None = None
        self.last_line = 0.0
        self.running: dict[str, Any] | None = None  # the last "running" event
        self.before: dict[str, Any] | None = None  # the one before it (for the rate)
        self.said = False  # a line was written (waiting_only: say how it ended, then)

    def show(self, event: dict[str, Any]) -> None:
        if event.get("topic") == "done":
            self.finish(str(event.get("state")), event)
            return
        if event.get("state") == "running":
            self.before, self.running = self.running, event
        if self.waiting_only and event.get("state") != "queued":
            return
        if self.tty:
            self._draw(f"{self.prefix} {bar(event, self.before)}")
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
        self.out.write(f"netcoll submit: job {self.job_id} {describe(event, self.before)}\n")
        self.out.flush()
        self.said = True

    def finish(self, state: str | None = None, rec: dict[str, Any] | None = None) -> None:
        """The job ended: end the terminal's line -- for a job that succeeded, with its own
        numbers from ``rec`` (its record), else as far as the last report went; say how
        it ended (lines; with ``waiting_only``, only after a waiting line)."""
        if self.tty:
            if self.running is not None and state is not None:
                shown = final_bar(rec) if state == "succeeded" and rec is not None else bar(self.running, self.before)
                self._draw(f"{self.prefix} {shown}  {escape(state, 20)}")
                self.running = None
            if self.width:
                self.out.write("\n")
                self.width = 0
        elif state is not None and self.last_key != ("done",) and (self.said or not self.waiting_only):
            self.out.write(f"netcoll submit: job {self.job_id} {escape(state, 20)}\n")
            self.last_key = ("done",)
        self.out.flush()
