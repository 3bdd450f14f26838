"""Tooling behind ``adarag bench``, ``profile`` and ``calibrate``, never imported by serving.

The benchmark harness (policies, workloads, runs, reports) and the profile builders
(:mod:`adarag.evaluation.profiling`).
"""
