"""``netcoll submit`` refuses a flag the collective would ignore (issue 38, item 4):
``all_gather --op max``, ``scatter --op max``, ``all_gather --root 1``, ``barrier --size
1GiB`` exit 2 with one line saying so, before anything is sent. In process: the checks
run before the command connects (the coordinator named does not exist)."""

from __future__ import annotations

import pytest

from netcoll.cli import build_parser, main
from netcoll.cli.common import flags
from netcoll.cli.submit import job_spec
from netcoll.collectives import REGISTRY
from netcoll.config import SubmitConfig

NOBODY = ["--coordinator", "127.0.0.1:9", "--connect-timeout", "0.1"]

#: flag -> (its words, whether collective c takes it)
FLAGS = {
    "--op": (["--op", "max"], lambda c: c.takes_op),
    "--root": (["--root", "1"], lambda c: c.takes_root),
    "--size": (["--size", "1GiB"], lambda c: c.has_data),
    "--dtype": (["--dtype", "int8"], lambda c: c.has_data),
}
CASES = [(name, flag) for name in REGISTRY for flag in FLAGS]


@pytest.mark.parametrize(("name", "flag"), [c for c in CASES if not FLAGS[c[1]][1](REGISTRY[c[0]])])
def test_a_flag_the_collective_ignores_is_refused(name: str, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", name, *FLAGS[flag][0], *NOBODY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"invalid job: {name} takes no {flag}: " in err[0], err


@pytest.mark.parametrize(("name", "flag"), [c for c in CASES if FLAGS[c[1]][1](REGISTRY[c[0]])])
def test_a_flag_the_collective_takes_passes(name: str, flag: str) -> None:
    ns = build_parser().parse_args(["submit", name, *FLAGS[flag][0]])
    assert job_spec(SubmitConfig.load(flags(ns), {})).op == name


def test_the_message_says_what_the_collective_is_and_which_take_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "all_gather", "--op", "max", *NOBODY]) == 2
    assert capsys.readouterr().err.strip() == (
        "netcoll submit: invalid job: all_gather takes no --op: it reduces nothing "
        "(collectives with a reduction: all_reduce, reduce_scatter, reduce)"
    )
    assert main(["submit", "barrier", "--size", "1GiB", *NOBODY]) == 2
    assert capsys.readouterr().err.strip() == "netcoll submit: invalid job: barrier takes no --size: it moves no data"


def test_compression_flag(capsys: pytest.CaptureFixture[str]) -> None:
    ns = build_parser().parse_args(["submit", "all_reduce", "--compression", "int8"])
    assert job_spec(SubmitConfig.load(flags(ns), {})).compression == "int8"
    ns = build_parser().parse_args(["submit", "broadcast"])
    assert job_spec(SubmitConfig.load(flags(ns), {})).compression is None  # the daemons' default
    assert main(["submit", "all_to_all", "--compression", "fp16", *NOBODY]) == 2
    assert "all_to_all takes no compression" in capsys.readouterr().err
    assert main(["submit", "all_reduce", "--dtype", "int32", "--compression", "fp16", *NOBODY]) == 2
    assert "needs a float" in capsys.readouterr().err
