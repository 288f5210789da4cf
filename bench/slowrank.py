"""``bench.netem`` with one rank's link slower than the others, both ways (issue 36.2: the
weighted all_reduce's case). A wrapper, not a change of ``bench/netemlib``: it replaces
:func:`bench.netemlib.netns.shape` for this run, giving rank ``SLOW_RANK`` (env, default 2)
the rate ``--rate / SLOW_FACTOR`` (env, default 4) on both its qdiscs, and lets
``--algorithms`` name ``weighted``. Every other flag is ``bench.netem``'s::

    sudo env PYTHONPATH=$PWD SLOW_RANK=2 SLOW_FACTOR=4 python3 -m bench.slowrank --ranks 4 \\
        --ops all_reduce --algorithms ring,weighted,auto -b 64M -e 64M -n 3 --cost-model

(``bench.netem``'s predictions have no formula for ``weighted``: its column shows none.)
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from bench import netem
from bench.netemlib import common, netns

if TYPE_CHECKING:
    from bench.netemlib.run import Run

_QDISCS = netns._qdiscs


def slow_qdiscs(run: Run, factor: float) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The rank-side and switch-side qdiscs of a link ``factor`` times slower than ``--rate``."""
    rate = run.args.rate
    run.args.rate = rate / factor
    try:
        return _QDISCS(run)
    finally:
        run.args.rate = rate


def shape(run: Run) -> None:
    """:func:`bench.netemlib.netns.shape`, but rank ``SLOW_RANK``'s qdiscs at ``1/SLOW_FACTOR`` the rate."""
    slow, factor = int(os.environ.get("SLOW_RANK", "2")), float(os.environ.get("SLOW_FACTOR", "4"))
    fast = _QDISCS(run)
    for i, ns in enumerate(run.rns):
        rank_side, switch_side = slow_qdiscs(run, factor) if i == slow else fast
        run.host.ns(ns, "tc", "qdisc", "add", "dev", "eth0", "root", *rank_side)
        run.host.ns(run.sw, "tc", "qdisc", "add", "dev", f"p{i}", "root", *switch_side)
        common.say(f"rank {i} link: {' '.join(rank_side)}")
    run.result["qdisc_rank0"] = run.host.ns(run.rns[0], "tc", "qdisc", "show", "dev", "eth0").stdout.strip()
    run.result["notes"].append(f"rank {slow}'s link {factor:g}x slower than the others, both ways (bench.slowrank)")


def main(argv: list[str] | None = None) -> int:
    netns.shape = shape
    algorithms = common.DEFAULT_ALGORITHMS["all_reduce"]
    if "weighted" not in algorithms:
        common.DEFAULT_ALGORITHMS["all_reduce"] = (*algorithms, "weighted")
    return netem.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
