"""The implementations of a comparison run, their names in tables, and reading older results.

A run (one world size) in ``bench/results.json``::

    {"world_size": 4, "notes": [...],
     "impls": {"netcoll-tcp": [rows], "netcoll": [rows], "gloo": [...], "mpi": [...], "mpi-sm": [...]},
     "latency": {impl: row},                      # the dedicated 4-byte all_reduce runs
     "links": {"netcoll-tcp": ["tcp"], "netcoll": ["shm"]},   # link kinds netcoll used
     "aliases": {"netcoll": "netcoll-tcp"}}       # default not measured twice: same links as TCP

Results written before netcoll had a choice of links have one ``netcoll`` implementation over
TCP and no ``links``: :func:`norm_run` reads them as ``netcoll-tcp``.
"""

from __future__ import annotations

from typing import Any

#: every implementation, in table order
IMPLS = ("netcoll-tcp", "netcoll", "gloo", "mpi", "mpi-sm")
NETCOLL = ("netcoll-tcp", "netcoll")
PEERS = ("gloo", "mpi", "mpi-sm")
TCP_PEERS = ("gloo", "mpi")
PEER_LABEL = {"gloo": "Gloo", "mpi": "MPI-TCP", "mpi-sm": "MPI-SM"}
LETTER = {"gloo": "g", "mpi": "m", "mpi-sm": "s"}


def norm_run(run: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``run`` in the current layout (older results: ``netcoll`` was TCP)."""
    out = dict(run)
    impls = dict(run.get("impls") or {})
    latency = dict(run.get("latency") or {})
    links = dict(run.get("links") or {})
    if "links" not in run and "netcoll" in impls and "netcoll-tcp" not in impls:
        impls["netcoll-tcp"] = impls.pop("netcoll")
        if "netcoll" in latency:
            latency["netcoll-tcp"] = latency.pop("netcoll")
        links = {"netcoll-tcp": ["tcp"]}
    out["impls"], out["latency"], out["links"] = impls, latency, links
    out["aliases"] = dict(run.get("aliases") or {})
    out.setdefault("notes", [])
    return out


def present(run: dict[str, Any]) -> list[str]:
    """The implementations with rows in this (normalized) run, in table order."""
    return [i for i in IMPLS if run["impls"].get(i)]


def label(impl: str, run: dict[str, Any] | None = None) -> str:
    """A table name: ``netcoll-TCP``, ``netcoll-SHM`` (the default, by the links it used), ``Gloo``..."""
    if impl in PEER_LABEL:
        return PEER_LABEL[impl]
    links = (run or {}).get("links", {})
    aliases = (run or {}).get("aliases", {})
    if impl == "netcoll-tcp":
        return "netcoll-TCP (= default)" if aliases.get("netcoll") == "netcoll-tcp" else "netcoll-TCP"
    if impl == "netcoll":
        kinds = links.get("netcoll")
        if not kinds:
            return "netcoll (default)"
        name = "+".join(k.upper() for k in kinds)
        return f"netcoll-{name} (default)" if name == "TCP" else f"netcoll-{name}"
    return impl


def label_across(impl: str, runs: list[dict[str, Any]]) -> str:
    """A name for tables spanning world sizes: the per-run name when every run agrees, else the
    default's link kinds by world size (``netcoll (default: tcp at 2, shm at 16 ranks)``)."""
    names = {label(impl, run) for run in runs if run["impls"].get(impl)}
    if len(names) <= 1:
        return names.pop() if names else label(impl)
    kinds = [
        f"{'+'.join(run['links'].get(impl) or ['?'])} at {run['world_size']}" for run in runs if run["impls"].get(impl)
    ]
    return f"netcoll (default: {', '.join(kinds)} ranks)"


def peer_names(peers: tuple[str, ...] | list[str]) -> str:
    return "/".join(PEER_LABEL[p] for p in peers)
