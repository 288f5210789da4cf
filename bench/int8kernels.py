"""CPU time per element of the int8 codec's kernels on each path: numba's fused kernels
(netcoll/int8kernels.py), torch's (netcoll/casts.py, when torch is installed) and numpy's,
on ``--size`` float32 elements of Student-t data, best of ``--reps``; checks that the paths
give the same bytes and bits. ``python3 -m bench.int8kernels`` (one process, no network)."""

from __future__ import annotations

import argparse
import importlib
import os
import time
from collections.abc import Callable

import numpy as np

from netcoll import compression, int8kernels

PATHS = {"numba": ("0", "1"), "torch": ("1", "0"), "numpy": ("0", "0")}  # NETCOLL_TORCH_CASTS, _NUMBA_KERNELS


def cpu_ns(f: Callable[[], object], n: int, reps: int) -> float:
    """The best CPU time of ``f`` over ``reps`` calls, in ns per element of ``n``."""
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        f()
        best = min(best, time.process_time() - t)
    return best / n * 1e9


def measure(x: np.ndarray, reps: int) -> tuple[list[float], list[np.ndarray]]:
    """CPU ns per element of encode, decode and fold on the path the environment selects,
    and their results (bytes, decoded bits, folded bits)."""
    n, data, out, acc = x.size, compression.encode("int8", x), np.empty_like(x), np.ones_like(x)
    scratch = np.empty(compression.FOLD, np.float32)
    enc = cpu_ns(lambda: compression.encode("int8", x, data), n, reps)
    dec = cpu_ns(lambda: compression.decode("int8", data, out), n, reps)
    fold = cpu_ns(lambda: compression.fold("int8", "sum", acc, data, scratch), n, reps)
    once = np.ones_like(x)
    compression.fold("int8", "sum", once, data, scratch)
    return [enc, dec, fold], [data, out.view(np.uint32), once.view(np.uint32)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size", type=int, default=4 << 20, help="float32 elements (default 4 Mi)")
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args(argv)
    try:
        torch = importlib.import_module("torch")  # loaded: the casts may use it
        torch.set_num_threads(1)
    except ImportError:
        PATHS.pop("torch")
    x = np.random.default_rng(1).standard_t(3, a.size).astype(np.float32)
    start = time.perf_counter()
    os.environ["NETCOLL_NUMBA_KERNELS"] = "1"
    print(f"numba: {int8kernels.available()}, first use {time.perf_counter() - start:.2f} s")
    got: dict[str, list[np.ndarray]] = {}
    for path, (torch_casts, numba) in PATHS.items():
        os.environ.update(NETCOLL_TORCH_CASTS=torch_casts, NETCOLL_NUMBA_KERNELS=numba)
        (enc, dec, fold), got[path] = measure(x, a.reps)
        print(f"{path:6s} encode {enc:.2f}  decode {dec:.2f}  fold {fold:.2f}  ns/element (CPU)")
    for path in got:
        same = all(np.array_equal(u, v) for u, v in zip(got[path], got["numpy"], strict=True))
        print(f"{path:6s} the same bytes and bits as numpy's: {same}")


if __name__ == "__main__":
    main()
