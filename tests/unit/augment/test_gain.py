"""Information gain and the chunks it keeps (adarag.augment.gain), table-driven."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adarag.augment.gain import information_gain, kept_chunks, normalized_entropy
from adarag.errors import ConfigError

VOCAB = 50


def _peaked(height: float) -> np.ndarray:
    """Logits with one token ``height`` above an otherwise flat row."""
    row = np.zeros(VOCAB)
    row[7] = height
    return row


def test_one_hot_has_entropy_zero_and_uniform_has_entropy_one():
    one_hot = _peaked(1e4)
    uniform = np.zeros(VOCAB)
    assert normalized_entropy(np.stack([one_hot, uniform]), top_k=20) == pytest.approx([0.0, 1.0])


def test_entropy_is_over_the_top_k_alone():
    # the top-4 are equal; what lies below them does not count
    row = np.concatenate([np.full(4, 5.0), np.linspace(-3.0, 0.0, VOCAB - 4)])
    assert normalized_entropy(row[None], top_k=4) == pytest.approx([1.0])
    assert normalized_entropy(row[None], top_k=8)[0] < 1.0


def test_a_cpu_tensor_reads_like_an_array():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    assert normalized_entropy(logits) == pytest.approx(normalized_entropy(logits.numpy()))


def test_top_k_below_two_is_refused():
    with pytest.raises(ConfigError, match="at least 2"):
        normalized_entropy(np.zeros((1, VOCAB)), top_k=1)


def test_a_sharpening_chunk_gains_and_a_blurring_one_loses():
    no_context = _peaked(2.0)
    sharper, same, blurrier = _peaked(6.0), _peaked(2.0), np.zeros(VOCAB)
    gains = information_gain(np.stack([no_context, sharper, same, blurrier]))
    assert gains[0] > 0
    assert gains[1] == pytest.approx(0.0)
    assert gains[2] < 0
    assert all(-1.0 <= gain <= 1.0 for gain in gains)


GAINS = [0.02, 0.30, -0.10, 0.12, 0.05]


@pytest.mark.parametrize(
    ("threshold", "order", "min_chunks", "max_chunks", "expected"),
    [
        (0.05, "gain", 1, None, [1, 3, 4]),  # best gain first
        (0.05, "retrieval", 1, None, [1, 3, 4]),
        (0.10, "gain", 1, None, [1, 3]),
        (0.00, "gain", 1, None, [1, 3, 4, 0]),
        (0.00, "retrieval", 1, None, [0, 1, 3, 4]),  # as retrieved
        (0.50, "gain", 1, None, [1]),  # none reaches τ: the floor keeps the best
        (0.50, "gain", 2, None, [1, 3]),
        (0.50, "retrieval", 2, None, [1, 3]),
        (0.00, "gain", 1, 2, [1, 3]),  # the cap keeps the best gains
        (0.00, "retrieval", 1, 2, [1, 3]),
        (-1.0, "gain", 1, None, [1, 3, 4, 0, 2]),
        (0.50, "gain", 0, None, []),  # a floor of 0 allows no context
    ],
)
def test_kept_chunks(threshold, order, min_chunks, max_chunks, expected):
    assert kept_chunks(GAINS, threshold, order, min_chunks, max_chunks) == expected


def test_ties_keep_the_retrievers_order():
    assert kept_chunks([0.1, 0.2, 0.1, 0.2], 0.0, "gain") == [1, 3, 0, 2]


def test_an_unknown_order_is_refused():
    with pytest.raises(ConfigError, match="'gain' or 'retrieval'"):
        kept_chunks(GAINS, 0.05, "score")
