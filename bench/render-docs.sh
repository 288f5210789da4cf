#!/usr/bin/env bash
# Every generated part of docs/ again, from the committed JSON alone (runs nothing):
#   docs/benchmarks.md "Latest run" + docs/benchmarks-data.md + plots   <- bench/results.json
#   docs/benchmarks.md, docs/emulated-network.md, docs/compression.md
#     (Gloo and netcoll on emulated 1 Gbit/s links)                      <- bench/wire-results.json
#   docs/training.md "Healing a joiner"                                  <- bench/heal-results.json
#   docs/training.md "Chaos, measured"                                   <- bench/chaos-training-results.json
#   docs/losscurves.png                                                  <- bench/losscurves-results.json
# The tables that bigmessage.py, compression.py, tls.py and losscurves.py print with --render
# are pasted in their docs; a test per table keeps the docs equal to that output.
#
#   bash bench/render-docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 bench/compare.py --from-json bench/results.json
python3 -m bench.wire --render-docs bench/wire-results.json
python3 bench/heal.py --docs bench/heal-results.json
python3 -m bench.chaos_training --docs bench/chaos-training-results.json
python3 bench/losscurves.py --render bench/losscurves-results.json --plot docs/losscurves.png > /dev/null
git status --short docs/ || true
