"""Emulated network (issue 12, goal 4): rank daemons in network namespaces joined by
veth pairs through a bridge, with ``tc`` delay and rate limits; the sweep is run
through them and predicted and measured times are compared, crossovers included.

    sudo python3 -m bench.netem --ranks 4 --delay 200us --rate 1gbit   # from the repository root
    python3 -m bench.netem --check            # only say what this machine allows

What it builds (every name carries ``ncX-<pid>``, so nothing of anyone else is touched):

* a "switch" namespace ``ncX-<pid>-sw`` holding a bridge;
* a coordinator namespace ``ncX-<pid>-c`` (``<subnet>.1``) and one namespace per rank
  ``ncX-<pid>-r<i>`` (``<subnet>.<10+i>``), each joined to the bridge by a veth pair
  that is created inside the namespaces (no link ever appears in the root namespace);
* on every rank's veth: one-way delay and the rate on the rank side (its uplink), the
  rate alone on the switch side (its downlink): a full-duplex link of that rate and a
  rank-to-rank one-way delay of ``--delay``. The coordinator's link (control traffic
  only, never on a collective's path) is not shaped.

The shaping uses ``netem`` (delay + rate) where the kernel has it; where it does not
but ``tbf`` works, the rate is emulated with ``tbf`` and the delay by netcoll's own
delay line in each rank daemon (``NETCOLL_EMULATE_DELAY_US``,
``netcoll/links/delayline.py``: every byte a daemon receives reaches its framing
``--delay`` later), and it says so. ``--shape tbf`` is the rate alone (the predictions
then use a delay of 0). Where namespaces are not allowed (not
root, no iproute2, EPERM, ...) it says why and exits 0. Every capability is found by
trying it in a throwaway namespace.

Then: a netcoll coordinator and N rank daemons (``python3 -m netcoll coordinator|rank``
under ``ip netns exec``) with freshly generated member and client tokens (``--insecure``
only when asked), and ``python3 -m netcoll.bench --coordinator ...`` run from the
coordinator's namespace once per (collective, algorithm), ``auto`` included.

Predictions: ``T = steps * alpha + link_bytes * beta`` per algorithm (the cost headers of
``netcoll/algorithms/*.py``, read as "the busiest link direction carries ``link_bytes``"),
with ``alpha = delay + o`` and ``beta = 1 / rate``, where ``o`` is the per-message
overhead measured on loopback (a 4-byte recursive-doubling all_reduce of the same
number of ranks, inside the switch namespace, divided by its rounds). A second model
adds ``beta0``, the per-byte CPU cost measured on loopback (a 4 MiB ring all_reduce).
Where ``netcoll/selection/cost.py`` exists (the cost model behind ``auto``), its
``predict()`` is used with ``Params(alpha, overhead=0, beta, gamma=0)`` (the same two-parameter
model, from that module's formulas); else the local :func:`cost_terms`. The JSON says which, and
keeps the local formulas' prediction beside it.

Children run with ``NETCOLL_TRANSPORT=tcp``: namespaces do not separate ``/dev/shm``, and
netcoll would otherwise join the ranks by shared memory, around the emulated links.

Everything it created (processes by PID, namespaces, hence veths and the bridge) is
removed on success, failure, Ctrl-C and SIGTERM. Run time is bounded by ``--limit``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

from bench.netemlib import capabilities, cli, report
from bench.netemlib.run import Run, describe, execute, predict_measured


def build_parser() -> argparse.ArgumentParser:
    """The command line; its description is this docstring's first paragraph."""
    return cli.build_parser(__doc__.split("\n\n")[0])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cli.check_args(args)
    if args.from_json:
        return report.replot(args)
    steps = cli.plan(args)
    t0 = time.monotonic()
    caps = capabilities.gate(args)
    if caps is None or args.check:
        return 0
    run = Run(args, caps)
    status = execute(run, steps)  # the phases, then always the cleanup (processes, namespaces)
    if status == 130:
        return status
    status = predict_measured(run, status)
    describe(run, steps, t0, "python3 -m bench.netem " + " ".join(sys.argv[1:] if argv is None else argv))
    report.write(run.result, args)
    return status


def use_netcoll_at(root: str) -> None:
    """Make this process's ``import netcoll`` load the checkout at ``root`` (``--netcoll-path``,
    the code the rank daemons run, so that ``auto``'s predicted choices are that code's). The
    package is loaded by its path: nothing else of that checkout (its ``bench/``) is imported.
    Without a ``netcoll/`` there, the netcoll this process finds is used, as the daemons would."""
    init = os.path.join(root, "netcoll", "__init__.py")
    if not os.path.exists(init):
        return
    spec = importlib.util.spec_from_file_location("netcoll", init, submodule_search_locations=[os.path.dirname(init)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["netcoll"] = module
    spec.loader.exec_module(module)


if __name__ == "__main__":
    _path = next((sys.argv[i + 1] for i, x in enumerate(sys.argv[:-1]) if x == "--netcoll-path"), None)
    if _path is not None:
        use_netcoll_at(os.path.abspath(_path))
    sys.exit(main())
