"""A zero-cost prior on the augmentation depth from the retrieval scores (Adaptive-k).

Retrievers rank chunks by similarity; a large drop between two consecutive scores separates the
chunks that match the question from the rest. Augmentation never adds chunks past the first such
gap.
"""

from __future__ import annotations

from collections.abc import Sequence


def chunks_before_gap(scores: Sequence[float | None], min_gap: float, min_chunks: int = 1) -> int:
    """How many chunks to consider: those before the first score drop of at least ``min_gap``.

    Drops before ``min_chunks`` do not count. Without scores (any is None) every chunk counts.

    Args:
        scores: Retrieval scores, best first.
        min_gap: The drop that ends the candidates.
        min_chunks: Never fewer than this many chunks (or all, if there are fewer).
    """
    if any(score is None for score in scores):
        return len(scores)
    values = [float(score) for score in scores if score is not None]
    for index in range(max(min_chunks, 1), len(values)):
        if values[index - 1] - values[index] >= min_gap:
            return index
    return len(values)
