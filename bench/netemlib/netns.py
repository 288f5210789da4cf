"""The emulated network: namespaces (a switch with a bridge, the coordinator, one per rank),
the veth pairs that join them, the qdiscs that shape the rank links, and their deletion.

:class:`Host` runs ``ip`` and ``tc``, acts only in namespaces it created itself (every name
starts with the run's ``ncX-<pid>`` prefix), and deletes them all (hence their veths and the
bridge) in :meth:`Host.delete_all`."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bench.netemlib.common import fmt_size, say, tc_rate, tc_time

if TYPE_CHECKING:
    from bench.netemlib.run import Run


class Host:
    """Runs ``ip`` / ``tc`` and remembers everything it created."""

    def __init__(self, ip: str, tc: str, prefix: str) -> None:
        self.ip, self.tc, self.prefix = ip, tc, prefix
        self.created: list[str] = []  # namespaces, in creation order
        self.deleted = 0
        self.log: list[str] = []

    def run(
        self, argv: Sequence[str], *, check: bool = True, timeout: float = 20.0
    ) -> subprocess.CompletedProcess[str]:
        self.log.append(" ".join(argv))
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
        if check and res.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` failed ({res.returncode}): {(res.stderr or res.stdout).strip()}")
        return res

    def netns_list(self) -> set[str]:
        res = self.run([self.ip, "netns", "list"], check=False)
        return {line.split()[0] for line in res.stdout.splitlines() if line.strip()}

    def add_netns(self, name: str) -> None:
        if not name.startswith(self.prefix):
            raise RuntimeError(f"refusing to create namespace {name!r} outside {self.prefix}*")
        if name in self.netns_list():
            raise RuntimeError(f"namespace {name} already exists: not ours, refusing to touch it")
        self.run([self.ip, "netns", "add", name])
        self.created.append(name)

    def ns(self, name: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ip -n NAME ...`` (or ``ip netns exec NAME tc ...``) in one of OUR namespaces."""
        if name not in self.created:
            raise RuntimeError(f"refusing to act in namespace {name!r}: not created by this run")
        if argv and argv[0] == "tc":
            return self.run([self.ip, "netns", "exec", name, self.tc, *argv[1:]], check=check)
        return self.run([self.ip, "-n", name, *argv], check=check)

    def exec(self, name: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """``ip netns exec NAME ...`` in one of OUR namespaces."""
        if name not in self.created:
            raise RuntimeError(f"refusing to act in namespace {name!r}: not created by this run")
        return self.run([self.ip, "netns", "exec", name, *argv])

    def delete_all(self) -> list[str]:
        """Delete the namespaces this run created (and with them their veths and bridge);
        return the problems."""
        problems = []
        self.deleted = 0
        for name in reversed(self.created):
            res = self.run([self.ip, "netns", "pids", name], check=False)
            pids = res.stdout.split()
            if pids:
                problems.append(f"processes still in {name}: {' '.join(pids)}")
            res = self.run([self.ip, "netns", "del", name], check=False)
            if res.returncode != 0:
                problems.append(f"ip netns del {name}: {res.stderr.strip()}")
            else:
                self.deleted += 1
        left = self.netns_list() & set(self.created)
        if left:
            problems.append(f"namespaces left: {sorted(left)}")
        self.created = [n for n in self.created if n in left]
        return problems


def build(run: Run) -> None:
    """The switch namespace with its bridge, then the coordinator's and each rank's namespace,
    each joined to the bridge by a veth pair created inside the namespaces."""
    h, a = run.host, run.args
    say(f"creating namespaces {run.prefix}-{{sw,c,r0..r{a.ranks - 1}}} on {a.subnet}.0/24")
    h.add_netns(run.sw)
    h.ns(run.sw, "link", "set", "lo", "up")
    h.ns(run.sw, "link", "add", "br0", "type", "bridge")
    h.ns(run.sw, "link", "set", "br0", "up")
    for ns, addr, port in [
        (run.cns, run.coord_ip, "pc"),
        *zip(run.rns, run.rank_ips, [f"p{i}" for i in range(a.ranks)], strict=True),
    ]:
        h.add_netns(ns)
        h.ns(ns, "link", "set", "lo", "up")
        h.ns(ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", run.sw)
        h.ns(ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        h.ns(ns, "link", "set", "eth0", "up")
        h.ns(run.sw, "link", "set", port, "master", "br0")
        h.ns(run.sw, "link", "set", port, "up")
    congestion(run)
    idle_restart(run)


def congestion(run: Run) -> None:
    """The rank namespaces' default TCP congestion control, recorded (and what ``--congestion``
    sets on the processes' sockets instead, :func:`bench.netemlib.run.congestion_site`): bbr (this
    kernel's default) and cubic treat the bursts of an exchange differently
    (docs/emulated-network.md)."""
    used = {run.host.exec(ns, "sysctl", "-n", "net.ipv4.tcp_congestion_control").stdout.strip() for ns in run.rns}
    run.result["tcp_congestion_default"] = ",".join(sorted(used))
    chosen = run.args.congestion
    say(
        f"TCP congestion control: {run.result['tcp_congestion_default']} by default in the rank namespaces"
        + (f"; the processes' sockets set {chosen} (TCP_CONGESTION)" if chosen else "")
    )


def idle_restart(run: Run) -> None:
    """``--idle-restart off``: no slow start after an idle period on the ranks' connections
    (``net.ipv4.tcp_slow_start_after_idle=0`` in each rank namespace; a namespace's own
    setting, the host's stays as it is). Recorded either way."""
    if run.args.idle_restart == "off":
        for ns in run.rns:
            run.host.exec(ns, "sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0")
    seen = {run.host.exec(ns, "sysctl", "-n", "net.ipv4.tcp_slow_start_after_idle").stdout.strip() for ns in run.rns}
    run.result["tcp_slow_start_after_idle"] = ",".join(sorted(seen))
    say(f"TCP slow start after idle in the rank namespaces: {run.result['tcp_slow_start_after_idle']}")


def congestion_seen(run: Run) -> None:
    """The congestion control ``ss`` shows on rank 0's TCP connections, after the sweeps."""
    text = run.host.exec(run.rns[0], "ss", "-tin").stdout
    seen = sorted(set(re.findall(r"\b(bbr|cubic|reno)\b", text)))
    run.result["tcp_congestion_seen"] = seen
    say(f"rank 0's connections use: {', '.join(seen) or '?'} (ss -tin)")


def _qdiscs(run: Run) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The qdisc of a rank's uplink (rank side) and of its downlink (switch side)."""
    a = run.args
    if run.shaping == "netem":
        limit = str(max(1000, int(a.rate / 8 * a.queue / 1500)))  # --queue of the rate, in packets
        rank_side = ("netem", "delay", tc_time(a.delay), "rate", tc_rate(a.rate), "limit", limit)
        return rank_side, ("netem", "rate", tc_rate(a.rate), "limit", limit)
    burst = max(32 * 1024, int(a.rate / 8 * 1e-3))  # 1 ms of the rate, at least 32 KiB (a GSO super-packet)
    tbf = ("tbf", "rate", tc_rate(a.rate), "burst", str(burst), "latency", tc_time(a.queue))
    return tbf, tbf


def shape(run: Run) -> None:
    """Every rank link: delay and rate on the rank side, the rate on the switch side (netem),
    or the rate on both (tbf, where the kernel has no netem); says what it did."""
    a, h = run.args, run.host
    if run.shaping == "none":
        say("no shaping (--shape none): plain veths")
        return
    rank_side, switch_side = _qdiscs(run)
    for i, ns in enumerate(run.rns):
        h.ns(ns, "tc", "qdisc", "add", "dev", "eth0", "root", *rank_side)
        h.ns(run.sw, "tc", "qdisc", "add", "dev", f"p{i}", "root", *switch_side)
    shown = h.ns(run.rns[0], "tc", "qdisc", "show", "dev", "eth0").stdout.strip()
    run.result["qdisc_rank0"] = shown
    if run.shaping == "netem":
        say(f"netem on every rank link: one-way delay {a.delay * 1e6:.0f} µs, {a.rate / 1e9:g} Gbit/s each way")
    elif run.shaping == "tbf+line":
        say(
            f"netem is NOT available here ({run.caps.get('netem_error', 'unknown qdisc')}): the rate by tbf at "
            f"{a.rate / 1e9:g} Gbit/s each way, the one-way delay of {a.delay * 1e6:.0f} µs by netcoll's own "
            "delay line in each rank daemon (NETCOLL_EMULATE_DELAY_US)"
        )
        run.result["notes"].append("netem missing: rate by tbf, delay by netcoll's delay line in each rank daemon")
    else:
        say(
            f"netem is NOT available here ({run.caps.get('netem_error', 'unknown qdisc')}): "
            f"rate only, with tbf at {a.rate / 1e9:g} Gbit/s each way; the delay of "
            f"{a.delay * 1e6:.0f} µs could NOT be emulated and is left out of the predictions"
        )
        run.result["notes"].append("netem missing: delay not emulated, rate-only run with tbf")
    say(f"rank0 eth0: {shown}")


def link_stats(run: Run) -> None:
    """Bytes each rank's shaped uplink carried: proof that the traffic crossed the emulated links."""
    congestion_seen(run)
    if run.shaping == "none":
        return
    sent = []
    for ns in run.rns:
        text = run.host.ns(ns, "tc", "-s", "qdisc", "show", "dev", "eth0", check=False).stdout
        m = re.search(r"Sent (\d+) bytes", text)
        sent.append(int(m.group(1)) if m else None)
    run.result["qdisc_sent_bytes"] = sent
    total = sum(x or 0 for x in sent)
    say(f"bytes sent through the shaped rank uplinks: {', '.join(fmt_size(x or 0) for x in sent)}")
    if run.result["sweeps"] and run.args.maxbytes >= 1 << 20 and total < run.args.maxbytes:
        say("WARNING: far fewer bytes crossed the shaped links than the sweep moved")
        run.result["notes"].append("the shaped links carried less than the sweep moved")
