"""What ``netcoll run`` is to start, checked once before N copies of it fail the same way
(``can't open file 'nosuch.py'`` from every rank): the script exists and is a file; a
``-m`` module can be found (without importing anything: each package on the way is
looked up, not run). (A ``--no-python`` program that cannot start is reported once
already: the launcher stops at the first rank it cannot start.)
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

from .common import CliError


def check_script(path: str) -> None:
    """A CliError (exit 2) unless ``path`` is a file this process could read."""
    if not os.path.exists(path):
        raise CliError(f"no such script: {path!r} (from {os.getcwd()})", 2)
    if not os.path.isfile(path):
        raise CliError(f"not a script but a directory: {path!r}", 2)
    if not os.access(path, os.R_OK):
        raise CliError(f"cannot read the script {path!r}: permission denied", 2)


def check_module(name: str, search: list[str] | None = None) -> None:
    """A CliError (exit 2) unless ``python -m name`` would find ``name`` (and, for a
    package, its ``__main__``). ``search``: where ``python -m`` looks (default: the working
    directory, then this interpreter's path). Packages on the way are found, not imported
    (nothing of the user's runs here), unless this process has them loaded already."""
    if not name or any(not part.isidentifier() for part in name.split(".")):
        raise CliError(f"not a module name: {name!r}", 2)
    path: list[str] | None = search if search is not None else [os.getcwd(), *sys.path[1:]]
    parts, found, package = name.split("."), "", False
    for part in [*parts, "__main__"]:
        full = f"{found}.{part}" if found else part
        if part == "__main__" and not package:
            return  # a plain module: python -m runs it
        loaded = sys.modules.get(full)
        if loaded is not None or full in sys.builtin_module_names:
            locations = getattr(loaded, "__path__", None)
            path, package = (list(locations) if locations is not None else []), locations is not None
        else:
            spec = importlib.machinery.PathFinder.find_spec(full, path)
            if spec is None:
                missing = (
                    f"{found!r} is a package without __main__" if part == "__main__" else f"no module named {full!r}"
                )
                raise CliError(f"{missing} (python -m {name} would fail on every rank)", 2)
            locations = spec.submodule_search_locations
            path, package = (list(locations) if locations is not None else []), locations is not None
        found = full


__all__ = ["check_module", "check_script"]
