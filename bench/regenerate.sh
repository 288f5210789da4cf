#!/usr/bin/env bash
# Regenerate docs/benchmarks.md (its generated section, every plot) and bench/results.json:
# netcoll over TCP, netcoll's default links (shared memory once that link is picked), Gloo,
# MPI over TCP and MPI with its defaults (shared memory), every collective, 4 B .. 64 MiB x4,
# at 2, 4, 8 and 16 ranks, plus a 500-call 4-byte all_reduce per implementation and world size.
# About 20 minutes on a quiet 2-core machine (above 4 ranks the sizes from 1 MiB up time
# iters*4/P calls; see docs/benchmarks.md, "What is measured").
#
#   bash bench/regenerate.sh                   # the standard sweep
#   bash bench/regenerate.sh --ranks 4         # extra arguments go to bench/compare.py (last wins)
#   python3 bench/compare.py --from-json bench/results.json   # re-render doc + plots, run nothing
#
# Peers are optional: without torch (the CPU build, torch==2.13.0) or Open MPI + mpi4py that
# peer is skipped with a message; without matplotlib there are no plots (see "Reproduce").
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python3 bench/compare.py --ranks 2 4 8 16 -b 4 -e 64M -f 4 -n 20 -w 5 --op all --rounds 3 "$@"
