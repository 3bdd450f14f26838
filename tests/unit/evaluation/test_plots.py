"""Benchmark figures: every policy told apart, no empty panel."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from matplotlib.image import imread  # noqa: E402

from adarag.evaluation.plots import ttft_scatter  # noqa: E402

POINTS = [("full", 3.6), ("prefix", 3.7), ("adacache", 0.9), ("cacheblend", 0.95)]


def test_a_panel_without_any_value_is_left_out(tmp_path):
    """Regression: a run without the `full` policy drew an empty agreement panel."""
    both = ttft_scatter(
        POINTS, [("F1", [1.0] * 4), ("agreement", [90.0] * 4)], "t", tmp_path / "a.png"
    )
    one = ttft_scatter(
        POINTS, [("F1", [1.0] * 4), ("agreement", [None] * 4)], "t", tmp_path / "b.png"
    )
    assert imread(one).shape[1] < imread(both).shape[1] * 0.6  # one panel wide, not two


def test_policies_scoring_alike_are_told_apart_by_marker_and_colour(tmp_path, monkeypatch):
    """Regression: labels printed next to the points overprinted one another."""
    import matplotlib.figure

    legends = []
    original = matplotlib.figure.Figure.legend

    def record(figure, handles, labels, **kwargs):
        legends.append(labels)
        return original(figure, handles, labels, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "legend", record)
    ttft_scatter(POINTS, [("F1", [1.0, 1.0, 1.0, None])], "t", tmp_path / "c.png")
    assert legends == [["full", "prefix", "adacache"]]
