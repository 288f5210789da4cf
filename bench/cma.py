"""How fast one process can read another's memory (``process_vm_readv``, the
"CMA" single copy of Open MPI's shared-memory transport) against a plain
``memcpy`` of the same bytes: the measurement behind not building a
single-copy path for ``shm`` links (docs/performance.md, "Large messages").

    python3 bench/cma.py [--size 4M] [--iters 200]

A forked child holds the source buffer (copy-on-write, at the same address);
the parent reads it with ``process_vm_readv`` into its own buffer, then copies
its own source with numpy. Linux only; where the kernel refuses the read
(``ptrace`` restrictions, seccomp) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from netcoll.sizes import parse_size


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _readv() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.process_vm_readv
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    return fn


def measure(size: int, iters: int) -> dict[str, float] | str:
    """Seconds per copy of ``size`` bytes: ``{"cma": s, "memcpy": s}``, or why CMA cannot run."""
    if not sys.platform.startswith("linux"):
        return "process_vm_readv is Linux only"
    readv = _readv()
    src = (np.arange(size, dtype=np.int64) % 251).astype(np.uint8)
    dst = np.zeros(size, np.uint8)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child keeps its copy of src mapped until told to go
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        local, remote = _IoVec(dst.ctypes.data, size), _IoVec(src.ctypes.data, size)
        times: dict[str, float] = {}
        for label in ("cma", "memcpy"):
            start = time.perf_counter()
            for _ in range(iters):
                if label == "memcpy":
                    dst[:] = src
                    continue
                n = readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
                if n != size:
                    err = ctypes.get_errno()
                    return f"process_vm_readv refused: {os.strerror(err) if err else f'read {n} of {size} bytes'}"
            times[label] = (time.perf_counter() - start) / iters
            if not np.array_equal(dst, src):
                return f"{label} copied the wrong bytes"
            dst[:] = 0
        return times
    finally:
        os.write(w, b"x")
        os.close(w)
        os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
