"""Bootstrap intervals cover the mean, narrow with more questions, and pair by question."""

from __future__ import annotations

import pytest

from adarag.evaluation.intervals import bootstrap_interval, paired_difference


def test_interval_holds_the_mean_and_narrows_with_more_questions():
    few = bootstrap_interval([1.0, 0.0] * 5)
    many = bootstrap_interval([1.0, 0.0] * 200)
    assert few.low <= few.mean == 0.5 <= few.high
    assert many.high - many.low < few.high - few.low
    assert bootstrap_interval([1.0, 0.0] * 5) == few  # seeded: the same report twice
    constant = bootstrap_interval([0.7] * 9)
    assert constant.low == constant.high == pytest.approx(0.7)


def test_paired_difference_sees_a_shift_that_unpaired_noise_would_hide():
    base = [float(x % 7) for x in range(60)]
    shifted = [value + 1.0 for value in base]
    found = paired_difference(shifted, base)
    assert found.difference.mean == pytest.approx(1.0)
    assert found.difference.low == pytest.approx(1.0) and found.p_value == 0.0
    same = paired_difference(base, base)
    assert same.difference.mean == 0.0 and same.p_value == 1.0
    mixed = paired_difference([1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0])
    assert mixed.p_value > 0.5
    with pytest.raises(ValueError, match="same questions"):
        paired_difference([1.0], [1.0, 2.0])


def test_the_median_interval_holds_the_median_and_narrows_with_more_requests():
    from adarag.evaluation.intervals import median_interval

    few = median_interval([1.0, 2.0, 3.0, 10.0])
    assert few.mean == 2.5 and few.low <= 2.5 <= few.high
    many = median_interval([1.0, 2.0, 3.0, 10.0] * 25)
    assert many.mean == 2.5 and many.high - many.low < few.high - few.low


def test_the_ratio_of_medians_of_a_scaled_sample_is_the_scale():
    from adarag.evaluation.intervals import ratio_of_medians

    slow = [float(v) for v in range(1, 41)]
    ratio = ratio_of_medians(slow, [v / 2 for v in slow])
    assert ratio.mean == pytest.approx(2.0)
    assert ratio.low < 2.0 < ratio.high  # independent resamples: an interval, not a point
    same = ratio_of_medians(slow, slow)
    assert same.mean == 1.0 and same.low < 1.0 < same.high
    with pytest.raises(ValueError, match="both sides"):
        ratio_of_medians(slow, [])
