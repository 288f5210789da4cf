"""The ``netcoll`` command line (also ``python -m netcoll``).

Servers (what the containers run)::

    netcoll coordinator [--host H] [--port 29400] [--http-port 29401]
    netcoll rank [--coordinator HOST:PORT] [--host H] [--port 29500] [--http-port 29501]
                 [--rank-hint I] [--advertise-host A]
    netcoll up --ranks N [--host H] [--port P] [--demo]      # coordinator + N daemons, locally

Clients::

    netcoll submit OP [--size 64MiB] [--dtype float32] [--op sum] [--root R] [--algorithm auto]
                      [--iters K] [--warmup W] [--world-size N] [--deadline S] [--json]
    netcoll status [--json]
    netcoll health URL                # exit 0 iff GET URL answers 200 (container healthchecks)
    netcoll bench ...                 # nccl-tests-style sweep (see netcoll bench --help)

Client commands take ``--coordinator HOST:PORT`` (default ``$NETCOLL_COORDINATOR``,
else ``127.0.0.1:29400``); every command reads ``NETCOLL_*`` variables (see
:mod:`netcoll.config`), and a flag wins over its variable.

Exit codes: 0 success; 1 failure (a job that did not succeed, an unreachable
coordinator...); 2 bad arguments or configuration; 130 interrupted. Every
error is one line on stderr, never a traceback.

Imports are lazy so that ``netcoll health`` (run every few seconds by
healthchecks) loads neither numpy nor pydantic.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from .config import ClientConfig
    from .service.client import Client

PROG = "netcoll"
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "reduce_scatter",
               "all_to_all", "barrier")
REDUCE_OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor")
COMMANDS = ("coordinator", "rank", "up", "submit", "status", "health", "bench")


class CliError(Exception):
    """An error for the user: one line, and the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (plus a pointer to --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    from . import __version__

    return str(__version__)


# -- the parser ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The full ``netcoll`` parser (``bench`` flags come from :mod:`netcoll.bench` when run)."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(prog=PROG, formatter_class=fmt,
                description="Collective communication over TCP: a coordinator, rank daemons, and jobs.",
                epilog="Quick start:  netcoll up --ranks 4 --demo\n"
                       "Then, with `netcoll up --ranks 4` running:  netcoll submit all_reduce --size 64MiB")
    p.add_argument("--version", action="version", version=f"netcoll {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def common_server(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--log-level", metavar="LEVEL",
                        help="debug, info, warning, error (env NETCOLL_LOG_LEVEL; default info)")
        sp.add_argument("--ready-file", metavar="PATH",
                        help="once serving, write the bound addresses there as JSON (for supervisors)")

    def common_client(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--coordinator", metavar="HOST:PORT",
                        help="coordinator to talk to (env NETCOLL_COORDINATOR; default 127.0.0.1:29400)")
        sp.add_argument("--json", dest="json_output", action="store_true", default=None,
                        help="print one JSON object instead of text")
        sp.add_argument("--connect-timeout", type=float, metavar="SECONDS", help="default 10")

    sp = sub.add_parser("coordinator", formatter_class=fmt, help="run the coordinator (rendezvous + job service)",
                        description="Run the coordinator: rank daemons register here, clients submit jobs here.\n"
                                    "HTTP /livez /readyz /metrics on --http-port. Token: env NETCOLL_TOKEN.")
    sp.add_argument("--host", help="address to listen on (env NETCOLL_HOST; default 127.0.0.1, "
                                   "0.0.0.0 for every interface)")
    sp.add_argument("--port", help="RPC port (env NETCOLL_PORT; default 29400; 0 = any free port)")
    sp.add_argument("--http-port", help="HTTP health/metrics port (env NETCOLL_HTTP_PORT; default 29401; "
                                        "'off' disables it)")
    sp.add_argument("--http-host", help="address of the HTTP port (default: --host)")
    common_server(sp)
    sp.set_defaults(handler=_cmd_coordinator)

    sp = sub.add_parser("rank", formatter_class=fmt, help="run a rank daemon that joins a coordinator",
                        description="Run a rank daemon: it registers with the coordinator, which assigns its rank,\n"
                                    "and runs the jobs it is sent. SIGTERM drains and leaves. "
                                    "Token: env NETCOLL_TOKEN.")
    sp.add_argument("--coordinator", metavar="HOST:PORT",
                    help="the coordinator (env NETCOLL_COORDINATOR; default 127.0.0.1:29400)")
    sp.add_argument("--host", help="address to listen on for peers, and to dial the coordinator from when "
                                   "specific (env NETCOLL_HOST; default 0.0.0.0)")
    sp.add_argument("--port", help="the one port for all peer traffic (env NETCOLL_PORT; default 29500; 0 = any)")
    sp.add_argument("--http-port", help="HTTP health/metrics port (env NETCOLL_HTTP_PORT; default 29501; 'off')")
    sp.add_argument("--http-host", help="address of the HTTP port (default: --host)")
    sp.add_argument("--rank-hint", metavar="RANK",
                    help="preferred rank, e.g. the pod index; honoured when free (env NETCOLL_RANK_HINT)")
    sp.add_argument("--advertise-host", metavar="HOST",
                    help="address peers dial (env NETCOLL_ADVERTISE_HOST; default: the address the "
                         "coordinator sees this daemon connect from)")
    sp.add_argument("--member-id", help="member id (default: HOSTNAME-PID-RANDOM)")
    sp.add_argument("--heartbeat", type=float, metavar="SECONDS", help=argparse.SUPPRESS)
    common_server(sp)
    sp.set_defaults(handler=_cmd_rank)

    sp = sub.add_parser("up", formatter_class=fmt, help="run a coordinator and N rank daemons locally",
                        description="Start a coordinator and N rank daemons as local processes (the same entry\n"
                                    "points the containers use) and keep them running until Ctrl-C.")
    sp.add_argument("--ranks", "-n", type=int, default=None, metavar="N", help="rank daemons (default 4)")
    sp.add_argument("--host", help="address for every process (env NETCOLL_HOST; default 127.0.0.1)")
    sp.add_argument("--port", help="coordinator port (env NETCOLL_PORT; default 29400; 0 = any free port)")
    sp.add_argument("--http-port", help="coordinator HTTP port (default: --port + 1; 'off')")
    sp.add_argument("--log-level", metavar="LEVEL", help="log level of the processes (default warning)")
    sp.add_argument("--demo", action="store_true", default=None,
                    help="when ready, run every collective once, print the results, stop (exit 0 if all passed)")
    sp.add_argument("--size", metavar="SIZE", help="--demo: bytes per rank (default 1MiB)")
    sp.add_argument("--iters", type=int, metavar="K", help="--demo: iterations per collective (default 3)")
    sp.add_argument("--ready-timeout", type=float, metavar="SECONDS", help="default 60")
    sp.set_defaults(handler=_cmd_up)

    sp = sub.add_parser("submit", formatter_class=fmt, help="run a collective job on the rank daemons",
                        description="Submit a collective job on generated data (verified on every rank) and wait\n"
                                    "for it. Exit 0 iff it succeeded.",
                        epilog="examples:\n  netcoll submit all_reduce --size 64MiB --iters 5\n"
                               "  netcoll submit reduce --dtype int32 --op max --root 2 --json")
    sp.add_argument("op", choices=COLLECTIVES, metavar="OP", help=" | ".join(COLLECTIVES))
    sp.add_argument("--size", metavar="SIZE", help="bytes per rank: 4096, 4KiB, 64MiB, 1G (default 1MiB)")
    sp.add_argument("--dtype", help="float32 (default), float64, float16, bfloat16, int32, int8, bool, ...")
    sp.add_argument("--op", dest="reduce_op", type=str.lower, choices=REDUCE_OPS, metavar="REDOP",
                    help="reduction: " + " ".join(REDUCE_OPS) + " (default sum)")
    sp.add_argument("--root", type=int, help="root rank of broadcast/reduce/gather/scatter (default 0)")
    sp.add_argument("--algorithm", help="auto (default), ring, tree, doubling, pairwise, direct")
    sp.add_argument("--iters", type=int, metavar="K", help="timed iterations (default 1)")
    sp.add_argument("--warmup", type=int, metavar="W", help="untimed iterations first (default 0)")
    sp.add_argument("--world-size", type=int, metavar="N",
                    help="run on exactly N ranks, waiting for them (default: every ready rank daemon)")
    sp.add_argument("--deadline", type=float, metavar="SECONDS", help="the job's deadline once started (300)")
    sp.add_argument("--input", metavar="NAME", help="use the named tensor kept on the ranks instead of generated data")
    sp.add_argument("--output", metavar="NAME", help="keep the result on the ranks under this name")
    common_client(sp)
    sp.set_defaults(handler=_cmd_submit)

    sp = sub.add_parser("status", formatter_class=fmt, help="show members, queue and recent jobs",
                        description="Members (rank, address, epoch, state, current job), the queue and recent jobs.")
    sp.add_argument("--jobs", type=int, metavar="N", help="recent jobs to show (default 10)")
    common_client(sp)
    sp.set_defaults(handler=_cmd_status)

    sp = sub.add_parser("health", formatter_class=fmt, help="GET a health URL: exit 0 on 200 (for healthchecks)",
                        description="GET URL (default path /readyz) with a timeout; exit 0 iff it answers 200.")
    sp.add_argument("url", metavar="URL", help="e.g. http://127.0.0.1:29401/readyz (or HOST:PORT)")
    sp.add_argument("--timeout", type=float, default=2.0, metavar="SECONDS", help="default 2")
    sp.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    sp.set_defaults(handler=_cmd_health)

    sp = sub.add_parser("bench", add_help=False, help="nccl-tests-style benchmark sweep (netcoll bench --help)")
    sp.add_argument("bench_args", nargs=argparse.REMAINDER)
    sp.set_defaults(handler=None)
    return p


def _flags(ns: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(ns).items() if k not in ("command", "handler")}


# -- servers -------------------------------------------------------------------------------------
def _run(coro: Any) -> int:
    """Run a server's main coroutine on netcoll's event loop (``netcoll.loop``:
    asyncio with a briefly spinning selector; ``NETCOLL_LOOP=asyncio|uvloop``)."""
    from .loop import new_event_loop, run

    try:
        new_event_loop().close()  # a bad NETCOLL_LOOP is a clear error, before anything starts
    except ValueError:
        coro.close()
        raise
    return int(run(coro))


def _cmd_coordinator(ns: argparse.Namespace) -> int:
    from .config import CoordinatorConfig
    from .service.serve import serve_coordinator, setup_logging

    cfg = CoordinatorConfig.load(_flags(ns))
    setup_logging(cfg.level, "coordinator")
    return _run(serve_coordinator(cfg))


def _cmd_rank(ns: argparse.Namespace) -> int:
    from .config import RankConfig
    from .service.serve import serve_rank, setup_logging

    cfg = RankConfig.load(_flags(ns))
    tag = setup_logging(cfg.level, "rank")
    return _run(serve_rank(cfg, tag))


def _cmd_up(ns: argparse.Namespace) -> int:
    from .config import UpConfig
    from .service.local import serve_local

    cfg = UpConfig.load(_flags(ns))
    return _run(serve_local(cfg))


# -- clients -------------------------------------------------------------------------------------
def _describe_unreachable(address: str, exc: BaseException) -> str:
    """Why ``address`` cannot be reached, as a short lowercase reason."""
    import socket

    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            pass
    except socket.gaierror as err:
        return f"cannot resolve {host!r} ({err.strerror or err})"
    except OSError as err:
        if isinstance(err, TimeoutError) or err.errno is None:
            return str(err) or "timed out"
        return (err.strerror or str(err)).lower()
    return str(exc) or type(exc).__name__


@asynccontextmanager
async def _client(cfg: ClientConfig) -> AsyncIterator[Client]:
    from .errors import AuthenticationError, NetcollError
    from .service.client import Client

    client = Client(cfg.coordinator, token=cfg.token, timeout=cfg.connect_timeout)
    try:
        await client.__aenter__()
    except AuthenticationError as exc:
        text = _one_line(exc)
        hint = "" if "NETCOLL_TOKEN" in text else " (set the same NETCOLL_TOKEN as the coordinator's)"
        raise CliError(f"authentication with the coordinator at {cfg.coordinator} failed: {text}{hint}") from None
    except (OSError, TimeoutError) as exc:
        raise CliError(f"cannot reach the coordinator at {cfg.coordinator}: "
                       f"{_describe_unreachable(cfg.coordinator, exc)}") from None
    except NetcollError as exc:
        raise CliError(f"the coordinator at {cfg.coordinator} refused the connection: {_one_line(exc)}") from None
    try:
        yield client
    except ConnectionError as exc:
        raise CliError(f"lost the connection to the coordinator at {cfg.coordinator}: {_one_line(exc)}") from None
    finally:
        await client.close()


def _cmd_submit(ns: argparse.Namespace) -> int:
    from .config import SubmitConfig

    cfg = SubmitConfig.load(_flags(ns))
    from .service.jobs import JobSpec

    try:
        spec = JobSpec(**cfg.job_fields())
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        raise CliError(f"invalid job: {_one_line(exc)}", 2) from None
    rec = _run_record(_submit(cfg, spec))
    if cfg.json_output:
        _print_json(_job_json(rec, cfg.coordinator))
    else:
        _print_job(rec)
    if rec["state"] != "succeeded":
        reason = " ".join(str(rec.get("error") or "no reason given").split())
        raise CliError(f"job {rec['id']} {rec['state']}: {reason}")
    return 0


def _run_record(coro: Any) -> dict[str, Any]:
    import asyncio

    result: dict[str, Any] = asyncio.run(coro)
    return result


async def _submit(cfg: Any, spec: Any) -> dict[str, Any]:
    import asyncio
    import signal

    async with _client(cfg) as client:
        job_id = await client.submit(spec)
        interrupted = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, interrupted.set)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        wait = asyncio.ensure_future(client.wait(job_id))
        stop = asyncio.ensure_future(interrupted.wait())
        try:
            await asyncio.wait({wait, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            stop.cancel()
        if not wait.done():
            wait.cancel()
            try:
                await asyncio.wait_for(client.cancel(job_id), 5.0)
                what = f"cancelled job {job_id}"
            except Exception:  # noqa: BLE001 - best effort
                what = f"job {job_id} may still run"
            raise CliError(f"interrupted: {what}", 130)
        result: dict[str, Any] = wait.result()
        return result


def _mean_us(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) * 1e6 if values else None


def _job_json(rec: dict[str, Any], coordinator: str) -> dict[str, Any]:
    doc = {k: v for k, v in rec.items() if k != "result"}
    doc["rank_time_us"] = {r: _mean_us(t) for r, t in (rec.get("timings") or {}).items()}
    doc["coordinator"] = coordinator
    return doc


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, default=str) + "\n")
    sys.stdout.flush()


def _print_job(rec: dict[str, Any]) -> None:
    from .service.local import _human_bytes, _human_time, _num

    spec = rec.get("spec") or {}
    state = rec["state"]
    world = rec.get("world_size") or 0
    where = f" on {world} ranks (epoch {rec.get('epoch')})" if world else ""
    print(f"job {rec['id']} {rec['op']}: {state if state == 'succeeded' else state.upper()}{where}")
    if rec["op"] != "barrier":
        data = f"named tensor {spec.get('input')!r}" if spec.get("data") == "buffer" else \
            f"{_human_bytes(spec.get('size'))} {spec.get('dtype')} per rank"
        extra = f", op {spec.get('reduce_op')}" if rec["op"] in ("all_reduce", "reduce", "reduce_scatter") else ""
        extra += f", root {spec.get('root')}" if rec["op"] in ("broadcast", "reduce", "gather", "scatter") else ""
        print(f"  {data}{extra}, algorithm {spec.get('algorithm')}, {spec.get('iters')} iterations"
              f"{' + ' + str(spec.get('warmup')) + ' warm-up' if spec.get('warmup') else ''}")
    if state == "succeeded":
        verified = {True: "yes", False: "NO", None: "-"}[rec.get("verified")]
        print(f"  time {_human_time(rec.get('time_us'))}/iter   algbw {_num(rec.get('algbw'))} GB/s   "
              f"busbw {_num(rec.get('busbw'))} GB/s   verified {verified}")
    timings = rec.get("timings") or {}
    if timings:
        addresses = {str(r["rank"]): r.get("address") for r in rec.get("ranks") or []}
        print(f"  {'rank':>4}  {'address':<22}{'mean time':>12}")
        for r in sorted(timings, key=int):
            print(f"  {r:>4}  {addresses.get(r) or '-':<22}{_human_time(_mean_us(timings[r])):>12}")


def _cmd_status(ns: argparse.Namespace) -> int:
    from .config import StatusConfig

    cfg = StatusConfig.load(_flags(ns))

    async def get() -> dict[str, Any]:
        async with _client(cfg) as client:
            return await client.status()

    status = _run_record(get())
    if cfg.json_output:
        _print_json({"coordinator": cfg.coordinator, **status})
        return 0
    _print_status(status, cfg.coordinator, cfg.jobs)
    return 0


def _print_status(status: dict[str, Any], coordinator: str, njobs: int) -> None:
    from .service.local import _human_time, _num

    members = status.get("members") or []
    jobs = status.get("jobs") or []
    current = status.get("current_job")
    running = next((j for j in jobs if j.get("id") == current), None)
    print(f"coordinator {coordinator}: {len(members)} rank daemon{'s' if len(members) != 1 else ''}, "
          f"epoch {status.get('epoch')}, {status.get('queued', 0)} queued"
          + (f", running job {current} ({running['op'] if running else '?'})" if current is not None else ""))
    if members:
        print(f"  {'rank':>4}  {'member':<34}{'address':<22}{'state':<10}{'job':>5}  hint")
        for m in members:
            rank = "-" if m.get("rank") is None else str(m["rank"])
            job = "-" if m.get("current_job") is None else str(m["current_job"])
            hint = "-" if m.get("rank_hint") is None else str(m["rank_hint"])
            print(f"  {rank:>4}  {m.get('member_id')!s:<34}{m.get('address')!s:<22}{m.get('state')!s:<10}"
                  f"{job:>5}  {hint}")
        if any(m.get("rank") is None for m in members):
            print("  (rank '-': joins at the next job, which starts a new epoch)")
    else:
        print("  no rank daemons registered (start some: netcoll rank --coordinator HOST:PORT)")
    shown = jobs[-njobs:] if njobs else []
    if shown:
        print("recent jobs:")
        print(f"  {'id':>4}  {'collective':<15}{'state':<11}{'ranks':>5}{'time/iter':>12}{'busbw GB/s':>12}"
              f"  verified  error")
        for j in shown:
            verified = {True: "yes", False: "NO", None: "-"}.get(j.get("verified"), "-")
            err = j.get("error") or ""
            print(f"  {j.get('id'):>4}  {j.get('op')!s:<15}{j.get('state')!s:<11}{j.get('world_size') or 0:>5}"
                  f"{_human_time(j.get('time_us')):>12}{_num(j.get('busbw')):>12}  {verified:<8}  "
                  f"{err[:100] + ('...' if len(err) > 100 else '')}")


# -- health ---------------------------------------------------------------------------------------
def _cmd_health(ns: argparse.Namespace) -> int:
    status, body = http_get(ns.url, ns.timeout)
    first = body.strip().splitlines()[0] if body.strip() else ""
    if status == 200:
        if not ns.quiet:
            print(first or "ok")
        return 0
    raise CliError(f"{ns.url}: HTTP {status}{': ' + first[:200] if first else ''}")


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """GET ``url`` (``http://host:port/path``, or ``host:port`` for ``/readyz``);
    return (status, body). Plain sockets: no heavy imports. Raises CliError."""
    import socket
    from urllib.parse import urlsplit

    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"not an http URL: {url!r}", 2)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise CliError(f"bad port in {url!r}", 2) from None
    path = (parts.path or "/readyz") + (f"?{parts.query}" if parts.query else "")
    if parts.scheme == "https":
        return _https_get(url, timeout)
    host = parts.hostname
    host_header = f"[{host}]" if ":" in host else host
    request = (f"GET {path} HTTP/1.1\r\nHost: {host_header}:{port}\r\nUser-Agent: netcoll-health\r\n"
               "Accept: */*\r\nConnection: close\r\n\r\n").encode("ascii", "replace")
    data = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(request)
            while len(data) < 65536:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except socket.gaierror as exc:
        raise CliError(f"{url}: cannot resolve {host!r} ({exc.strerror or exc})") from None
    except OSError as exc:
        if not data:
            reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc)).lower()
            raise CliError(f"{url}: {reason}") from None
    head, _, body = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    fields = status_line.split()
    if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
        raise CliError(f"{url}: not an HTTP response ({status_line[:60]!r})")
    return int(fields[1]), body.decode("utf-8", "replace")


def _https_get(url: str, timeout: float) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(65536).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"{url}: {getattr(exc, 'reason', exc)}") from None


# -- bench ----------------------------------------------------------------------------------------
def _cmd_bench(argv: list[str]) -> int:
    import asyncio
    import importlib

    try:
        bench = importlib.import_module(f"{__package__ or 'netcoll'}.bench")
        add_arguments, run = bench.add_arguments, bench.run
    except ImportError as exc:
        raise CliError(f"netcoll bench is not available in this installation ({_one_line(exc)})") from None
    except AttributeError:
        raise CliError("netcoll bench is not available in this installation "
                       "(netcoll.bench has no add_arguments/run)") from None
    parser = _Parser(prog=f"{PROG} bench", description=(bench.__doc__ or "").strip().split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return int(asyncio.run(run(args)))


# -- main -------------------------------------------------------------------------------------------
def _one_line(exc: BaseException) -> str:
    """An exception as one line (pydantic's multi-line ValidationError included)."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":
        try:
            parts = []
            for err in errors(include_url=False):
                loc = ".".join(str(x) for x in err.get("loc", ()) if x != "__root__")
                msg = str(err.get("msg", "")).removeprefix("Value error, ")
                parts.append(f"{loc}: {msg}" if loc else msg)
            return "; ".join(parts)
        except Exception:  # noqa: BLE001
            pass
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _fail(prog: str, message: str, code: int) -> int:
    sys.stderr.write(f"{prog}: {message}\n")
    sys.stderr.flush()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``netcoll`` command line; return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    prog = PROG
    try:
        if args[:1] == ["bench"]:
            prog = f"{PROG} bench"
            return _cmd_bench(args[1:])
        parser = build_parser()
        try:
            ns = parser.parse_args(args)
        except SystemExit as exc:  # --help, --version, usage errors (already printed)
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        if ns.command is None:
            parser.print_usage(sys.stderr)
            return _fail(prog, "choose a command: " + ", ".join(COMMANDS) + " (see netcoll --help)", 2)
        prog = f"{PROG} {ns.command}"
        if ns.command == "bench":
            return _cmd_bench(list(ns.bench_args))
        return int(ns.handler(ns))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except CliError as exc:
        return _fail(prog, str(exc), exc.code)
    except KeyboardInterrupt:
        return _fail(prog, "interrupted", 130)
    except BrokenPipeError:  # stdout closed early (`netcoll status | head`): stop quietly
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 141
    except Exception as exc:  # noqa: BLE001 - sorted below; never a traceback
        return _fail(prog, *_classify(exc))


def _classify(exc: BaseException) -> tuple[str, int]:
    from .config import ConfigError
    from .errors import NetcollError
    from .service.serve import StartupError

    if isinstance(exc, ConfigError):
        return str(exc), 2
    if isinstance(exc, StartupError):
        return str(exc), 1
    if isinstance(exc, (NetcollError, OSError, ValueError, TypeError, KeyError, TimeoutError)):
        return _one_line(exc), 1
    if os.environ.get("NETCOLL_DEBUG"):
        import traceback

        traceback.print_exception(exc)
    return f"internal error: {type(exc).__name__}: {_one_line(exc)} (NETCOLL_DEBUG=1 for a traceback)", 1


if __name__ == "__main__":
    sys.exit(main())
