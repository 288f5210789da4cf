"""Byte sizes as people write them, and back: the one size grammar of netcoll.

Every size netcoll reads — ``netcoll submit --size``, ``netcoll up --size``,
``netcoll bench -b/-e/--segment-bytes``, a job's ``size`` field, ``bench/compare.py`` —
goes through :func:`parse_size`, so they all accept the same text and reject
bad text with the same message::

    4096  4K  4KiB  64M  64MiB  1G  1.5M  0.5GiB  16B  2T  12MB  1.5GB

Grammar: a number (digits, optionally with a decimal part), optional spaces, an
optional unit ``K``, ``M``, ``G`` or ``T`` (any case), optionally followed by
``iB`` or ``B``; or a bare ``B``. What a unit means follows how people write it:

* ``KiB``, ``MiB``, ``GiB``, ``TiB`` are powers of 1024 (IEC), and so is a bare
  letter, as in nccl-tests (``-e 64M``): ``64M`` and ``64MiB`` are 67108864 bytes;
* ``KB``, ``MB``, ``GB``, ``TB`` are powers of 1000 (SI), as in every other tool:
  ``12MB`` is 12000000 bytes, ``1GB`` is 10⁹.

A decimal must come out a whole number of bytes (``1.5K`` is 1536; ``1.5`` and
``0.1K`` are errors).

:func:`format_size` is the inverse for display: the shortest exact form (at most
three decimals in a binary unit, one in an SI unit), binary on a tie (``64 KiB``,
``1.5 MiB``, ``12 MB``), else plain bytes (``1001 B``).

No imports beyond the standard library: the command line parses sizes before
it loads numpy.
"""

from __future__ import annotations

import argparse
import re
from decimal import Decimal, InvalidOperation
from typing import Final

__all__ = ["SI_UNITS", "UNITS", "format_size", "parse_size", "size_arg", "size_error"]

#: Unit letter -> bytes of the binary unit (``K``, ``KiB``: powers of 1024).
UNITS: Final[dict[str, int]] = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
#: Unit letter -> bytes of the SI unit (``KB``: powers of 1000).
SI_UNITS: Final[dict[str, int]] = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_HINT: Final = (
    "use bytes with an optional unit: 4096, 4K, 4KiB, 64MiB, 1.5M, 1G, 12MB; "
    "K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000"
)
_DISPLAY: Final = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_DISPLAY_SI: Final = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))


def size_error(text: object, reason: str = "") -> str:
    """The one message for text that is not a size (the same from every command)."""
    return f"not a size: {text!r}{': ' + reason if reason else ''} ({_HINT})"


def _from_number(value: float) -> int:
    """A size given as a number (a JSON field, a Python argument): whole bytes >= 0."""
    if isinstance(value, bool):  # a ValueError, as every bad size (pydantic reports only those)
        raise ValueError(size_error(value))  # noqa: TRY004
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(size_error(value, "not a whole number of bytes"))
    if value < 0:
        raise ValueError(size_error(value, "negative"))
    return int(value)


def parse_size(text: str | float) -> int:
    """Bytes from ``4096``, ``4K``, ``4KiB``, ``64MiB``, ``1.5M``, ``1G``, ``12MB`` ... (or an int).

    Raises:
        ValueError: with :func:`size_error`'s message for anything else, so that
            every command reports a bad size the same way.
    """
    if isinstance(text, (int, float)):
        return _from_number(text)
    m = _SIZE.match(str(text))
    if m is None:
        raise ValueError(size_error(text))
    number, unit, suffix = m.group(1), m.group(2).lower(), m.group(3).lower()
    if suffix == "i" or (suffix == "ib" and not unit):
        raise ValueError(size_error(text))  # "4Ki", "4iB": an i needs a unit before and a B after
    try:
        exact = Decimal(number) * (SI_UNITS if suffix == "b" and unit else UNITS)[unit]
    except InvalidOperation:  # pragma: no cover - the pattern only lets numbers through
        raise ValueError(size_error(text)) from None
    if exact != exact.to_integral_value():
        raise ValueError(size_error(text, f"{exact.normalize():f} bytes is not a whole number"))
    return int(exact)


def size_arg(text: str) -> int:
    """``type=`` of every size flag (``--size``, ``-b``, ``-e``, ...): :func:`parse_size`,
    its message as the usage error, so every command words a bad size the same way."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_size(n: int | None) -> str:
    """``4 B``, ``64 KiB``, ``1.5 MiB``, ``12 MB``, ``1001 B``; ``-`` for None (unknown).

    Exact: of the binary units in which ``n`` has at most three decimals and the largest
    SI unit below ``n`` if it has at most one there, the shortest (binary on a tie:
    ``1.125 KiB``, ``12 MB``, ``1.5 GB``, never ``11718.75 KiB`` or ``1.001 KB``); else
    bytes. So ``parse_size(format_size(n)) == n`` for every size this prints.
    """
    if n is None:
        return "-"
    si = next(((u, scale) for u, scale in _DISPLAY_SI if n >= scale), None)  # only the largest SI unit
    shown = []
    for unit, scale in (*_DISPLAY, *([si] if si else [])):
        places = 1 if unit.endswith("B") and "i" not in unit else 3  # SI: "12 MB", "1.5 GB", never "1.001 KB"
        if n >= scale and (n * 10**places) % scale == 0:
            text = f"{Decimal(n * 10**places // scale) / 10**places:f}"
            shown.append((text.rstrip("0").rstrip(".") if "." in text else text, unit))
    number, unit = min(shown, key=lambda s: len(s[0]), default=(str(n), "B"))  # the shortest; binary on a tie
    return f"{number} {unit}"
