"""``netcoll coordinator``'s HTTP port follows its RPC port (issue 38, item 4):
``--port 29700`` serves HTTP on 29701, as ``netcoll up`` does, unless told otherwise."""

from __future__ import annotations

import pytest

from netcoll.config import CoordinatorConfig, UpConfig


@pytest.mark.parametrize(
    ("flags", "env", "http"),
    [
        ({}, {}, 29401),
        ({"port": "29700"}, {}, 29701),
        ({}, {"NETCOLL_PORT": "29800"}, 29801),
        ({"port": "0"}, {}, 0),  # any free port for both
        ({"port": "65535"}, {}, 0),
        ({"port": "29700", "http_port": "30000"}, {}, 30000),
        ({"port": "29700"}, {"NETCOLL_HTTP_PORT": "30001"}, 30001),
        ({"port": "29700", "http_port": "off"}, {}, None),
    ],
)
def test_the_http_port_is_the_rpc_port_plus_one_unless_given(
    flags: dict[str, str], env: dict[str, str], http: int | None
) -> None:
    assert CoordinatorConfig.load(flags, env).http_port == http


def test_netcoll_up_and_the_coordinator_agree() -> None:
    for port in ("29400", "29700", "0"):
        assert (
            UpConfig.load({"port": port}, {}).coordinator_http_port
            == CoordinatorConfig.load({"port": port}, {}).http_port
        )


def test_a_bad_port_is_still_reported_as_the_port() -> None:
    with pytest.raises(ValueError, match="--port"):
        CoordinatorConfig.load({"port": "http"}, {})
