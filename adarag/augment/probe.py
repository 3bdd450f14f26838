"""The depth probe: P(no later depth answers better) from what a step already computed.

A step of adaptive augmentation already holds, at no extra forward pass, the last prompt
token's residual stream after every layer (the prefill keeps it for the logit lens), the lens
signals, the first-token margin, and the retrieval scores of the request's chunks. The probe
(fitted by ``adarag calibrate --depth``) maps them to the probability that no deeper step's
answer would be better than this one's; the ``probe`` stop rule stops at the first step whose
probability reaches its threshold.

The features (:func:`probe_values`): ``hidden_<i>``, the residual stream at the probe's layers
(concatenated, the pipeline hands it over as floats); ``entropy`` and ``mean_kl`` (the lens
signals); ``margin``; ``log_chunks``; ``score_ratio`` (the newest chunk's retrieval score over the
first's) and ``next_drop`` (its score minus the next chunk's, over the first's; 0 for the last
chunk or without scores).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from adarag.augment.confidence import mean
from adarag.augment.evidence import StepResult

SIGNALS = ("entropy", "mean_kl", "margin", "log_chunks", "score_ratio", "next_drop")
"""The probe's features besides the residual stream."""


def hidden_names(width: int) -> tuple[str, ...]:
    """Names of ``width`` residual-stream features."""
    return tuple(f"hidden_{idx}" for idx in range(width))


def probe_values(result: StepResult, num_chunks: int) -> dict[str, float]:
    """Every probe feature of a step by name (the residual stream's when the step carries it)."""
    values = dict(zip(hidden_names(len(result.hidden or ())), result.hidden or (), strict=True))
    scores = result.chunk_scores

    def score(idx: int) -> float | None:
        return scores[idx] if 0 <= idx < len(scores) else None

    first, newest, following = score(0), score(num_chunks - 1), score(num_chunks)
    ratio, drop = 1.0, 0.0
    if first and newest is not None:
        ratio = newest / first
        if following is not None:
            drop = (newest - following) / abs(first)
    values.update(
        entropy=result.signals.entropy,
        mean_kl=mean(result.signals.kl) if result.signals.kl else 0.0,
        margin=result.margin if result.margin is not None else 0.0,
        log_chunks=math.log(num_chunks),
        score_ratio=ratio,
        next_drop=drop,
    )
    return values


def row(values: dict[str, float], features: Sequence[str]) -> list[float]:
    """The values of ``features``, in order (a missing residual-stream feature is an error)."""
    return [values[name] for name in features]
