"""Layer rules that import-linter cannot state (its contracts live in
pyproject.toml and run as a CI gate, `lint-imports`).

import-linter reads every import statement, including those inside
functions, so it cannot tell a module that *loads* numpy from one that
only imports it lazily, on first use; and it checks the import graph, not
whether each module can be imported on its own (an import cycle inside one
layer can work from one entry point and fail from another). Both are
checked here, in fresh interpreters.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import netcoll

#: module -> heavy packages that importing it must not load (the entry points
#: that stay cheap: `netcoll health`, `netcoll --help`, listing collectives)
LIGHT = {
    "netcoll": ("numpy", "msgpack", "pydantic"),  # the public names load on first use
    "netcoll.cli": ("numpy", "msgpack", "pydantic"),
    "netcoll.collectives": ("numpy", "msgpack", "pydantic"),
    "netcoll.config": ("numpy", "msgpack"),
    "netcoll.errors": ("numpy", "msgpack", "pydantic"),
    # RPC and the coordinator run on the framed connection of netcoll.links, not its link kinds
    "netcoll.rendezvous": ("numpy",),
}
#: modules that run a program when imported
ENTRY_POINTS = {"__main__"}
#: optional extras: a module that needs one may be skipped when it is not installed
OPTIONAL = {"torch", "matplotlib", "mpi4py"}


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("module", sorted(LIGHT))
def test_light_modules_load_no_heavy_packages(module: str) -> None:
    heavy = LIGHT[module]
    proc = run_python(
        f"import importlib, sys; importlib.import_module({module!r}); "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(heavy)!r}))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"importing {module} loads {proc.stdout.strip()}"


def test_every_module_imports_on_its_own() -> None:
    """Each module of netcoll, imported first (all of netcoll unloaded before
    each one), imports without error: no layer depends on another having
    been imported before it."""
    modules = sorted(
        info.name
        for info in pkgutil.walk_packages(netcoll.__path__, "netcoll.")
        if info.name.rsplit(".", 1)[-1] not in ENTRY_POINTS
    )
    code = f"""
import importlib, json, sys
failures = {{}}
for name in {modules!r}:
    for loaded in [m for m in sys.modules if m == "netcoll" or m.startswith("netcoll.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in {sorted(OPTIONAL)!r}:
            failures[name] = repr(exc)
    except Exception as exc:
        failures[name] = repr(exc)
print(json.dumps(failures))
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert len(modules) > 20, modules
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {}


# -- the shape of the code (issue 9, item 6) ----------------------------------------------------
def _functions(package: str) -> list[tuple[str, str, int]]:
    import ast

    from tests.support import REPO

    found = []
    for path in sorted((REPO / "netcoll" / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                found.append((str(path.relative_to(REPO)), node.name, node.end_lineno - node.lineno + 1))
    return found


@pytest.mark.parametrize("package", ["cli", "bench", "service"])
def test_no_long_functions(package: str) -> None:
    long = [f for f in _functions(package) if f[2] > 60]
    assert not long, f"functions over 60 lines: {long}"


def test_communicator_is_composed_and_thin() -> None:
    """Communicator holds an engine (no CommBase to inherit); its public
    methods hand a plan to the engine and do nothing else."""
    import inspect

    from netcoll.comm import Communicator

    assert Communicator.__mro__ == (Communicator, object)
    for name in (
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "gather",
        "scatter",
        "reduce_scatter",
        "all_to_all",
        "barrier",
        "send",
        "recv",
    ):
        source = inspect.getsource(getattr(Communicator, name))
        body = [line for line in source.split('"""')[-1].splitlines() if line.strip()]
        assert len(body) <= 2, (name, body)
