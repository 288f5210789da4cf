"""How fast one process can read another's memory (``process_vm_readv``, the
"CMA" single copy of Open MPI's shared-memory transport, and of the direct
DATA of ``shm`` links: ``netcoll/links/cma.py``) against a plain ``memcpy`` of
the same bytes (docs/performance.md, "Large messages").

    python3 bench/cma.py [--size 4M] [--iters 200]

A forked child makes its own copy of the source buffer and says where it is;
the parent reads it with ``process_vm_readv`` into its own buffer, then copies
its own source with numpy. Linux only; where the kernel refuses the read
(``ptrace`` restrictions, seccomp) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from netcoll.links import cma
from netcoll.sizes import parse_size


def measure(size: int, iters: int) -> dict[str, float] | str:
    """Seconds per copy of ``size`` bytes: ``{"cma": s, "memcpy": s}``, or why CMA cannot run."""
    if not cma.enabled():
        return "process_vm_readv is not available here (or NETCOLL_SHM_CMA=0)"
    src = (np.arange(size, dtype=np.int64) % 251).astype(np.uint8)
    dst = np.zeros(size, np.uint8)
    go_r, go_w = os.pipe()
    at_r, at_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child makes its own copy of src (pages of its own, as a peer's buffer
        os.close(go_w)  # is: pages shared copy-on-write after fork() read about 2x slower),
        os.close(at_r)  # says where it is, and keeps it until told to go
        mine = src.copy()
        os.write(at_w, cma.address(mine.data).to_bytes(8, "little"))
        os.read(go_r, 1)
        os._exit(0)
    os.close(go_r)
    os.close(at_w)
    try:
        remote = int.from_bytes(os.read(at_r, 8), "little")
        into = dst.data
        times: dict[str, float] = {}
        for label in ("cma", "memcpy"):
            start = time.perf_counter()
            for _ in range(iters):
                if label == "memcpy":
                    dst[:] = src
                    continue
                try:
                    cma.read(pid, remote, into)
                except OSError as exc:
                    return f"process_vm_readv refused: {exc}"
            times[label] = (time.perf_counter() - start) / iters
            if not np.array_equal(dst, src):
                return f"{label} copied the wrong bytes"
            dst[:] = 0
        return times
    finally:
        os.write(go_w, b"x")
        os.close(go_w)
        os.close(at_r)
        os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="4M", help="bytes per copy (default 4M)")
    ap.add_argument("--iters", type=int, default=200, help="copies of each kind (default 200)")
    args = ap.parse_args(argv)
    try:
        size = parse_size(args.size)
    except ValueError as exc:
        ap.error(str(exc))
    if size < 1 or args.iters < 1:
        ap.error("--size and --iters must be positive")
    got = measure(size, args.iters)
    if isinstance(got, str):
        print(f"cma: not measured: {got}")
        return 0
    for label, seconds in got.items():
        print(f"{label}: {seconds * 1e6:.0f} us per {size} bytes = {size / seconds / 1e9:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
