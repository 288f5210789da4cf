"""Every flag is spelled out: no argparse abbreviations (``--token`` is an error, not
``--token-file``), and every flag README.md and docs/ show for a ``netcoll`` command is
one that command has (issue 38, item 4). No processes: the parsers themselves."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from netcoll.cli import COMMANDS, build_parser, main
from netcoll.cli.bench import bench_parser
from tests.support import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "deploy").glob("*.md"))]
#: ``netcoll <command> ...`` as written in a document, up to the end of its code span or line
_COMMAND_LINE = re.compile(r"netcoll (" + "|".join(COMMANDS) + r")((?:[ \t]+[^`|\n]*)?)")


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's full parser (bench: the one its arguments go to)."""
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    found = dict(sub.choices)
    found["bench"] = bench_parser()
    return found


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return dict(parser._option_string_actions)


def test_every_parser_refuses_abbreviations() -> None:
    for name, parser in {"netcoll": build_parser(), **parsers()}.items():
        assert parser.allow_abbrev is False, name


@pytest.mark.parametrize(
    ("argv", "unknown"),
    [
        (["submit", "all_reduce", "--token", "s3cret"], "--token"),
        (["status", "--coord", "127.0.0.1:1"], "--coord"),
        (["bench", "--rank", "4"], "--rank"),
        (["run", "-n", "2", "--nnode", "2", "x.py"], "--nnode"),
    ],
)
def test_an_abbreviated_flag_is_a_usage_error(
    argv: list[str], unknown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert unknown in err and "token file" not in err


def _documented_commands() -> list[tuple[str, str, list[str]]]:
    """(where, command, words after it) for every ``netcoll COMMAND ...`` in the docs."""
    found = []
    for path in DOCS:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in _COMMAND_LINE.finditer(line):
                rest = m.group(2).split("#", 1)[0]
                try:
                    words = shlex.split(rest)
                except ValueError:
                    words = rest.split()
                found.append((f"{path.relative_to(REPO)}:{n}", m.group(1), words))
    return found


def _flags_of(command: str, words: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """The options in ``words`` that belong to ``command`` (not to ``run``'s script)."""
    flags, known, skip = [], options(parser), False
    for word in words:
        if skip:
            skip = False
            continue
        if not word.startswith("-") or word in ("-", "--"):
            if command == "run":
                break  # the script, then its own arguments
            continue
        name = word.split("=", 1)[0]
        flags.append(name)
        action = known.get(name)
        skip = action is not None and action.nargs != 0 and "=" not in word
    return flags


def test_the_docs_show_only_flags_the_commands_have() -> None:
    all_parsers = parsers()
    documented = _documented_commands()
    assert len(documented) > 50  # the docs do show commands (the pattern finds them)
    wrong = []
    for where, command, words in documented:
        parser = all_parsers[command]
        wrong += [
            f"{where}: netcoll {command} {flag}"
            for flag in _flags_of(command, words, parser)
            if flag not in options(parser)
        ]
    assert not wrong, "documented flags that do not exist:\n" + "\n".join(wrong)


def _table_flags() -> list[tuple[str, str | None, str]]:
    """(where, command or None, flag) for every flag in a table row of the docs whose first
    cell is a flag (``| `--port` / ...``) or names a command (``| `netcoll run` |``, and the
    rows below it with an empty first cell). The command: the row's, else the one the
    section's heading names (``## The launcher (`netcoll run`)``), else None (any)."""
    found: list[tuple[str, str | None, str]] = []
    for path in DOCS:
        heading: str | None = None
        row: str | None = None
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("#"):
                named = re.search(r"`netcoll (\w+)`", line)
                heading = named.group(1) if named and named.group(1) in COMMANDS else None
                continue
            if not line.startswith("|"):
                row = None
                continue
            first = line.strip("|").split("|")[0].strip()
            named = re.match(r"`netcoll (\w+)", first)
            if named and named.group(1) in COMMANDS:
                row = named.group(1)
            elif first:
                row = None
                if not first.startswith("`-"):
                    continue  # a row about something else (a script of bench/, a tool)
            for flag in re.findall(r"`(--[a-z][a-z0-9-]*)", line):
                found.append((f"{path.relative_to(REPO)}:{n}", row or heading, flag))
    return found


def test_the_docs_tables_name_real_flags() -> None:
    """Each flag in a docs table is a flag of the command the row or its section names
    (README's settings table: of some command, and of each command its last column names)."""
    all_parsers = parsers()
    found = _table_flags()
    assert len(found) > 30
    wrong = []
    for where, command, flag in found:
        having = [name for name, p in all_parsers.items() if flag in options(p)]
        if command is not None and command not in having:
            wrong.append(f"{where}: `netcoll {command}` has no {flag}")
        elif not having:
            wrong.append(f"{where}: no command has {flag}")
    assert not wrong, "\n".join(wrong)


def test_the_readme_flag_table_names_real_flags() -> None:
    """Each flag in the first cell of a README table row (``| `--port` / ...``): a flag of
    some command, and of each command the row's last cell names."""
    all_parsers = parsers()
    rows = [line for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    assert len(rows) > 10
    wrong = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        flags = re.findall(r"`(--[a-z][a-z0-9-]*)`", cells[0])
        named = [c for c in re.findall(r"`([a-z]+)`", cells[-1]) if c in COMMANDS]
        for flag in flags:
            having = [name for name, p in all_parsers.items() if flag in options(p)]
            if not having:
                wrong.append(f"{flag}: no command has it")
            wrong += [f"{flag}: `netcoll {name}` has no such flag" for name in named if name not in having]
    assert not wrong, "\n".join(wrong)
