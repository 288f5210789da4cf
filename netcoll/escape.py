"""Make untrusted text safe to print: one helper for every log line and terminal.

Member ids, group names, fingerprints, host names and error messages can come
from a peer. Printed raw, they can forge log lines (``\\n``), rewrite the
operator's terminal (ANSI escapes such as ``\\x1b[2J``), hide text (bidi
overrides) or flood a log (megabytes in one field). :func:`escape` makes every
character visible and bounds the length::

    >>> escape("rank\\x1b[31m0\\n")
    'rank\\\\x1b[31m0\\\\n'
    >>> escape("x" * 1000, limit=8)
    'xxxxxxxx…[1000 chars]'

Printable characters pass unchanged (non-ASCII letters included), a backslash
is doubled so the output is unambiguous, and everything else (C0/C1 controls,
DEL, format characters such as U+202E, lone surrogates) is shown as ``\\n``,
``\\t``, ``\\r``, ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``. Bytes are read as
Latin-1, one character per byte. Any other object is ``str()``-ed first.

Pure function, no imports: usable from every layer.
"""

from __future__ import annotations

__all__ = ["escape"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}
_ELLIPSIS = "…"


def _visible(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    if ch.isprintable():
        return ch
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape(s: object, limit: int = 200) -> str:
    """``s`` with every control character and escape sequence made visible,
    cut after ``limit`` output characters with ``…[N chars]`` (N: the
    original length). Never raises for any input."""
    if isinstance(s, (bytes, bytearray, memoryview)):
        raw = bytes(s)
        length = len(raw)
        text = raw[: max(limit, 0) + 1].decode("latin-1")
    elif isinstance(s, str):
        length, text = len(s), s[: max(limit, 0) + 1]
    else:
        try:
            text = str(s)
        except Exception as exc:  # noqa: BLE001 - a hostile __str__ must not break a log line
            text = f"<unprintable {type(s).__name__}: {type(exc).__name__}>"
        length = len(text)
    if text.isprintable() and "\\" not in text and length <= limit:
        return text  # the common case: nothing to do
    out: list[str] = []
    used = 0
    for ch in text:
        piece = _visible(ch)
        if used + len(piece) > limit:
            return "".join(out) + f"{_ELLIPSIS}[{length} chars]"
        out.append(piece)
        used += len(piece)
    return "".join(out)
