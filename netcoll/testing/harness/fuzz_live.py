"""Live fuzzing (issue 10): malformed frames and RPC bodies against a running
coordinator and rank daemons, before and after authentication.

Starts ``python -m netcoll coordinator`` and ``--daemons`` ``python -m netcoll rank``
subprocesses on 127.0.0.1 (free ports, a token), then sends seeded random
malformed input over loopback from several 127.0.0.x source addresses (so the
per-source connection limits of ``netcoll/limits.py`` are not what is tested):

* pre-auth, to the coordinator's RPC port and each daemon's peer port: garbage
  bytes, truncated prefixes, wrong magic/version/kind, absurd lengths, bad
  msgpack headers, oversize control frames, any kind instead of HELLO, HELLOs
  with bad fields or a wrong proof;
* post-auth, on coordinator RPC sessions opened with a valid handshake:
  REQUESTs with unknown methods, known methods with wrong param types, huge
  ints (2**64-1, the largest msgpack carries; 2**70 has no encoding), deep nesting, bad UTF-8, plus frame-level garbage
  (RTS/CTS/CREDIT/DATA/ABORT with bad ids, wrong kinds, bad headers) that ends
  the session; and on daemon peer ports, HELLOs with a valid proof but bad
  identity fields.

Between batches the coordinator must answer ``status`` and run a small real
job. At the end: frames sent per phase, outcomes seen per kind, RSS and open
descriptors of every target before/after. Exit 1 if a target died, stopped
answering, grew RSS by more than ``--max-rss-growth-mib`` or kept more fds.

The targets run with ``NETCOLL_LIMIT_AUTH_FAIL_DELAY_S=0`` (the 0.5 s delay on
a failed handshake is a rate limit on token guessing, not under test here, and
would cap pre-auth fuzzing at ~16 connections/s per source) and log level
``error``. Every loop is bounded by ``--frames`` and ``--seconds``.

    python3 -m netcoll.testing.harness.fuzz_live --frames 100000 --seconds 600
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ...mesh import auth
from ...service import Client
from .cluster import Cluster, settle
from .malformed import HUGE, PREFIX, bad_hello, bad_request, deep, frame, malformed_frame

# -- fuzzing -------------------------------------------------------------------------------


@dataclass
class Stats:
    sent: Counter[str] = field(default_factory=Counter)  # frames per phase
    labels: Counter[str] = field(default_factory=Counter)  # frames per kind of malformation
    outcomes: Counter[str] = field(default_factory=Counter)  # what the target answered
    connections: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "frames_sent": dict(self.sent),
            "frames_total": sum(self.sent.values()),
            "labels": dict(self.labels.most_common()),
            "outcomes": dict(self.outcomes.most_common()),
            "connections": dict(self.connections),
        }


async def _open(host: str, port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection(host, port, local_addr=(source, 0)), 5)


async def _read_frame(reader: asyncio.StreamReader, timeout: float) -> tuple[int, dict[str, Any]] | None:
    """The next frame (kind, header) from the target, or None at EOF."""
    try:
        raw = await asyncio.wait_for(reader.readexactly(20), timeout)
        _, _, kind, _, hlen, plen = PREFIX.unpack(raw)
        body = await asyncio.wait_for(reader.readexactly(hlen), timeout)
        if plen:
            await asyncio.wait_for(reader.readexactly(plen), timeout)
        return kind, msgpack.unpackb(body, raw=False) if hlen else {}
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.transport.abort()


async def _outcome(reader: asyncio.StreamReader, stats: Stats, where: str, timeout: float = 5.0) -> None:
    """Read until the target closes; count the first thing it said."""
    try:
        for _ in range(100):
            got = await _read_frame(reader, timeout)
            if got is None:
                stats.outcomes[f"{where}:closed"] += 1
                return
            kind = got[0]
            if kind == 9:
                stats.outcomes[f"{where}:ERROR"] += 1
                return
            if kind == 7:
                continue
        stats.outcomes[f"{where}:open"] += 1
    except TimeoutError:
        stats.outcomes[f"{where}:no_answer_in_{timeout:g}s"] += 1
    except Exception as exc:  # noqa: BLE001 - counted, not fatal for the fuzzer
        stats.outcomes[f"{where}:{type(exc).__name__}"] += 1


async def pre_auth_one(rng: random.Random, target: tuple[str, int], where: str, source: str, stats: Stats) -> int:
    """One connection, malformed input before (or as) the HELLO. Returns frames sent."""
    reader, writer = await _open(*target, source)
    stats.connections[where + ":pre"] += 1
    try:
        challenge = None
        if rng.random() < 0.8:  # usually read the CHALLENGE first; sometimes talk first
            challenge = await _read_frame(reader, 5)
        frames = []
        if challenge is not None and challenge[0] == 1 and rng.random() < 0.25:
            frames.append(bad_hello(rng, challenge[1].get("nonce", b""), None))
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            frames.append(malformed_frame(rng))
        for label, data in frames:
            stats.labels[label] += 1
            writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        if rng.random() < 0.002:  # rarely: leave a partial frame hanging until the handshake timeout
            stats.outcomes[f"{where}:pre:left_hanging"] += 1
            return len(frames)
        with contextlib.suppress(OSError):
            writer.write_eof()  # a partial frame is then a truncated stream, not a wait
        await _outcome(reader, stats, where + ":pre")
        return len(frames)
    finally:
        _close(writer)


async def post_auth_rpc(
    rng: random.Random, target: tuple[str, int], token: str, source: str, stats: Stats, budget: int
) -> int:
    """An authenticated RPC session: many bad REQUESTs (session stays), maybe a fatal frame at the end."""
    reader, writer = await _open(*target, source)
    stats.connections["coordinator:post"] += 1
    sent = 0
    try:
        challenge = await _read_frame(reader, 5)
        assert challenge is not None and challenge[0] == 1, challenge
        mine = auth.new_nonce()
        proof = auth.proof(token, "hello", challenge[1]["nonce"], mine)
        writer.write(frame(2, {"role": "client", "nonce": mine, "proof": proof}))
        welcome = await _read_frame(reader, 5)
        if welcome is None or welcome[0] != 3:
            stats.outcomes[f"coordinator:post:handshake_refused:{welcome and welcome[0]}"] += 1
            return 0
        answers: Counter[str] = Counter()

        async def drain() -> None:
            while True:
                got = await _read_frame(reader, 30)
                if got is None:
                    return
                kind, hdr = got
                if kind == 7:
                    err = hdr.get("error") or {}
                    answers["ok" if hdr.get("ok") else "error:" + str(err.get("type"))] += 1
                else:
                    answers[f"kind{kind}"] += 1
                    if kind == 9:
                        return

        reading = asyncio.create_task(drain())
        n = rng.randrange(1, max(2, min(budget, 400)))
        for i in range(n):
            if reading.done():  # the target ended the session: count only what it could read
                stats.outcomes["coordinator:post:session_ended_early"] += 1
                break
            if rng.random() < 0.05:
                writer.write(frame(10, {}))
                stats.labels["ping"] += 1
            else:
                label, data = bad_request(rng, rng.choice((i + 1, i + 1, HUGE if rng.random() < 0.01 else i + 1)))
                stats.labels[label] += 1
                writer.write(data)
            sent += 1
            if i % 16 == 0:
                await writer.drain()
                await asyncio.sleep(0)
        fatal = rng.random() < 0.5
        if fatal and reading.done():
            fatal = False
        elif fatal:
            if rng.random() < 0.2:
                label, data = (
                    "request_undecodable",
                    frame(
                        6,
                        {
                            "id": 1,
                            "method": "status",
                            "params": {
                                "x": rng.choice((deep(rng.choice((600, 5000, 20000))), msgpack.ExtType(1, b"x")))
                            },
                        },
                    ),
                )
            else:
                label, data = malformed_frame(rng)
            stats.labels["post:" + label] += 1
            writer.write(data)
            sent += 1
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        if fatal:
            with contextlib.suppress(OSError):
                writer.write_eof()  # a partial frame is a truncated stream, not a wait for the idle timeout
            try:
                await asyncio.wait_for(asyncio.shield(reading), 3)
            except TimeoutError:  # e.g. an ext type the decoder accepts: not fatal after all
                stats.outcomes["coordinator:post:open_3s_after_" + label] += 1
        else:
            writer.write(frame(12, {}))  # BYE: the server answers ERROR ("expected REQUEST") and closes
            with contextlib.suppress(ConnectionError):
                writer.write_eof()
            try:
                await asyncio.wait_for(asyncio.shield(reading), 3)
            except TimeoutError:
                stats.outcomes["coordinator:post:no_close_3s_after_BYE"] += 1
        reading.cancel()
        with contextlib.suppress(BaseException):
            await reading
        for k, v in answers.items():
            stats.outcomes["coordinator:post:" + k] += v
        return sent
    except (ConnectionError, asyncio.IncompleteReadError):
        stats.outcomes["coordinator:post:connection_error"] += 1
        return sent
    finally:
        _close(writer)


async def post_auth_peer(rng: random.Random, target: tuple[str, int], token: str, source: str, stats: Stats) -> int:
    """A daemon peer port: a HELLO with a valid proof but bad identity fields (then maybe garbage)."""
    reader, writer = await _open(*target, source)
    stats.connections["daemon:post"] += 1
    try:
        challenge = await _read_frame(reader, 5)
        if challenge is None or challenge[0] != 1:
            stats.outcomes["daemon:post:no_challenge"] += 1
            return 0
        label, data = bad_hello(rng, challenge[1]["nonce"], token)
        stats.labels[label] += 1
        writer.write(data)
        label, data = malformed_frame(rng)
        stats.labels["post:" + label] += 1
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        await _outcome(reader, stats, "daemon:post", timeout=rng.choice((0.5, 0.5, 0.5, 12)))
        return 2
    finally:
        _close(writer)


async def healthy(cluster: Cluster, client: Any, stats: Stats) -> str | None:
    """None if every target is up and the coordinator answers and runs a job; else why not."""
    dead = cluster.dead()
    if dead:
        return f"died: {dead}"
    try:
        async with asyncio.timeout(30):
            st = await client.status()
            rec = await client.run("all_reduce", size="4KiB", iters=1, warmup=0)
    except Exception as exc:  # noqa: BLE001
        return f"stopped answering: {type(exc).__name__}: {exc}"
    if rec.get("state") != "succeeded":
        return f"health job {rec.get('state')}: {rec.get('error')}"
    stats.outcomes["health_checks_ok"] += 1
    return None if st is not None else "empty status"


async def fuzz(
    *,
    frames: int = 100_000,
    seconds: float = 600.0,
    daemons: int = 2,
    sources: int = 6,
    seed: int = 0,
    batch: int = 2000,
    post_share: float = 0.5,
    log: Any = None,
) -> dict[str, Any]:
    """Run the fuzzer; return the report (``report["ok"]`` and ``report["problems"]``)."""
    asyncio_log = logging.getLogger("asyncio")
    level = asyncio_log.level
    asyncio_log.setLevel(logging.ERROR)  # "socket.send() raised exception": the target hung up, as it should
    try:
        return await _fuzz(frames, seconds, daemons, sources, seed, batch, post_share, log)
    finally:
        asyncio_log.setLevel(level)


async def _fuzz(
    frames: int,
    seconds: float,
    daemons: int,
    sources: int,
    seed: int,
    batch: int,
    post_share: float,
    log: Any,
) -> dict[str, Any]:
    say = log or (lambda *a: None)
    token = secrets.token_hex(16)
    stats = Stats()
    problems: list[str] = []
    t0 = time.monotonic()
    async with Cluster(daemons, token, env={"NETCOLL_LIMIT_AUTH_FAIL_DELAY_S": "0"}) as cluster:
        coord = cluster.coordinator.address
        peer_targets = [p.address for p in cluster.procs[1:] if p.address[1]]
        async with Client(cluster.address, token=token) as client:
            if (why := await healthy(cluster, client, stats)) is not None:
                raise RuntimeError(why)
            before = cluster.sample()
            say(f"targets up: {json.dumps(before)}")
            stop_at = t0 + seconds
            done = 0
            post_goal = int(frames * post_share)
            batches = 0

            async def worker(w: int, quota: int) -> None:
                nonlocal done
                rng = random.Random(seed * 1000 + batches * 100 + w)
                source = f"127.0.0.{10 + w}"
                mine = 0
                while mine < quota and time.monotonic() < stop_at:
                    post = stats.sent["post_auth"] < post_goal and rng.random() < post_share
                    try:
                        if post and (not peer_targets or rng.random() < 0.97):
                            n = await post_auth_rpc(rng, coord, token, source, stats, quota - mine)
                            stats.sent["post_auth"] += n
                        elif post:
                            n = await post_auth_peer(rng, rng.choice(peer_targets), token, source, stats)
                            stats.sent["post_auth"] += n
                        else:
                            where = "coordinator" if not peer_targets or rng.random() < 0.7 else "daemon"
                            target = coord if where == "coordinator" else rng.choice(peer_targets)
                            n = await pre_auth_one(rng, target, where, source, stats)
                            stats.sent["pre_auth"] += n
                    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                        stats.outcomes[f"fuzzer:{type(exc).__name__}"] += 1
                        n = 1
                    mine += max(n, 1)
                    done += max(n, 1)

            while done < frames and time.monotonic() < stop_at:
                quota = min(batch, frames - done)
                await asyncio.gather(*(worker(w, -(-quota // sources)) for w in range(sources)))
                batches += 1
                why = await healthy(cluster, client, stats)
                say(
                    f"batch {batches}: {stats.sent['pre_auth']} pre-auth + {stats.sent['post_auth']} post-auth "
                    f"frames, {time.monotonic() - t0:.0f}s, {json.dumps(cluster.sample())}"
                )
                if why is not None:
                    problems.append(why)
                    break
            await settle(cluster, before)
            after = cluster.sample()
        dead = cluster.dead()
        logs = {p.name: cluster.log(p.name)[-600:] for p in cluster.procs if "Traceback" in cluster.log(p.name)}
    if dead and not any(p.startswith("died") for p in problems):
        problems.append(f"died: {dead}")
    return _report(stats, before, after, problems, logs, time.monotonic() - t0)


def _report(
    stats: Stats,
    before: dict[str, dict[str, float]],
    after: dict[str, dict[str, float]],
    problems: list[str],
    logs: dict[str, str],
    elapsed: float,
    max_rss_growth_mib: float = 20.0,
) -> dict[str, Any]:
    growth = {}
    for name, b in before.items():
        a = after.get(name)
        if a is None:
            problems.append(f"{name}: gone at the end")
            continue
        growth[name] = {"rss_mib": round(a["rss_mib"] - b["rss_mib"], 2), "fds": a["fds"] - b["fds"]}
        if growth[name]["rss_mib"] > max_rss_growth_mib:
            problems.append(f"{name}: RSS grew {growth[name]['rss_mib']} MiB (> {max_rss_growth_mib})")
        if growth[name]["fds"] > 0:
            problems.append(f"{name}: {growth[name]['fds']} more open descriptors")
    return {
        **stats.as_dict(),
        "before": before,
        "after": after,
        "growth": growth,
        "tracebacks_in_logs": logs,
        "seconds": round(elapsed, 1),
        "problems": problems,
        "ok": not problems,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=100_000, help="malformed frames to send in all (default 100000)")
    ap.add_argument("--seconds", type=float, default=900.0, help="stop after this long whatever the count")
    ap.add_argument("--daemons", type=int, default=2)
    ap.add_argument("--sources", type=int, default=6, help="127.0.0.x source addresses (parallel connections)")
    ap.add_argument("--post-share", type=float, default=0.5, help="share of frames sent after authenticating")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    report = asyncio.run(
        fuzz(
            frames=args.frames,
            seconds=args.seconds,
            daemons=args.daemons,
            sources=args.sources,
            seed=args.seed,
            post_share=args.post_share,
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )
    )
    print(json.dumps(report, indent=None if args.json else 2, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
