"""``python -m netcoll``: the ``netcoll`` command line (see :mod:`netcoll.cli`)."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
