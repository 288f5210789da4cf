"""The environment of a ``python -m netcoll`` (or other) subprocess of a test."""

from __future__ import annotations

import os

from .worlds import REPO


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment without ``NETCOLL_*`` settings, the checkout first on
    ``PYTHONPATH``, unbuffered output, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env
