"""What this machine allows (namespaces, veths, a bridge, the netem and tbf qdiscs), found by
trying each thing in a throwaway namespace that is deleted again; and whether a run can go on."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from typing import Any

from bench.netemlib.common import PREFIX, Skip, say
from bench.netemlib.netns import Host

_QDISC_TRIALS = (
    ("netem", ("netem", "delay", "200us", "rate", "1gbit")),
    ("tbf", ("tbf", "rate", "1gbit", "burst", "131072", "latency", "100ms")),
)


def _binaries(ip: str, tc: str, caps: dict[str, Any]) -> tuple[str, str]:
    """The paths of ``ip`` and ``tc`` (Skip without them), and whether this is root."""
    if not sys.platform.startswith("linux"):
        raise Skip(f"network namespaces need Linux; this is {sys.platform}")
    ip_path, tc_path = shutil.which(ip), shutil.which(tc)
    if ip_path is None:
        raise Skip(f"no `ip` binary ({ip!r}): install iproute2 (apt-get install -y iproute2)")
    if tc_path is None:
        raise Skip(f"no `tc` binary ({tc!r}): install iproute2 (apt-get install -y iproute2)")
    caps.update(ip=ip_path, tc=tc_path)
    caps["root"] = os.geteuid() == 0  # not decisive: capabilities are found by trying them below
    return ip_path, tc_path


def _try_links(host: Host, name: str, caps: dict[str, Any]) -> None:
    """A namespace, a veth pair and a bridge in it (Skip at the first refused)."""
    who = "" if caps["root"] else f" (not root: euid {os.geteuid()}; namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    try:
        host.add_netns(name)
        host.ns(name, "link", "set", "lo", "up")
        host.run([host.ip, "netns", "exec", name, "true"])
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        raise Skip(f"network namespaces are not allowed here{who}: {exc}") from None
    caps["netns"] = True
    try:
        host.ns(name, "link", "add", "pa", "type", "veth", "peer", "name", "pb")
        host.ns(name, "link", "set", "pa", "up")
        host.ns(name, "link", "set", "pb", "up")
    except RuntimeError as exc:
        raise Skip(f"veth pairs are not allowed here: {exc}") from None
    caps["veth"] = True
    try:
        host.ns(name, "link", "add", "br0", "type", "bridge")
    except RuntimeError as exc:
        raise Skip(f"bridges are not allowed here: {exc}") from None
    caps["bridge"] = True


def _try_qdiscs(host: Host, name: str, caps: dict[str, Any]) -> None:
    """Each qdisc on the probe's veth: works (and is removed again), or its error is kept."""
    for kind, args in _QDISC_TRIALS:
        res = host.ns(name, "tc", "qdisc", "add", "dev", "pa", "root", *args, check=False)
        caps[kind] = res.returncode == 0
        if res.returncode != 0:
            caps[f"{kind}_error"] = (res.stderr or res.stdout).strip()
        else:
            host.ns(name, "tc", "qdisc", "del", "dev", "pa", "root", check=False)


def probe(ip: str, tc: str, prefix: str) -> dict[str, Any]:
    """What this machine allows, found by trying each thing in a throwaway namespace.
    Raises Skip when namespaces (or veths, or a bridge) cannot be used."""
    caps: dict[str, Any] = {"root": False, "netns": False, "veth": False, "bridge": False, "netem": False, "tbf": False}
    ip_path, tc_path = _binaries(ip, tc, caps)
    host = Host(ip_path, tc_path, prefix)
    name = f"{prefix}-probe"
    try:
        _try_links(host, name, caps)
        _try_qdiscs(host, name, caps)
    finally:
        problems = host.delete_all()
        if problems:
            say("probe cleanup: " + "; ".join(problems))
    return caps


def gate(args: argparse.Namespace) -> dict[str, Any] | None:
    """The capabilities, said; None (after saying why) where the run cannot go on here."""
    try:
        caps = probe(args.ip, args.tc, f"{PREFIX}-{os.getpid()}")
    except Skip as exc:
        say(f"skipped: {exc}. Nothing was created; exiting 0.")
        return None
    allowed = ", ".join(k for k in ("netns", "veth", "bridge", "netem", "tbf") if caps.get(k))
    say(f"this machine allows: {allowed}" + ("" if caps["netem"] else f"; no netem ({caps.get('netem_error', '?')})"))
    if not caps["netem"] and not caps["tbf"] and args.shape != "none":
        say("skipped: neither netem nor tbf qdiscs work here, so there is nothing to emulate; exiting 0")
        return None
    if args.shape == "netem" and not caps["netem"]:
        say("skipped: --shape netem asked for, but the kernel has no netem; exiting 0")
        return None
    if args.shape in ("tbf", "line") and not caps["tbf"]:
        say(f"skipped: --shape {args.shape} asked for, but tbf does not work here; exiting 0")
        return None
    return caps
