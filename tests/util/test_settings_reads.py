"""No netcoll module but :mod:`netcoll.settings` reads a ``NETCOLL_*`` variable from the
environment: every module is walked with :mod:`ast`, and a read names its file and line.

A read is ``os.environ.get(K)``, ``os.getenv(K)``, ``os.environ[K]``, ``K in os.environ``
or ``<any mapping>.get(K)`` / ``[K]`` with ``K`` a ``NETCOLL_*`` name: a literal, an
f-string or sum starting with one, or a constant resolving to one (a module constant
``X = "NETCOLL_..."`` anywhere in netcoll, or ``settings.registry.X.name``). A key of
``os.environ`` (or of a mapping named ``environ``/``env``) that cannot be resolved counts
as a read too (it could be any name).
Writing the environment of a child process (``env["NETCOLL_RANK"] = ...``, ``env.pop``,
``dict(os.environ)``) is not reading.
"""

from __future__ import annotations

import ast
from pathlib import Path

import netcoll
from netcoll.settings import registry

PACKAGE = Path(netcoll.__file__).parent
SETTINGS = PACKAGE / "settings"
PREFIX = "NETCOLL_"


def constants(trees: dict[Path, ast.Module]) -> dict[str, str]:
    """Module-level ``NAME = <a NETCOLL_ name>`` of every module, by NAME."""
    out: dict[str, str] = {}
    for tree in trees.values():
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
            target = node.target if isinstance(node, ast.AnnAssign) else target
            value = getattr(node, "value", None)
            if isinstance(target, ast.Name) and value is not None:
                name = resolve(value, {})
                if name is not None:
                    out[target.id] = name
    return out


def resolve(node: ast.AST, consts: dict[str, str]) -> str | None:
    """The ``NETCOLL_*`` name (or name prefix) ``node`` stands for, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if node.value.startswith(PREFIX) else None
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.Attribute):
        if node.attr == "name" and isinstance(node.value, ast.Attribute):
            var = getattr(registry, node.value.attr, None)  # settings.registry.X.name
            return var.name if isinstance(var, registry.Variable) else None
        return consts.get(node.attr)  # module.CONSTANT
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return resolve(node.left, consts)
    if isinstance(node, ast.JoinedStr) and node.values:
        return resolve(node.values[0], consts)
    return None


def _is_environ(node: ast.AST) -> bool:
    """``os.environ``, or a mapping named ``environ`` or ``env`` (the environment passed down)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id in ("environ", "env")


def _is_getenv(func: ast.AST) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "getenv") or (
        isinstance(func, ast.Name) and func.id == "getenv"
    )


def _membership_in_environ(node: ast.Compare) -> bool:
    """``K in os.environ`` (or ``not in``)."""
    return any(isinstance(op, ast.In | ast.NotIn) for op in node.ops) and any(_is_environ(c) for c in node.comparators)


def _literal_other(node: ast.AST) -> bool:
    """A string literal that is not a NETCOLL_ name (``"TERM"``): a read that is not ours."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and not node.value.startswith(PREFIX)


def reads(tree: ast.Module, consts: dict[str, str]) -> list[tuple[int, str]]:
    """(line, what) of every read of a NETCOLL_ variable in ``tree``."""
    found: list[tuple[int, str]] = []

    def check(node: ast.expr, key: ast.expr | None, on_environ: bool, how: str) -> None:
        name = resolve(key, consts) if key is not None else None
        if name is not None:
            found.append((node.lineno, f"{how} of {name}"))
        elif on_environ and not (key is not None and _literal_other(key)):
            found.append((node.lineno, f"{how} of a name that cannot be resolved"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func, key = node.func, (node.args[0] if node.args else None)
            if _is_getenv(func):
                check(node, key, True, "getenv")
            elif isinstance(func, ast.Attribute) and func.attr == "get":
                check(node, key, _is_environ(func.value), ".get")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            check(node, node.slice, _is_environ(node.value), "[...]")
        elif isinstance(node, ast.Compare) and _membership_in_environ(node):
            check(node, node.left, True, "in")
    return found


def parse_all() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def violations(trees: dict[Path, ast.Module]) -> list[str]:
    consts = constants(trees)
    out = []
    for path, tree in trees.items():
        if SETTINGS in path.parents:
            continue
        out += [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}" for line, what in reads(tree, consts)]
    return out


def test_no_module_but_settings_reads_netcoll_variables() -> None:
    found = violations(parse_all())
    assert not found, "read these through netcoll.settings:\n" + "\n".join(found)


def test_the_walk_finds_every_kind_of_read() -> None:
    """The checker itself: each form of read is found, each write is not."""
    source = """
import os
from netcoll import settings
WINDOW = "NETCOLL_RECV_WINDOW"
TOKEN = settings.registry.TOKEN.name
a = os.environ.get("NETCOLL_LOOP")
b = os.getenv(WINDOW)
c = os.environ[TOKEN]
d = "NETCOLL_RANK" in os.environ
e = env.get("NETCOLL_LIMIT_" + name.upper())
f = os.environ.get(name)
g = os.environ.get(f"NETCOLL_{x}")
env["NETCOLL_RANK"] = "1"
env.pop("NETCOLL_TRANSPORT", None)
child = dict(os.environ, NETCOLL_TOKEN="t")
term = os.environ.get("TERM")
"""
    tree = ast.parse(source)
    found = reads(tree, constants({Path("x.py"): tree}))
    assert [line for line, _ in found] == [6, 7, 8, 9, 10, 11, 12]
    assert "of NETCOLL_RECV_WINDOW" in found[1][1]
    assert "of NETCOLL_TOKEN" in found[2][1]
    assert "cannot be resolved" in found[5][1]


def test_every_netcoll_name_in_the_package_is_registered() -> None:
    """A literal ``NETCOLL_*`` name anywhere in netcoll (read or written for a child) is
    one of the registry's (or of its ``NETCOLL_LIMIT_<NAME>`` family)."""
    unknown = []
    for path, tree in parse_all().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                whole = text.startswith(PREFIX) and not text.endswith("_")  # not a prefix such as NETCOLL_LIMIT_
                if whole and text.isupper() and text.replace("_", "").isalnum():
                    try:
                        registry.lookup(text)
                    except KeyError:
                        unknown.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {text}")
    assert not unknown, "\n".join(unknown)
