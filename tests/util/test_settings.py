"""netcoll.settings: the registry of every NETCOLL_* variable, its typed readers, and
the README's table generated from it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from netcoll import config, logs, loop, settings
from netcoll.errors import ConfigError
from netcoll.links.factory import BITS
from netcoll.settings import registry, table

from ..support.env import subprocess_env
from ..support.worlds import REPO

README = REPO / "README.md"
Reader = Callable[[Mapping[str, str]], object]


# -- the registry -----------------------------------------------------------------------
def test_names_are_unique_and_netcoll_ones() -> None:
    names = [v.name for v in settings.VARIABLES]
    assert len(names) == len(set(names))
    assert all(n.startswith("NETCOLL_") and n.replace("<", "").replace(">", "").isupper() for n in names)
    assert all(v.doc and v.readers for v in settings.VARIABLES)


#: each command's model -> its reader in the registry
COMMANDS: dict[type[config.Settings], str] = {
    config.CoordinatorConfig: registry.COORD,
    config.RankConfig: registry.DAEMON,
    config.ClientConfig: registry.CLIENTS,
    config.UpConfig: registry.UP,
}


def test_the_commands_read_what_the_registry_says() -> None:
    """netcoll.config's models read only registered variables, and the registry names
    every command that reads each (``cli``: every command)."""
    for var in config.TLS_ENV.values():
        assert registry.CLI in settings.lookup(var).readers, var
    for model, reader in COMMANDS.items():
        for var in model.ENV.values():
            readers = settings.lookup(var).readers
            assert reader in readers or registry.CLI in readers, (model.__name__, var)
        said = {v.name for v in settings.VARIABLES if reader in v.readers and not v.prefix}  # limits: netcoll.limits
        assert said <= set(model.ENV.values()), (model.__name__, said - set(model.ENV.values()))


def test_the_other_helpers_variables_are_declared() -> None:
    assert registry.COMPRESSION.choices == ("none", "fp16", "bf16", "int8")
    assert registry.COMPRESSION.default == "none"
    assert settings.lookup("NETCOLL_RESTART_COUNT").default == "0"


def test_an_unregistered_name_is_refused() -> None:
    with pytest.raises(KeyError, match="NETCOLL_NOPE is not a registered netcoll setting"):
        settings.raw("NETCOLL_NOPE", {"NETCOLL_NOPE": "1"})
    with pytest.raises(KeyError):
        settings.lookup("NETCOLL_LIMIT_")  # the family's prefix alone names no limit


def test_limits_are_one_family() -> None:
    assert settings.lookup("NETCOLL_LIMIT_MAX_JOB_BYTES") is registry.LIMIT
    assert settings.limit_variable("max_job_bytes") == "NETCOLL_LIMIT_MAX_JOB_BYTES"
    assert settings.limit("max_job_bytes", {"NETCOLL_LIMIT_MAX_JOB_BYTES": "1G"}) == "1G"
    assert settings.limit("max_job_bytes", {"NETCOLL_LIMIT_MAX_JOB_BYTES": ""}) is None


def test_choices_are_the_ones_their_layers_accept() -> None:
    """Where a layer above checks the value, the registry's choices say the same."""
    assert set(registry.TRANSPORT.choices) == {"auto", *BITS}
    assert set(registry.LOOP.choices) == {"auto", *loop.LOOPS}
    assert registry.LOG_FORMAT.choices == logs.FORMATS
    assert registry.LOG_LEVEL.choices == config.LOG_LEVELS


def test_secrets_are_never_shown() -> None:
    assert {v.name for v in settings.VARIABLES if v.secret} == {"NETCOLL_TOKEN", "NETCOLL_CLIENT_TOKEN"}
    assert registry.TOKEN.shown("hunter2") == "(set)"
    assert registry.TOKEN.shown(None) == "(unset)"
    assert registry.RANK.shown("3") == "'3'"
    assert "hunter2" not in table.markdown()


# -- reading ------------------------------------------------------------------------------
def test_read_at_call_time_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NETCOLL_WORLD_SIZE", raising=False)
    assert settings.world_size() is None
    monkeypatch.setenv("NETCOLL_WORLD_SIZE", " 4 ")
    assert settings.world_size() == 4
    assert settings.world_size({"NETCOLL_WORLD_SIZE": "2"}) == 2  # a mapping given wins


@pytest.mark.parametrize(
    ("reader", "name", "value", "message"),
    [
        (settings.world_size, "NETCOLL_WORLD_SIZE", "0", "NETCOLL_WORLD_SIZE must be an integer >= 1, got '0'"),
        (settings.rank, "NETCOLL_RANK", "two", "NETCOLL_RANK must be an integer >= 0, got 'two'"),
        (settings.restart_count, "NETCOLL_RESTART_COUNT", "-1", "NETCOLL_RESTART_COUNT must be an integer >= 0"),
        (settings.emulate_delay_us, "NETCOLL_EMULATE_DELAY_US", "1000001", "0 to 1000000; got '1000001'"),
        (settings.compression, "NETCOLL_COMPRESSION", "fp8", "one of none, fp16, bf16, int8, got 'fp8'"),
    ],
)
def test_bad_values_are_config_errors(reader: Reader, name: str, value: str, message: str) -> None:
    """Exit 2 on the command line; the message names the variable, the value and what is expected."""
    with pytest.raises(ConfigError) as info:
        reader({name: value})
    assert message in str(info.value)
    assert name in str(info.value)


@pytest.mark.parametrize(
    ("reader", "name", "value", "message"),
    [
        (settings.recv_window, "NETCOLL_RECV_WINDOW", "64Q", "NETCOLL_RECV_WINDOW: not a size: '64Q'"),
        (settings.shm_bytes, "NETCOLL_SHM_BYTES", "-1", "NETCOLL_SHM_BYTES: not a size"),
        (settings.result_pool, "NETCOLL_RESULT_POOL", "lots", "NETCOLL_RESULT_POOL: not a size: 'lots'"),
        (settings.spin_us, "NETCOLL_SPIN_US", "100001", "from 0 to 100000, got '100001'"),
        (settings.shm_lane, "NETCOLL_SHM_LANE", "yes", "NETCOLL_SHM_LANE must be 0 or 1, got 'yes'"),
        (settings.shm_cma, "NETCOLL_SHM_CMA", "2", "NETCOLL_SHM_CMA must be 0, 1 or auto, got '2'"),
    ],
)
def test_bad_values_of_links_and_loops_stay_value_errors(reader: Reader, name: str, value: str, message: str) -> None:
    """The ValueError (exit 1) these layers raised before the registry; never a ConfigError."""
    with pytest.raises(ValueError) as info:
        reader({name: value})
    assert not isinstance(info.value, ConfigError)
    assert message in str(info.value)


def test_sizes() -> None:
    assert settings.recv_window({"NETCOLL_RECV_WINDOW": "64MiB"}) == 64 << 20
    assert settings.recv_window({"NETCOLL_RECV_WINDOW": ""}) is None
    assert settings.shm_bytes({"NETCOLL_SHM_BYTES": "12MB"}) == 12_000_000
    assert settings.result_pool({"NETCOLL_RESULT_POOL": "0"}) == 0
    assert settings.result_pool({}) is None
    assert settings.result_pool({"NETCOLL_RESULT_POOL": "  "}) is None  # as it always was
    with pytest.raises(ValueError, match="NETCOLL_RECV_WINDOW: not a size"):
        settings.recv_window({"NETCOLL_RECV_WINDOW": "  "})  # as it always was: only "" is unset


def test_whole_numbers() -> None:
    assert settings.rank({"NETCOLL_RANK": "0"}) == 0
    assert settings.rank({"NETCOLL_RANK": "  "}) is None
    assert settings.restart_count({}) == 0
    assert settings.restart_count({"NETCOLL_RESTART_COUNT": "3"}) == 3
    assert settings.spin_us({"NETCOLL_SPIN_US": "0"}) == 0
    assert settings.spin_us({}) is None
    assert settings.emulate_delay_us({"NETCOLL_EMULATE_DELAY_US": "200"}) == 200
    assert settings.emulate_delay_us({}) == 0


def test_switches() -> None:
    assert settings.cost_model({}) is None
    assert settings.cost_model({"NETCOLL_COST_MODEL": "On"}) is True
    assert settings.cost_model({"NETCOLL_COST_MODEL": "0"}) is False
    assert settings.shm_lane({}) is True
    assert settings.shm_lane({"NETCOLL_SHM_LANE": "0"}) is False
    assert settings.shm_cma({"NETCOLL_SHM_CMA": " AUTO "}) == "auto"
    assert settings.traceback_full({"NETCOLL_TRACEBACK": "Full"}) is True
    assert settings.debug({"NETCOLL_DEBUG": "1"}) is True
    assert settings.debug({"NETCOLL_DEBUG": ""}) is False


def test_floats() -> None:
    assert settings.slow_op_s({"NETCOLL_SLOW_OP_S": "0.5"}) == 0.5
    assert settings.slow_op_s({"NETCOLL_SLOW_OP_S": "soon"}) is None  # ignored, as always: the default applies
    assert settings.slow_op_s({}) is None


def test_choices_and_texts() -> None:
    assert settings.compression({}) == "none"
    assert settings.compression({"NETCOLL_COMPRESSION": "BF16"}) == "bf16"
    assert settings.transport({}) == "auto"
    assert settings.transport({"NETCOLL_TRANSPORT": " TCP "}) == "tcp"
    assert settings.loop({"NETCOLL_LOOP": ""}) is None
    assert settings.coordinator({"NETCOLL_COORDINATOR": " 10.0.0.1:29400 "}) == "10.0.0.1:29400"
    assert settings.coordinator({"NETCOLL_COORDINATOR": ""}) is None
    assert settings.local_host({"NETCOLL_LOCAL_HOST": "127.0.0.2"}) == "127.0.0.2"
    assert settings.algo({"NETCOLL_ALGO": "ring"}) == "ring"
    assert settings.log_level({"NETCOLL_LOG_LEVEL": " debug "}) == "debug"
    assert settings.error_file({"NETCOLL_ERROR_FILE": ""}) is None


def test_tokens_and_tls() -> None:
    env = {
        "NETCOLL_TOKEN": "t",
        "NETCOLL_TOKEN_FILE": "/f",
        "NETCOLL_TLS_CERT": "c",
        "NETCOLL_TLS_CHECK_HOSTNAME": "yes",
    }
    assert settings.token_texts("NETCOLL_TOKEN", env) == ("t", "/f")
    assert settings.token_texts("NETCOLL_CLIENT_TOKEN", env) == (None, None)
    with pytest.raises(KeyError):
        settings.token_texts("NETCOLL_RANK", env)
    assert settings.tls_files(env) == settings.TlsFiles("c", None, None, True)
    assert settings.tls_files({}).check_hostname is False


# -- the README's table ---------------------------------------------------------------------
def test_the_table_has_every_variable() -> None:
    text = table.markdown()
    assert all(f"`{v.name}`" in text for v in settings.VARIABLES)
    assert len(text.splitlines()) == 2 + len(settings.VARIABLES)


def test_the_readme_table_is_the_registry() -> None:
    """Run ``python3 -m netcoll.settings --write README.md`` after changing the registry."""
    document = README.read_text(encoding="utf-8")
    assert table.START in document
    assert table.replaced(document) == document


def test_the_command_writes_between_the_markers(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(f"# x\n{table.START}\nstale\n{table.END}\nafter\n", encoding="utf-8")
    command = [sys.executable, "-m", "netcoll.settings", "--write", str(doc)]
    done = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert doc.read_text(encoding="utf-8") == f"# x\n{table.START}\n{table.markdown()}{table.END}\nafter\n"
    (tmp_path / "plain.md").write_text("no markers\n", encoding="utf-8")
    command[-1] = str(tmp_path / "plain.md")
    done = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "markers" in done.stderr
