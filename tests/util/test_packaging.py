"""The package as pip builds it: ``pip install -e .`` must leave netcoll visible
to type checkers (a plain path in a .pth file, not setuptools' import-hook
finder, which mypy and pyright cannot follow), the wheel must carry
``py.typed``, and the version must come from ``netcoll.__version__`` alone (what
``netcoll --version`` prints). Builds with setuptools' PEP 517 hooks in a copy
of the project, offline (no build isolation), in a second or two."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import netcoll

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("setuptools")

BUILD = """
import sys
import setuptools.build_meta as backend
hook = getattr(backend, sys.argv[1])
print(hook(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "netcoll", root / "netcoll", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _build(project: Path, hook: str, out: Path) -> zipfile.ZipFile:
    proc = subprocess.run(
        [sys.executable, "-c", BUILD, hook, str(out)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return zipfile.ZipFile(out / proc.stdout.strip().splitlines()[-1])


def _metadata_version(wheel: zipfile.ZipFile) -> str:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    text = wheel.read(meta).decode()
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Version:"))


def test_an_editable_install_is_a_path_type_checkers_follow(project: Path, tmp_path: Path) -> None:
    wheel = _build(project, "build_editable", tmp_path)
    pth = [n for n in wheel.namelist() if n.endswith(".pth")]
    assert len(pth) == 1, wheel.namelist()
    lines = wheel.read(pth[0]).decode().split()
    assert lines == [str(project.resolve())], lines  # a directory on sys.path: no `import` hook line
    assert not [n for n in wheel.namelist() if n.endswith("_finder.py")]
    assert _metadata_version(wheel) == netcoll.__version__


def test_the_wheel_carries_py_typed_and_the_one_version(project: Path, tmp_path: Path) -> None:
    wheel = _build(project, "build_wheel", tmp_path)
    names = wheel.namelist()
    assert "netcoll/py.typed" in names and "netcoll/comm/types.py" in names
    assert not [n for n in names if n.split("/")[0] in ("tests", "bench", "examples", "deploy")]
    assert _metadata_version(wheel) == netcoll.__version__
