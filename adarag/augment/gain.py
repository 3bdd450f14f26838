"""Information gain of each retrieved chunk, and the chunks it keeps (IGP, arXiv 2601.17532).

A chunk's gain is how much it lowers the generator's uncertainty about the answer's first
token: the normalised top-K entropy of the question's next-token distribution with no context,
less the same with that chunk alone. A chunk that tells the model something sharpens the
distribution (gain > 0); one that does not leaves it as it was or blurs it (gain ≤ 0). No labels,
no training: τ, the gain a chunk must reach, is the one number calibration fits.

The distributions come from the cached KV (``Engine.query_over_contexts``): every chunk's
independent entry is already in the store, so scoring N chunks is one pass over the question's
tokens, batched over the N contexts. The logits arrive here as plain values (a numpy array, or
anything ``numpy.asarray`` reads, such as a CPU tensor): this layer does no tensor work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from adarag.errors import ConfigError

GainOrder = Literal["gain", "retrieval"]
"""How the kept chunks are listed: best gain first, or as the retriever ranked them."""

DEFAULT_TOP_K = 20
"""Tokens the normalised entropy is taken over (the top-K of the next-token distribution)."""

DEFAULT_THRESHOLD = 0.05
"""IGP's threshold: the hand-made τ a model without a calibrated one uses."""


def normalized_entropy(logits: Any, top_k: int = DEFAULT_TOP_K) -> np.ndarray:
    """Entropy of the top-``top_k`` tokens' renormalised distribution, over ``log(top_k)``.

    Args:
        logits: [n, vocab] next-token logits (an array, or what ``numpy.asarray`` reads).
        top_k: Tokens kept (at least 2).

    Returns:
        [n] float64 values in [0, 1]: 0 when one token takes all the mass, 1 when the top-K
        are equal.

    Raises:
        ConfigError: ``top_k`` is below 2.
    """
    if top_k < 2:
        raise ConfigError(f"the gain's top-K entropy needs at least 2 tokens, got {top_k}")
    values = np.asarray(logits, dtype=np.float64)
    num_top = min(top_k, values.shape[-1])
    top = -np.partition(-values, num_top - 1, axis=-1)[..., :num_top]
    shifted = top - top.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    entropy = -(np.exp(log_p) * log_p).sum(axis=-1)
    return np.clip(entropy / math.log(num_top), 0.0, 1.0)


def information_gain(logits: Any, top_k: int = DEFAULT_TOP_K) -> list[float]:
    """Each chunk's gain from the logits of ``[no context, chunk 1, ..., chunk N]``.

    Args:
        logits: [N + 1, vocab]: row 0 the question with no context, row i with chunk i alone.
        top_k: Tokens of the normalised entropy.

    Returns:
        N gains in [-1, 1], in the rows' order: positive when the chunk sharpens the
        distribution.
    """
    entropy = normalized_entropy(logits, top_k)
    return [float(entropy[0] - value) for value in entropy[1:]]


def kept_chunks(
    gains: Sequence[float],
    threshold: float,
    order: GainOrder = "gain",
    min_chunks: int = 1,
    max_chunks: int | None = None,
) -> list[int]:
    """Indices (into the retrieved list) of the chunks whose gain reaches τ, in ``order``.

    At least ``min_chunks`` are kept (the best gains, when fewer clear τ) and at most
    ``max_chunks`` (the best gains among those that do).

    Args:
        gains: Each retrieved chunk's gain, in retrieval order.
        threshold: τ.
        order: ``"gain"``: best gain first (ties in retrieval order); ``"retrieval"``: as
            retrieved.
        min_chunks: The floor (0 allows a prompt without context).
        max_chunks: The cap; None: no cap.
    """
    if order not in ("gain", "retrieval"):
        raise ConfigError(f"gain order must be 'gain' or 'retrieval', got {order!r}")
    ranked = sorted(range(len(gains)), key=lambda idx: (-gains[idx], idx))
    keep = [idx for idx in ranked if gains[idx] >= threshold]
    if len(keep) < min_chunks:
        keep = ranked[: min(min_chunks, len(ranked))]
    if max_chunks is not None:
        keep = keep[:max_chunks]
    return keep if order == "gain" else sorted(keep)
