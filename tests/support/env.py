"""The environment of a ``python -m netcoll`` (or other) subprocess of a test."""

from __future__ import annotations

import os
import signal
import subprocess

from .worlds import REPO


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment without ``NETCOLL_*`` settings, the checkout first on
    ``PYTHONPATH``, unbuffered output, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETCOLL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_session(cmd: list[str], timeout: float = 360, cwd: str | os.PathLike[str] | None = None) -> tuple[int, str]:
    """Run ``cmd`` (with :func:`subprocess_env`) in a session of its own and return its exit
    status and output (stdout and stderr together); on a timeout or an error here the whole
    session (the program and every rank it started) is SIGKILLed."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        text, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, text
