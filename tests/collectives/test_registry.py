"""netcoll.collectives: one registry of what a collective is, and everything reading it.

The registry must match the Communicator (every collective, the arguments each
takes), the algorithm table, nccl-tests' bus-bandwidth factors, and its test
data must round-trip: a correct result (computed here with plain numpy, not
with the registry's own expectations) verifies; a corrupted one does not.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import numpy as np
import pytest

from netcoll import collectives
from netcoll.algorithms import ALGORITHMS
from netcoll.collectives import NAMES, REGISTRY, WITH_DATA, Collective
from netcoll.comm import Communicator
from netcoll.ops import BFLOAT16, reduce_reference
from netcoll.testdata import PERIOD, TestData
from tests.support import run_world


def _collective_methods() -> dict[str, inspect.Signature]:
    """The Communicator's collectives: its public methods that take ``algorithm=``."""
    out = {}
    for name, fn in inspect.getmembers(Communicator, callable):
        if not name.startswith("_"):
            sig = inspect.signature(fn)
            if "algorithm" in sig.parameters:
                out[name] = sig
    return out


# -- the registry against the Communicator and the algorithm table -------------------------------
def test_registry_lists_every_collective_of_the_communicator() -> None:
    methods = _collective_methods()
    assert set(NAMES) == set(methods), "a Communicator collective is missing from (or extra in) the registry"
    assert set(NAMES) == set(ALGORITHMS)
    assert len(set(NAMES)) == len(NAMES) and list(REGISTRY) == list(NAMES)
    assert tuple(n for n in NAMES if n != "barrier") == WITH_DATA


@pytest.mark.parametrize("name", NAMES)
def test_declared_arguments_match_the_communicator(name: str) -> None:
    coll, params = REGISTRY[name], _collective_methods()[name].parameters
    assert coll.name == name and coll.summary
    assert coll.takes_op == ("op" in params), name
    assert coll.takes_root == ("root" in params), name
    assert (coll.uneven == "flag") == ("uneven" in params), name
    assert coll.has_data == ("x" in params), name
    assert coll.algorithms == ("auto", *ALGORITHMS[name])


def test_get_names_the_known_collectives() -> None:
    assert collectives.get("all_reduce") is REGISTRY["all_reduce"]
    with pytest.raises(ValueError, match=r"unknown collective 'allreduce'.*all_reduce"):
        collectives.get("allreduce")


# -- nccl-tests bus bandwidth ----------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4, 8])
def test_busbw_factors_are_nccl_tests(n: int) -> None:
    want = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "gather": (n - 1) / n,
        "scatter": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
        "barrier": 0.0,
    }
    assert set(want) == set(NAMES)
    for name, factor in want.items():
        assert REGISTRY[name].busbw_factor(n) == pytest.approx(factor), name
    assert REGISTRY["all_reduce"].busbw_factor(4) == pytest.approx(1.5)
    alg, bus = REGISTRY["all_reduce"].bandwidth(2_000_000, 0.001, 4)
    assert alg == pytest.approx(2.0) and bus == pytest.approx(3.0)
    assert REGISTRY["barrier"].bandwidth(0, 0.001, 4) == (0.0, 0.0)


def test_buffer_layout() -> None:
    n, b = 4, 10
    shapes = {
        name: (c.input_shape(n, b), c.output_shape(n, b), c.nbytes(n, b, 4))
        for name, c in REGISTRY.items()
        if c.has_data
    }
    assert shapes["all_reduce"] == ((b,), (b,), 4 * b)
    assert shapes["all_gather"] == ((b,), (n, b), 4 * n * b) == shapes["gather"]
    assert shapes["reduce_scatter"] == ((n, b), (b,), 4 * n * b) == shapes["scatter"]
    assert shapes["all_to_all"] == ((n, b), (n, b), 4 * n * b)
    assert REGISTRY["scatter"].sends(1, 1) and not REGISTRY["scatter"].sends(0, 1)
    assert REGISTRY["gather"].receives(1, 1) and not REGISTRY["gather"].receives(0, 1)
    assert not REGISTRY["barrier"].sends(0, 0) and not REGISTRY["barrier"].receives(0, 0)


# -- --help lists exactly the registry's algorithms --------------------------------------------------
def _algorithm_block(text: str) -> dict[str, list[str]]:
    """The ``algorithms (--algorithm ...)`` block of a help text: collective -> names."""
    lines = text.split("algorithms (--algorithm", 1)[1].splitlines()[1:]
    table = {}
    for line in lines:
        m = re.match(r"^  (\w+)\s+(.+)$", line)
        if not m:
            break
        table[m.group(1)] = m.group(2).split()
    return table


@pytest.mark.parametrize("argv, names", [(["submit", "--help"], NAMES), (["bench", "--help"], WITH_DATA)])
def test_help_lists_the_registry_algorithms(
    argv: list[str], names: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    from netcoll.cli import main

    assert main(argv) == 0
    table = _algorithm_block(capsys.readouterr().out)
    assert table == {n: list(REGISTRY[n].algorithms) for n in names}
    assert table["all_reduce"] == ["auto", *ALGORITHMS["all_reduce"]]


def test_submit_choices_are_the_registry() -> None:
    from netcoll import cli
    from netcoll.service.jobs import COLLECTIVES

    assert tuple(cli.COLLECTIVES) == NAMES == tuple(COLLECTIVES)
    ns = cli.build_parser().parse_args(["submit", "reduce_scatter"])
    assert ns.op == "reduce_scatter"


# -- test data: generator + verifier round trip --------------------------------------------------
def _correct(coll: Collective, xs: list[Any], redop: str, n: int, root: int) -> list[Any]:
    """What a correct collective returns on each rank, computed by plain numpy from the inputs."""
    name = coll.name
    if name in ("all_reduce", "reduce"):
        red = reduce_reference(redop, xs)
        return [red.copy() if coll.receives(k, root) else None for k in range(n)]
    if name == "broadcast":
        return [xs[root].copy() for _ in range(n)]
    if name in ("all_gather", "gather"):
        return [np.stack(xs) if coll.receives(k, root) else None for k in range(n)]
    if name == "scatter":
        return [xs[root][k].copy() for k in range(n)]
    if name == "reduce_scatter":
        red = reduce_reference(redop, xs)
        return [red[k].copy() for k in range(n)]
    if name == "all_to_all":
        return [np.stack([xs[j][k] for j in range(n)]) for k in range(n)]
    raise AssertionError(name)


CASES = [
    ("sum", np.float32),
    ("max", np.int8),
    ("prod", BFLOAT16),
    ("avg", np.float16),
    ("bxor", np.uint32),
    ("min", np.bool_),
]


@pytest.mark.parametrize("name", WITH_DATA)
@pytest.mark.parametrize("redop, dtype", CASES)
def test_generator_and_verifier_round_trip(name: str, redop: str, dtype: Any) -> None:
    n, root, coll = 3, 1, REGISTRY[name]
    if redop == "min" and dtype is np.bool_:
        redop = "bor"  # bool data: a bitwise op
    data = TestData(redop, np.dtype(dtype), n)
    block = PERIOD + 37  # more than one period per block
    inputs = [coll.make_input(data, block, k, root) for k in range(n)]
    assert all((x is None) == (not coll.sends(k, root)) for k, x in enumerate(inputs))
    full = [data.array(coll.input_shape(n, block), k) for k in range(n)]  # what every rank would send
    outs = _correct(coll, full, redop, n, root)
    assert [coll.count_wrong(data, block, k, root, outs[k]) for k in range(n)] == [0] * n

    k = root if coll.root_receives else n - 1
    bad = outs[k].copy()
    flat = bad.reshape(-1)
    idx = [0, len(flat) // 2, len(flat) - 1]
    flat[idx] = ~flat[idx] if bad.dtype.kind == "b" else 77  # 77: outside every value set the data uses
    assert coll.count_wrong(data, block, k, root, bad) == len(idx)
    assert coll.count_wrong(data, block, k, root, None) > 0
    assert coll.count_wrong(data, block, k, root, outs[k].astype(np.float64)) > 0  # wrong dtype
    assert coll.count_wrong(data, block, k, root, outs[k].reshape(-1)[:-1].copy()) > 0  # wrong shape
    if coll.output_blocks:  # rows in the wrong order are caught
        assert coll.count_wrong(data, block, k, root, outs[k][::-1].copy()) > 0
    if coll.root_receives:  # a result where none belongs is wrong too
        assert coll.count_wrong(data, block, (root + 1) % n, root, outs[k]) > 0


def test_sum_data_stays_exact_in_small_types() -> None:
    # integer-valued data: sums over 8 ranks are exact even in bfloat16 / float16
    data = TestData("sum", BFLOAT16, 8)
    red = data.reduced().ext[:PERIOD].astype(np.float64)
    ref = sum(data.base(k).astype(np.float64) for k in range(8))
    assert np.array_equal(red, ref)


def test_verifying_many_ranks_keeps_few_patterns() -> None:
    from netcoll.testdata import CACHED_PATTERNS

    n, coll = 40, REGISTRY["all_gather"]
    data = TestData("sum", np.dtype(np.float64), n)
    y = np.stack([data.array((100,), k) for k in range(n)])
    assert coll.count_wrong(data, 100, 3, 0, y) == 0
    assert len(data._patterns) <= CACHED_PATTERNS


# -- dispatch: the right Communicator method, the right arguments, a verified result ----------------
@pytest.mark.parametrize("name", NAMES)
async def test_dispatch_runs_the_collective_and_it_verifies(name: str) -> None:
    coll, n, root, block = REGISTRY[name], 3, 2, 1000

    async def rank(comm: Communicator) -> int:
        data = TestData("sum", np.dtype(np.int32), n)
        x = coll.make_input(data, block, comm.rank, root)
        y = await coll.call(comm, x, op="sum", root=root, algorithm=coll.algorithms[-1], timeout=30.0)
        return coll.count_wrong(data, block, comm.rank, root, y)

    assert await run_world(n, rank) == [0] * n


class _Recorder:
    """A stand-in Communicator that records the method called and its arguments."""

    rank, world_size = 0, 4

    def __getattr__(self, method: str) -> Any:
        async def record(*args: Any, **kw: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
            return method, args, kw

        return record


@pytest.mark.parametrize("name", NAMES)
async def test_dispatch_passes_exactly_the_arguments_the_collective_takes(name: str) -> None:
    coll, x, out = REGISTRY[name], object(), object()
    method, args, kw = await coll.call(
        _Recorder(),
        x,
        op="max",
        root=0,
        out=out,  # type: ignore[arg-type]
        algorithm="ring",
        timeout=5.0,
        compression="int8",
    )
    assert method == name
    assert kw.pop("algorithm") == "ring" and kw.pop("timeout") == 5.0
    assert ("compression" in kw) == coll.takes_compression and kw.pop("compression", "int8") == "int8"
    assert ("op" in kw) == coll.takes_op and kw.pop("op", "max") == "max"
    assert ("root" in kw) == coll.takes_root and kw.pop("root", 0) == 0
    if coll.has_data:
        assert args == (x,)  # rank 0 is the root here: it passes its input
    out_passed = kw.pop("out", None)
    assert out_passed is (out if coll.has_data and name != "broadcast" else None)
    assert kw == {}
