"""The public API's types, checked as a user's type checker sees them:
``mypy --strict`` over tests/comm/typing_cases/ must accept readme.py (the
README's examples and the result type of every collective, by ``assert_type``)
and reject exactly the lines of wrong.py marked ``# E: code``.

mypy runs in-process on this checkout (``MYPYPATH``) with the project's
configuration and cache (``.mypy_cache``, shared with the CI gate, so a warm
run takes about a second; a cold one, while mypy reads numpy and torch, up to a
minute). Also: the literals of the op and algorithm names match the registries
they stand for, and the reference docstrings are there for ``help()``.
"""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pytest

import netcoll
from netcoll import algorithms
from netcoll.comm import types
from netcoll.ops import ReduceOp

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "typing_cases"
ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")
MARK = re.compile(r"  # E: (?P<code>[a-z-]+)$")

mypy_api = pytest.importorskip("mypy.api")
pytest.importorskip("torch")  # readme.py annotates with torch types


@pytest.fixture(scope="module")
def mypy_errors() -> dict[tuple[str, int], str]:
    """``(file name, line) -> error code`` for every error mypy reports in the cases."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MYPYPATH", str(REPO))  # this checkout's netcoll, not an installed one
    try:
        out, _, _ = mypy_api.run(
            [
                "--config-file",
                str(REPO / "pyproject.toml"),
                "--cache-dir",
                str(REPO / ".mypy_cache"),
                "--strict",
                "--no-pretty",
                "--show-error-codes",
                str(CASES / "readme.py"),
                str(CASES / "wrong.py"),
            ]
        )
    finally:
        mp.undo()
    assert "error: Cannot find implementation" not in out, out
    errors = {}
    for line in out.splitlines():
        m = ERROR.match(line)
        if m and Path(m["file"]).parent.name == CASES.name:
            errors[(Path(m["file"]).name, int(m["line"]))] = m["code"]
        else:
            assert not m, f"mypy found an error outside the cases: {line}"
    return errors


def _expected(name: str) -> dict[tuple[str, int], str]:
    marks = {}
    for number, text in enumerate((CASES / name).read_text().splitlines(), 1):
        m = MARK.search(text)
        if m:
            marks[(name, number)] = m["code"]
    return marks


def test_the_readme_examples_and_every_result_type_pass_strict(mypy_errors: dict[tuple[str, int], str]) -> None:
    found = {k: v for k, v in mypy_errors.items() if k[0] == "readme.py"}
    assert found == {}


def test_wrong_calls_are_rejected_each_with_its_error(mypy_errors: dict[tuple[str, int], str]) -> None:
    expected = _expected("wrong.py")
    assert len(expected) >= 10
    found = {k: v for k, v in mypy_errors.items() if k[0] == "wrong.py"}
    assert found == expected


def test_the_literals_name_what_runs() -> None:
    assert typing.get_args(types.OpName) == tuple(op.value for op in ReduceOp)
    uneven = {"all_gather": {"pairwise"}, "reduce_scatter": {"pairwise"}}
    literals = {
        "all_reduce": types.AllReduceAlgorithm,
        "broadcast": types.BroadcastAlgorithm,
        "reduce": types.ReduceAlgorithm,
        "all_gather": types.AllGatherAlgorithm,
        "gather": types.GatherAlgorithm,
        "scatter": types.ScatterAlgorithm,
        "reduce_scatter": types.ReduceScatterAlgorithm,
        "all_to_all": types.AllToAllAlgorithm,
        "barrier": types.BarrierAlgorithm,
    }
    assert set(literals) == set(algorithms.ALGORITHMS)
    for name, literal in literals.items():
        names = set(typing.get_args(literal))
        assert names == {"auto", *algorithms.ALGORITHMS[name], *uneven.get(name, ())}, name


def test_work_is_generic_at_no_cost() -> None:
    assert netcoll.Work.__mro__[1:] == (netcoll.Work.__mro__[1], object)  # asyncio.Future only: no Generic
    assert netcoll.Work[int].__origin__ is netcoll.Work


METHODS = (
    "all_reduce",
    "reduce",
    "reduce_scatter",
    "all_gather",
    "gather",
    "broadcast",
    "scatter",
    "all_to_all",
    "barrier",
    "send",
    "recv",
)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_has_a_reference_docstring(name: str) -> None:
    doc = inspect.getdoc(getattr(netcoll.Communicator, name)) or ""
    for section in ("Args:", "Returns:", "Raises:", "Example::"):
        assert section in doc, (name, section)
    assert "timeout" in doc and "CollectiveError" in doc
    params = set(inspect.signature(getattr(netcoll.Communicator, name)).parameters) - {"self"}
    for param in params:  # each argument described
        assert re.search(rf"^\s+{param}:", doc, re.M), (name, param)


def test_every_public_error_is_importable_from_netcoll() -> None:
    import netcoll.errors

    missing = sorted(set(netcoll.errors.__all__) - set(netcoll.__all__))
    assert not missing, f"netcoll.errors exports these, netcoll does not: {missing}"
    for name in netcoll.errors.__all__:
        assert getattr(netcoll, name) is getattr(netcoll.errors, name)
