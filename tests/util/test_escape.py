"""netcoll.escape.escape: untrusted text made safe for one log line or terminal."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from netcoll.escape import escape

SUFFIX = re.compile(r"…\[(\d+) chars\]$")


def test_controls_and_ansi_escapes_are_made_visible() -> None:
    assert escape("rank\x1b[31m0\n") == "rank\\x1b[31m0\\n"
    assert escape("a\tb\rc\x00d\x7fe\x9b") == "a\\tb\\rc\\x00d\\x7fe\\x9b"
    assert escape("evil\u202etxt.exe") == "evil\\u202etxt.exe"  # bidi override
    assert escape("\ud800") == "\\ud800"  # a lone surrogate
    assert escape("tag\U000e0041") == "tag\\U000e0041"
    assert escape("C:\\path") == "C:\\\\path"  # backslash doubled: the output is unambiguous
    assert escape("plain ascii, ünïcødé 名前 ok") == "plain ascii, ünïcødé 名前 ok"


def test_length_is_capped_with_the_original_length() -> None:
    assert escape("x" * 1000, limit=8) == "xxxxxxxx…[1000 chars]"
    assert escape("x" * 200) == "x" * 200
    assert escape("x" * 201) == "x" * 200 + "…[201 chars]"
    # an escape sequence is never cut in half
    assert escape("ab\x1b", limit=4) == "ab…[3 chars]"
    assert escape("", limit=0) == "" and escape("a", limit=0) == "…[1 chars]"


def test_any_object_bytes_and_hostile_str() -> None:
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert escape(None) == "None" and escape(42) == "42"
    assert escape(b"ok\x1b\xff") == "ok\\x1bÿ"
    assert escape(memoryview(b"\n")) == "\\n"
    assert escape(Hostile()) == "<unprintable Hostile: RuntimeError>"
    assert escape(10**5000).startswith("<unprintable int")  # str() of a huge int raises
    assert escape(ValueError("peer says \x1b[2J")) == "peer says \\x1b[2J"


@given(st.one_of(st.text(), st.binary()), st.integers(min_value=0, max_value=300))
def test_output_is_printable_bounded_and_keeps_printable_text(s: str | bytes, limit: int) -> None:
    out = escape(s, limit)
    assert out.isprintable()  # no control character, no escape sequence, no line break
    m = SUFFIX.search(out)
    body = out[: m.start()] if m else out
    assert len(body) <= limit
    assert (m is not None) == (len(body) < len(escape(s, 10**9)))
    if m:
        assert int(m.group(1)) == len(s)
    if isinstance(s, str) and s.isprintable() and "\\" not in s and len(s) <= limit:
        assert out == s
