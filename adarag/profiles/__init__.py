"""Model profiles: attention sinks and augmentation calibration, with the packaged JSON files.

Serving code reads profiles through this package (``model_profile``); measuring sinks and
calibrating are tools the command line runs (:mod:`adarag.evaluation.profiling`).
"""

from __future__ import annotations

from adarag.profiles.model_profile import (
    Calibration,
    LayerBand,
    ModelProfile,
    find_profile,
    generic_profile,
)

__all__ = ["Calibration", "LayerBand", "ModelProfile", "find_profile", "generic_profile"]
