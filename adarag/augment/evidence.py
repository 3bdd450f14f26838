"""What one augmentation step reports, and the scores the controller gives it (plain values)."""

from __future__ import annotations

from dataclasses import dataclass

from adarag.augment.confidence import Confidence, LensSignals


@dataclass(frozen=True)
class StepResult:
    """What the caller reports for one step.

    Attributes:
        signals: Logit-lens KL and entropy of the last prompt token.
        num_processed_tokens: Prompt tokens run through any layer at this step.
        num_recomputed_tokens: Prompt tokens run through every layer at this step.
        prefill_s: Wall time of the step's prefill.
        confidence_s: Wall time of the step's lens reduction (and stability decode, if any).
        margin: Probability of the most likely first answer token minus the second's.
        answer_prefix: The first answer tokens decoded greedily from this step, when asked.
        is_stable: Whether ``answer_prefix`` equals the previous step's (None at step 1 or when
            no prefix was decoded).
        hidden: The last prompt token's residual stream at the depth probe's layers,
            concatenated, when the stop rule reads it (:mod:`adarag.augment.probe`).
        chunk_scores: The request's chunks' retrieval scores, best first (None where a chunk
            has none), when the stop rule reads them.
    """

    signals: LensSignals
    num_processed_tokens: int
    num_recomputed_tokens: int
    prefill_s: float
    confidence_s: float
    margin: float | None = None
    answer_prefix: tuple[int, ...] | None = None
    is_stable: bool | None = None
    hidden: tuple[float, ...] | None = None
    chunk_scores: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class ScoredStep:
    """A step, the confidence the controller gave it and, when calibrated, P(agreement).

    Attributes:
        num_chunks: Chunks in the prompt at this step.
        result: What the caller reported.
        confidence: The logit-lens confidence.
        scoring_s: Wall time of scoring.
        probability: Calibrated probability that this step's answer equals the static top-k
            answer, or None without an agreement model.
    """

    num_chunks: int
    result: StepResult
    confidence: Confidence
    scoring_s: float
    probability: float | None = None
