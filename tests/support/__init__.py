"""Helpers shared by the tests (fixtures themselves live in tests/conftest.py)."""

from .groups import ALL_LINKS, TRANSPORTS, Group, MakeGroup, memory_group, tcp_group
from .worlds import REPO, connected_world, memory_world, rank_data, run_world, run_world_settled, valid_ops

__all__ = [
    "REPO",
    "ALL_LINKS",
    "TRANSPORTS",
    "Group",
    "connected_world",
    "MakeGroup",
    "memory_group",
    "memory_world",
    "rank_data",
    "run_world",
    "run_world_settled",
    "tcp_group",
    "valid_ops",
]
