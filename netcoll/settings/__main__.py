"""``python3 -m netcoll.settings --markdown`` prints the table of every ``NETCOLL_*``
variable; ``--write README.md`` updates it in place between the README's markers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .table import markdown, replaced


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m netcoll.settings", description=__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--markdown", action="store_true", help="print the table of settings")
    what.add_argument("--write", metavar="FILE", help="replace the table between FILE's settings markers")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    path = Path(args.write)
    try:
        path.write_text(replaced(path.read_text(encoding="utf-8")), encoding="utf-8")
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"netcoll.settings: {path}: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
