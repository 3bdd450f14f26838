"""``augmentation_cost.py``'s subcommands: what adaptive augmentation costs."""

from __future__ import annotations

from common import RESULTS

OUTPUT = RESULTS / "adaptive-augmentation"
