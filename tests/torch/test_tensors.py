"""torch tensors in, torch tensors out: every Communicator call over the
in-memory transport with CPU tensors of every dtype netcoll supports (bfloat16
included), tensors that require grad, non-contiguous tensors, ``out=`` tensors,
lists of tensors and ``torch.distributed.ReduceOp`` values; results are tensors
of the same dtype and shape, bit-equal to a numpy reference."""
# Rank bodies are lambdas over loop variables, always awaited within the
# iteration that defines them:
# ruff: noqa: B023

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netcoll.ops import ReduceOp, reduce_reference
from netcoll.tensors import to_numpy, to_tensor
from tests.support import REPO, memory_world, rank_data, run_world, valid_ops

DTYPES = [
    torch.bool,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]
N = 3


def dt_id(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def tdata(rank: int, shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Exact per-rank data as a tensor (through the same numpy twin netcoll uses)."""
    twin = to_numpy(torch.empty(0, dtype=dtype)).dtype
    return to_tensor(np.ascontiguousarray(rank_data(rank, shape, twin, seed)))  # type: ignore[no-any-return]


def same(got: Any, want: torch.Tensor | np.ndarray) -> None:
    """``got`` is a tensor of ``want``'s dtype and shape with the same values."""
    assert isinstance(got, torch.Tensor), type(got)
    assert not got.requires_grad
    if isinstance(want, np.ndarray):
        want = to_tensor(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    a, b = to_numpy(got), to_numpy(want.contiguous())
    if got.dtype.is_floating_point or got.dtype.is_complex:  # equal values (a product's zero may be -0)
        wide = np.complex128 if got.dtype.is_complex else np.float64
        np.testing.assert_array_equal(a.astype(wide), b.astype(wide))
    else:
        assert a.tobytes() == b.tobytes()


def np_of(t: torch.Tensor) -> np.ndarray:
    return np.array(to_numpy(t), copy=True)


# -- every dtype through every collective ----------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
async def test_reducing_collectives(dtype: torch.dtype) -> None:
    xs = [tdata(r, (4, 3), dtype) for r in range(N)]
    twin = to_numpy(xs[0]).dtype
    for op in valid_ops(twin):
        ins = xs
        if op is ReduceOp.PROD and twin.kind in "fc":  # small factors: products exact in any fold order
            ins = [to_tensor(np.clip(np_of(x).real, -2, 2).astype(twin)) for x in xs]
        want = reduce_reference(op, [np_of(x) for x in ins])
        res = await run_world(N, lambda c: c.all_reduce(ins[c.rank], op=op))
        for r in range(N):
            same(res[r], want)
        res = await run_world(N, lambda c: c.reduce(ins[c.rank], op=op, root=1))
        same(res[1], want)
        assert res[0] is None and res[2] is None
    rows = [tdata(r, (N, 5), dtype, seed=3) for r in range(N)]
    want = reduce_reference("sum" if dtype is not torch.bool else "max", [np_of(x) for x in rows])
    op = "sum" if dtype is not torch.bool else "max"
    res = await run_world(N, lambda c: c.reduce_scatter(rows[c.rank], op=op))
    for r in range(N):
        same(res[r], want[r])


@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
async def test_moving_collectives(dtype: torch.dtype) -> None:
    xs = [tdata(r, (2, 3), dtype, seed=1) for r in range(N)]
    stacked = np.stack([np_of(x) for x in xs])
    res = await run_world(N, lambda c: c.all_gather(xs[c.rank]))
    for r in range(N):
        same(res[r], stacked)
    res = await run_world(N, lambda c: c.gather(xs[c.rank], root=2))
    same(res[2], stacked)
    res = await run_world(N, lambda c: c.broadcast(xs[c.rank] if c.rank == 1 else None, root=1))
    assert res[1] is xs[1]  # the root's own tensor back
    for r in (0, 2):  # the root sent a tensor: the others get one (a tensor travels as one)
        same(res[r], xs[1])
    bufs = [xs[1] if r == 1 else torch.zeros(2, 3, dtype=dtype) for r in range(N)]
    res = await run_world(N, lambda c: c.broadcast(bufs[c.rank], root=1))
    for r in range(N):
        assert res[r] is bufs[r]
        same(res[r], xs[1])
    whole = tdata(0, (N, 4), dtype, seed=2)
    res = await run_world(N, lambda c: c.scatter(whole if c.rank == 0 else None, root=0))
    for r in range(N):
        same(res[r], whole[r])
    mats = [tdata(r, (N, 2), dtype, seed=4) for r in range(N)]
    res = await run_world(N, lambda c: c.all_to_all(mats[c.rank]))
    for r in range(N):
        same(res[r], torch.stack([mats[j][r] for j in range(N)]))

    async def p2p(c: Any) -> Any:
        if c.rank == 0:
            return await c.send(xs[0], dst=2, tag=5)
        if c.rank == 2:
            return await c.recv(src=0, tag=5)
        return None

    res = await run_world(N, p2p)
    assert res[0] is None
    same(res[2], xs[0])  # a tensor was sent: a tensor is received


# -- grad, strides, out=, lists --------------------------------------------------------


async def test_requires_grad_inputs_are_read_not_tracked() -> None:
    xs = [torch.full((5,), float(r + 1), requires_grad=True) for r in range(N)]
    params = [torch.nn.Parameter(torch.full((2, 2), float(r))) for r in range(N)]
    res = await run_world(N, lambda c: c.all_reduce(xs[c.rank]))
    for r in range(N):
        same(res[r], torch.full((5,), 6.0))
        assert xs[r].grad_fn is None and torch.equal(xs[r].detach(), torch.full((5,), float(r + 1)))
    res = await run_world(N, lambda c: c.all_gather(params[c.rank]))
    same(res[0], torch.stack([p.detach() for p in params]))
    res = await run_world(N, lambda c: c.broadcast(params[c.rank]))  # into parameters, as DDP starts
    for r in range(N):
        assert res[r] is params[r] and isinstance(res[r], torch.nn.Parameter)  # each rank's own tensor
        same(res[r].detach(), torch.zeros(2, 2))
        assert params[r].requires_grad and params[r].grad_fn is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64, torch.int16], ids=dt_id)
async def test_non_contiguous_inputs(dtype: torch.dtype) -> None:
    bases = [tdata(r, (6, 8), dtype) for r in range(N)]
    views = [b.t()[::2, 1:] for b in bases]  # transposed, stepped, offset
    assert not views[0].is_contiguous()
    op = "sum"
    want = reduce_reference(op, [np_of(v) for v in views])
    res = await run_world(N, lambda c: c.all_reduce(views[c.rank], op=op))
    for r in range(N):
        same(res[r], want)
        assert res[r].is_contiguous()
    res = await run_world(N, lambda c: c.all_gather(views[c.rank]))
    same(res[1], torch.stack([v.contiguous() for v in views]))
    conj = [v.conj() for v in views] if dtype.is_complex else views  # a lazy conjugate bit
    res = await run_world(N, lambda c: c.all_gather(conj[c.rank]))
    same(res[0], torch.stack([v.resolve_conj() for v in conj]))


async def test_out_tensors_are_written_and_returned() -> None:
    xs = [tdata(r, (3, 4), torch.bfloat16) for r in range(N)]
    outs = [torch.empty(3, 4, dtype=torch.bfloat16) for _ in range(N)]
    res = await run_world(N, lambda c: c.all_reduce(xs[c.rank], out=outs[c.rank]))
    want = reduce_reference("sum", [np_of(x) for x in xs])
    for r in range(N):
        assert res[r] is outs[r]
        same(outs[r], want)
    # in place: the input is the output
    want = reduce_reference("max", [np_of(x) for x in xs])
    res = await run_world(N, lambda c: c.all_reduce(xs[c.rank], out=xs[c.rank], op=dist.ReduceOp.MAX))
    for r in range(N):
        assert res[r] is xs[r]
        same(xs[r], want)
    gathered = [torch.zeros(N, 2) for _ in range(N)]
    ins = [torch.full((2,), float(r)) for r in range(N)]
    res = await run_world(N, lambda c: c.all_gather(ins[c.rank], out=gathered[c.rank]))
    assert all(res[r] is gathered[r] for r in range(N))
    same(gathered[2], torch.arange(N, dtype=torch.float32).repeat_interleave(2).reshape(N, 2))
    rows = [torch.empty(4, dtype=torch.int64) for _ in range(N)]
    whole = torch.arange(N * 4).reshape(N, 4)
    res = await run_world(N, lambda c: c.scatter(whole if c.rank == 0 else None, out=rows[c.rank]))
    for r in range(N):
        assert res[r] is rows[r]
        same(rows[r], whole[r])
    bufs = [torch.arange(3) if r == 0 else torch.zeros(3, dtype=torch.int64) for r in range(N)]
    res = await run_world(N, lambda c: c.broadcast(bufs[c.rank]))  # into the non-roots' buffers
    assert all(res[r] is bufs[r] for r in range(N))
    same(bufs[2], torch.arange(3))


async def test_what_is_sent_as_numpy_is_received_as_numpy() -> None:
    """With torch loaded, numpy still goes in and out as numpy; a tensor sent
    arrives as a tensor where the receiver passed none, numpy where it passed
    a numpy buffer."""
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    res = await run_world(N, lambda c: c.broadcast(x if c.rank == 0 else None))
    assert all(type(r) is np.ndarray for r in res)
    res = await run_world(N, lambda c: c.all_to_all([np.full(2, c.rank)] * N))
    assert all(type(b) is np.ndarray for r in res for b in r)
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    bufs = [np.zeros((2, 3), np.int32) for _ in range(N)]
    res = await run_world(N, lambda c: c.broadcast(t if c.rank == 0 else bufs[c.rank]))
    assert res[0] is t and res[1] is bufs[1] and res[2] is bufs[2]
    np.testing.assert_array_equal(bufs[2], x)
    res = await run_world(N, lambda c: c.gather(t if c.rank == 1 else x, uneven=True))
    assert [type(b) for b in res[0]] == [np.ndarray, torch.Tensor, np.ndarray]  # as each rank sent it


async def test_numpy_input_with_an_out_tensor() -> None:
    outs = [torch.empty(2, dtype=torch.float64) for _ in range(N)]
    res = await run_world(N, lambda c: c.all_reduce(np.ones(2), out=outs[c.rank]))
    assert res[0] is outs[0]
    same(outs[0], torch.full((2,), float(N), dtype=torch.float64))


async def test_bad_out_tensors() -> None:
    _, comms = memory_world(2)
    x = torch.zeros(4, 4)
    with pytest.raises(ValueError, match="C-contiguous"):
        comms[0].all_reduce(x, out=torch.zeros(4, 4).t())
    with pytest.raises(ValueError, match="shape"):
        comms[0].all_reduce(x, out=torch.zeros(4))
    with pytest.raises(ValueError, match="dtype"):
        comms[0].all_reduce(x, out=torch.zeros(4, 4, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.bool], ids=dt_id)
async def test_lists_of_tensors(dtype: torch.dtype) -> None:
    shapes = [(), (0,), (3,), (2, 2)][:N]
    blocks = [[tdata(10 * i + j, shapes[j], dtype) for j in range(N)] for i in range(N)]
    res = await run_world(N, lambda c: c.all_to_all(blocks[c.rank]))
    for r in range(N):
        assert isinstance(res[r], list)
        for j in range(N):
            same(res[r][j], blocks[j][r])
    res = await run_world(N, lambda c: c.scatter(blocks[1] if c.rank == 1 else None, root=1))
    for r in range(N):
        same(res[r], blocks[1][r])
    op = "max" if dtype is torch.bool else "sum"
    res = await run_world(N, lambda c: c.reduce_scatter(tuple(blocks[c.rank]), op=op))
    for r in range(N):
        want = reduce_reference(op, [np_of(blocks[i][r]) for i in range(N)])
        assert to_numpy(res[r]).shape == want.shape
        np.testing.assert_array_equal(to_numpy(res[r]).astype(np.float64), want.astype(np.float64))
    mine = [tdata(r, shapes[r], dtype) for r in range(N)]
    res = await run_world(N, lambda c: c.all_gather(mine[c.rank], uneven=True))
    for r in range(N):
        for j in range(N):
            same(res[r][j], mine[j])
    res = await run_world(N, lambda c: c.gather(mine[c.rank], uneven=True, root=0))
    for j in range(N):
        same(res[0][j], mine[j])


# -- ops ---------------------------------------------------------------------------------

TORCH_OPS = {
    "SUM": "sum",
    "PRODUCT": "prod",
    "MIN": "min",
    "MAX": "max",
    "AVG": "avg",
    "BAND": "band",
    "BOR": "bor",
    "BXOR": "bxor",
}


@pytest.mark.parametrize("name", list(TORCH_OPS))
async def test_torch_reduce_ops(name: str) -> None:
    dtype = torch.float32 if name == "AVG" else torch.int32
    xs = [tdata(r, (7,), dtype) for r in range(N)]
    want = reduce_reference(TORCH_OPS[name], [np_of(x) for x in xs])
    for op in (getattr(dist.ReduceOp, name), dist.ReduceOp(getattr(dist.ReduceOp, name))):
        res = await run_world(N, lambda c: c.all_reduce(xs[c.rank], op=op))
        same(res[0], want)
        res = await run_world(N, lambda c: c.all_reduce(np_of(xs[c.rank]), op=op))  # numpy input: numpy out
        assert isinstance(res[1], np.ndarray) and res[1].tobytes() == want.tobytes()


async def test_premul_sum_is_a_clear_error() -> None:
    _, comms = memory_world(2)
    with pytest.raises(ValueError, match="PREMUL_SUM is not supported"):
        comms[0].all_reduce(torch.ones(2), op=dist.ReduceOp.PREMUL_SUM)


# -- what is refused ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.zeros(2, dtype=torch.float8_e4m3fn),
        lambda: torch.zeros(2, dtype=torch.float8_e5m2),
        lambda: torch.zeros(2, dtype=torch.complex32),
        lambda: torch.zeros(2, dtype=torch.float8_e8m0fnu),
    ],
    ids=["float8_e4m3fn", "float8_e5m2", "complex32", "float8_e8m0fnu"],
)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
async def test_unsupported_dtypes_name_the_dtype(make: Any) -> None:
    _, comms = memory_world(2)
    t = make()
    name = str(t.dtype).removeprefix("torch.")
    for call in (lambda c: c.all_reduce(t), lambda c: c.all_gather(t), lambda c: c.send(t, 1)):
        with pytest.raises(TypeError, match=f"torch dtype {name} is not supported"):
            call(comms[0])


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: torch.empty(3, device="meta"), "a meta tensor; netcoll moves CPU memory only"),
        (lambda: torch.zeros(3, 3).to_sparse(), "sparse"),
    ],
)
async def test_non_cpu_and_sparse_tensors_are_refused(make: Any, match: str) -> None:
    hub, comms = memory_world(2)
    t = make()
    for call in (
        lambda c: c.all_reduce(t),
        lambda c: c.broadcast(t),
        lambda c: c.all_reduce(torch.zeros(3), out=t),
        lambda c: c.all_to_all([torch.zeros(1), t]),
    ):
        with pytest.raises(TypeError, match=match):
            call(comms[0])
    assert all(tr.frames_sent == 0 for tr in hub.meshes)


# -- zero copy -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
def test_conversions_share_memory(dtype: torch.dtype) -> None:
    t = tdata(0, (4, 5), dtype)
    a = to_numpy(t)
    assert a.ctypes.data == t.data_ptr() and a.shape == (4, 5)
    back = to_tensor(a)
    assert back.data_ptr() == t.data_ptr() and back.dtype == dtype
    view = t.t()
    assert to_numpy(view).ctypes.data == t.data_ptr() and to_numpy(view).strides == tuple(
        s * t.element_size() for s in view.stride()
    )


def test_read_only_arrays_become_writeable_tensors() -> None:
    a = np.frombuffer(b"\x00\x00\x80\x3f" * 3, dtype=np.float32)
    t = to_tensor(a)  # no warning (the suite turns warnings into errors where it matters)
    t += 1
    assert t.tolist() == [2.0, 2.0, 2.0]


# -- any shape, any strides ----------------------------------------------------------------


@st.composite
def strided(draw: st.DrawFn) -> tuple[torch.dtype, list[torch.Tensor]]:
    """Per-rank views of one dtype and shape: any permutation of axes and step per axis."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    order = draw(st.permutations(range(len(shape))))
    steps = [draw(st.integers(1, 3)) for _ in shape]
    views = []
    for r in range(N):
        base = tdata(r, tuple(n * s for n, s in zip(shape, steps, strict=True)), dtype, seed=9)
        view = base[tuple(slice(None, None, s) for s in steps)].permute(*order) if shape else base
        views.append(view.requires_grad_() if dtype.is_floating_point and r == 1 else view)
    return dtype, views


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=strided())
def test_any_strides_through_all_reduce_and_all_gather(case: tuple[torch.dtype, list[torch.Tensor]]) -> None:
    dtype, views = case
    op = "max" if dtype is torch.bool else "sum"
    want = reduce_reference(op, [np_of(v) for v in views])

    async def both(c: Any) -> tuple[Any, Any]:
        return await c.all_reduce(views[c.rank], op=op), await c.all_gather(views[c.rank])

    res = asyncio.run(run_world(N, both))
    for r in range(N):
        same(res[r][0], want)
        same(res[r][1], np.stack([np_of(v) for v in views]))


def test_import_netcoll_does_not_import_torch() -> None:
    code = (
        "import sys, numpy as np, asyncio, netcoll, netcoll.comm, netcoll.session, netcoll.sync, netcoll.tensors\n"
        "import netcoll.cli, netcoll.service\n"
        "from tests.support import run_world\n"
        "res = asyncio.run(run_world(2, lambda c: c.all_reduce(np.ones(3))))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert type(res[0]) is np.ndarray\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60, check=False
    )
    assert done.returncode == 0
