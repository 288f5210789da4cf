"""What a receiver of a reduction over loopback TCP pays per segment: reading it whole into
a scratch buffer and then adding it (what TCP links did before folding), against reading it
through a small piece that is folded as soon as it is full (``netcoll/links/folding.py``;
docs/performance.md, "Folding over TCP").

    python3 bench/tcpfold.py [--size 4M] [--iters 100] [--rounds 3] [--piece 1M]

A forked child sends segments of ``--size`` bytes of float32 ones over a loopback socket;
the parent receives ``--iters`` of them one way, then as many the other, for ``--rounds``
rounds (the order swapped every round), adding each to its own data and checking every sum,
and reports per mode the median over the rounds of the wall time per segment and of its own
CPU (user + system) per segment. Only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import time

import numpy as np

from netcoll.links.folding import FoldPieces
from netcoll.ops import Fold, ReduceOp, reduce_to
from netcoll.sizes import parse_size

MODES = ("whole", "pieces")


def _send(port: int, size: int, count: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        payload = np.ones(size // 4, np.float32).data.cast("B")
        for _ in range(count):
            s.sendall(payload)


def _recv_whole(conn: socket.socket, own: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> None:
    view, got = scratch.data.cast("B"), 0
    while got < view.nbytes:
        n = conn.recv_into(view[got:])
        if not n:
            raise ConnectionError("the sender went away")
        got += n
    reduce_to(ReduceOp.SUM, out, own, scratch.view(np.float32))


def _recv_pieces(conn: socket.socket, own: np.ndarray, out: np.ndarray, piece: memoryview) -> None:
    fold = Fold(ReduceOp.SUM, out, own)
    pieces = FoldPieces(fold, piece, memoryview(b""))
    while not fold.complete:
        n = conn.recv_into(pieces.room())
        if not n:
            raise ConnectionError("the sender went away")
        pieces.took(n)


def measure(size: int, iters: int, piece: int, rounds: int = 3) -> dict[str, tuple[float, float]]:
    """Per mode: (wall seconds, receiver CPU seconds) per segment of ``size`` bytes,
    each the median over ``rounds``."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        pid = os.fork()
        if pid == 0:
            try:
                _send(listener.getsockname()[1], size, iters * len(MODES) * rounds)
            finally:
                os._exit(0)
        conn, _ = listener.accept()
    own = np.ones(4 * size // 4, np.float32)  # four segments' worth, used in turn, as a ring's chunks
    out = np.empty_like(own)
    scratch, piece_buf = np.empty(size // 4, np.float32), np.empty(piece, np.uint8).data
    runs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    with conn:
        for k in range(rounds):
            for mode in MODES if k % 2 == 0 else MODES[::-1]:
                r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                for i in range(iters):
                    part = slice((i % 4) * (size // 4), (i % 4 + 1) * (size // 4))
                    if mode == "whole":
                        _recv_whole(conn, own[part], out[part], scratch)
                    else:
                        _recv_pieces(conn, own[part], out[part], piece_buf)
                    if not (out[part] == 2).all():
                        raise AssertionError(f"{mode}: wrong sum in segment {i}")
                t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
                runs[mode].append(((t1 - t0) / iters, cpu / iters))
    os.waitpid(pid, 0)
    return {
        mode: (float(np.median([w for w, _ in r])), float(np.median([c for _, c in r]))) for mode, r in runs.items()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=4 << 20, help="bytes per segment (default 4M)")
    ap.add_argument("--iters", type=int, default=100, help="segments per mode and round (default 100)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the order swapped each (default 3)")
    ap.add_argument("--piece", type=parse_size, default=1 << 20, help="the piece buffer (default 1M)")
    args = ap.parse_args(argv)
    if args.size < 4 or args.size % 4 or args.iters < 1 or args.rounds < 1 or args.piece < 4:
        ap.error("--size must be a positive multiple of 4, --iters and --rounds at least 1, --piece at least 4")
    for mode, (wall, cpu) in measure(args.size, args.iters, args.piece, args.rounds).items():
        print(f"{mode}: {wall * 1e6:.0f} us wall, {cpu * 1e6:.0f} us receiver CPU per {args.size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
