"""The schedule explorer's long run (issue 34): seeded random programs of collectives,
sends/receives, splits and cancels, issued alike on every rank and awaited in a per-rank
random order, every result checked against numpy; prints the seed and the replay command
of any failure, then a summary per configuration. The explorer itself is
:mod:`netcoll.testing.explore`; this is its command line.

    python3 bench/explore.py --ranks 3,4,8 --links tcp,shm --loop asyncio,netcoll --tuning on,off --seeds 0:500
    python3 bench/explore.py --ranks 2,3,4,8 --links memory --seeds 0:5000
    python3 bench/explore.py --seed 17 --ranks 4 --links shm --loop netcoll --tuning on   # replay one seed
"""

from __future__ import annotations

import sys

from netcoll.testing.explore import main

if __name__ == "__main__":
    sys.exit(main())
