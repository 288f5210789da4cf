"""``python -m netcoll.cli``: the same as ``python -m netcoll`` and ``netcoll``."""

from __future__ import annotations

import sys

from . import main

sys.exit(main())
