"""Loading the project's scripts under ``bench/`` (not a package) as modules in tests."""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script(relpath: str, name: str) -> ModuleType:
    """``relpath`` (e.g. ``bench/compare.py``) as a fresh module called ``name``."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relpath))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
