#!/usr/bin/env bash
# Regenerate docs/benchmarks.md (its generated section, the plots and bench/results.json):
# netcoll, Gloo and MPI-TCP on this machine, every collective, 4 B .. 64 MiB x4,
# at 4 ranks and also 2 and 8. About 8 minutes on a 2-core machine.
#
#   bash bench/regenerate.sh                 # the standard sweep
#   bash bench/regenerate.sh --ranks 4       # extra arguments go to bench/compare.py
#
# Peers are optional: without torch (CPU build) or Open MPI + mpi4py that peer is
# skipped with a message (see docs/benchmarks.md, "Reproduce").
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python3 bench/compare.py --ranks 4 2 8 -b 4 -e 64M -f 4 -n 20 -w 5 --op all "$@"
