"""docs/troubleshooting.md is reachable and its links hold: the README links to
it, and every relative link (file and #anchor) it has points at something that
exists. Its port defaults are the code's."""

from __future__ import annotations

import re
from pathlib import Path

from netcoll import config
from netcoll.comm import DEFAULT_TIMEOUT
from netcoll.links.factory import DEFAULT_WINDOW, MIN_WINDOW
from netcoll.resultpool import DEFAULT_KEEP

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "troubleshooting.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # no headings inside code blocks
    return {_slug(m) for m in re.findall(r"^#+\s+(.*)$", text, re.M)}


def test_the_readme_links_to_it() -> None:
    assert "(docs/troubleshooting.md)" in (REPO / "README.md").read_text()


def test_every_relative_link_resolves() -> None:
    links = LINK.findall(DOC.read_text())
    assert len(links) >= 10
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        target, _, anchor = link.partition("#")
        path = DOC if not target else (DOC.parent / target).resolve()
        assert path.exists(), link
        if anchor:
            assert anchor in _anchors(path), link


def test_its_defaults_are_the_codes() -> None:
    text = " ".join(DOC.read_text().split())
    assert f"| {config.COORDINATOR_PORT} | `--port`" in text
    assert f"the RPC port + 1 ({config.COORDINATOR_PORT + 1})" in text
    assert f"compose and Kubernetes pin {config.RANK_PORT}" in text
    assert f"compose and Kubernetes pin {config.RANK_HTTP_PORT}" in text
    assert f"by default the communicator's: {DEFAULT_TIMEOUT:g} s" in text
    assert f"`NETCOLL_RESULT_POOL`, {DEFAULT_KEEP >> 20} MiB" in text
    assert f"`NETCOLL_RECV_WINDOW`, {DEFAULT_WINDOW >> 20} MiB; at least {MIN_WINDOW >> 10} KiB" in text
