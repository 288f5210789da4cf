"""An ABORT's optional fields (docs/protocol.md §2): ``ranks`` and ``w`` (the wait the
sender is in) are checked when present: an older sender without them is fine, a
malformed one is a ProtocolError from the decoder, before any layer above sees it."""

from __future__ import annotations

from typing import Any

import pytest

from netcoll.errors import ProtocolError
from netcoll.wire import FrameDecoder, Kind, encode

BASE: dict[str, Any] = {"g": "default", "q": 3, "reason": "timed out", "origin": 1, "cause": "timeout"}
WAIT: dict[str, Any] = {"n": "all_reduce", "q": 2, "g": "default", "r": [0, 2], "s": 1.5, "a": 2}


def _decode(header: dict[str, Any]) -> dict[str, Any]:
    frames = FrameDecoder().feed(b"".join(bytes(p) for p in encode(Kind.ABORT, header)))
    assert len(frames) == 1
    return frames[0].header


def test_an_abort_without_the_optional_fields_is_accepted() -> None:
    assert _decode(BASE) == BASE


def test_an_abort_with_a_wait_round_trips() -> None:
    header = {**BASE, "ranks": [2], "w": WAIT}
    assert _decode(header) == header
    assert _decode({**BASE, "w": {**WAIT, "s": 0, "r": []}})["w"]["s"] == 0


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"ranks": "2"}, "'ranks' must be a list"),
        ({"ranks": [1, -2]}, "'ranks' holds -2, not a rank"),
        ({"ranks": [True]}, "'ranks' holds True, not a rank"),
        ({"ranks": list(range(513))}, "at most 512 ranks"),
        ({"w": [1, 2]}, "'w' must be a map, got list"),
        ({"w": {**WAIT, "n": 5}}, "'w.n' missing or of wrong type"),
        ({"w": {k: v for k, v in WAIT.items() if k != "g"}}, "'w.g' missing"),
        ({"w": {**WAIT, "q": -1}}, "negative or unreadable number"),
        ({"w": {**WAIT, "s": float("nan")}}, "negative or unreadable number"),
        ({"w": {**WAIT, "s": True}}, "'w.s' missing or of wrong type"),
        ({"w": {**WAIT, "a": -0.5}}, "negative or unreadable number"),
        ({"w": {**WAIT, "r": [0, "1"]}}, "'w.r' holds '1', not a rank"),
    ],
)
def test_a_malformed_optional_field_is_a_protocol_error(extra: dict[str, Any], says: str) -> None:
    with pytest.raises(ProtocolError, match="ABORT header field") as info:
        _decode({**BASE, **extra})
    assert says in str(info.value)
