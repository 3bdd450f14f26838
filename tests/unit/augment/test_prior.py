"""The retrieval-score gap prior on the augmentation depth."""

from __future__ import annotations

import pytest

from adarag.augment.prior import chunks_before_gap


@pytest.mark.parametrize(
    ("scores", "gap", "floor", "expected"),
    [
        ([0.9, 0.85, 0.3, 0.29], 0.2, 1, 2),  # the drop after the second chunk
        ([0.9, 0.5, 0.45], 0.2, 1, 1),
        ([0.9, 0.5, 0.45], 0.2, 2, 3),  # drops before the floor do not count
        ([0.9, 0.8, 0.7], 0.2, 1, 3),  # no gap: every chunk
        ([0.9, None, 0.1], 0.2, 1, 3),  # unscored chunks: every chunk
        ([], 0.2, 1, 0),
    ],
)
def test_chunks_before_the_first_large_score_drop(scores, gap, floor, expected):
    assert chunks_before_gap(scores, gap, floor) == expected
