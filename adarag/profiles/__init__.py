"""Packaged model profiles (attention sinks and augmentation calibration)."""
