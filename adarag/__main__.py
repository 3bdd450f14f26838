"""``python -m adarag``: the ``adarag`` command."""

from __future__ import annotations

import sys

from adarag.cli import main

if __name__ == "__main__":
    sys.exit(main())
