"""Tools for testing netcoll and code built on it (as ``trio.testing`` is for trio).

:mod:`netcoll.testing.explore` is the *schedule explorer*: seeded random programs
of collectives, sends and receives, splits and cancels that every rank of a group
runs alike, issued in one order and awaited in a per-rank random order with random
delays, every result checked against numpy. It runs on the in-process mesh
(:func:`~netcoll.testing.explore.run_memory`) and on rank processes over TCP or
shared memory (:mod:`netcoll.testing.processes`); a failure prints its seed and the
command that replays it. ``bench/explore.py`` is its command line for long runs.

The modules: :mod:`.program` (the programs and per-rank schedules, and their
printable form), :mod:`.reference` (every rank's input and expected result),
:mod:`.schedule` (one rank running a program), :mod:`.fixed` (fixed programs: the
two of issue 34), :mod:`.processes` (worlds of rank processes) and :mod:`.explore`
(worlds, verdicts, replay commands, the command line).

:mod:`netcoll.testing.harness` holds the robustness harnesses: chaos (rank daemons
killed and stopped under jobs), soak and live fuzzing, run against whole clusters of
``python -m netcoll`` processes on loopback.
"""
