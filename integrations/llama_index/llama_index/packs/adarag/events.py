"""Instrumentation events of an adaptive answer: one per augmentation step, one at the stop."""

from __future__ import annotations

from llama_index.core.instrumentation.events import BaseEvent


class AdaptiveStepEvent(BaseEvent):
    """One step of adaptive context augmentation: the prompt's chunks and the model's confidence.

    Attributes:
        step_idx: 0-based step.
        num_chunks: Chunks in the prompt at this step.
        node_ids: Their node ids, in prompt order.
        confidence: Confidence in [0, 1], or None when it was not computed.
        tiers: Where each chunk's KV came from (hard, soft, independent, miss).
        num_recomputed_tokens: Prompt tokens recomputed through every layer.
        prefill_s: Seconds of this step's prefill.
    """

    step_idx: int
    num_chunks: int
    node_ids: list[str]
    confidence: float | None = None
    tiers: list[str]
    num_recomputed_tokens: int
    prefill_s: float

    @classmethod
    def class_name(cls) -> str:
        """Name of the event class."""
        return "AdaptiveStepEvent"


class AdaptiveStopEvent(BaseEvent):
    """Augmentation stopped; decoding starts from the chunks in :attr:`node_ids`.

    Attributes:
        stop_reason: ``confident``, ``exhausted``, ``static``, ``no_context`` or ``gain``.
        node_ids: Node ids of the chunks the answer is conditioned on.
        unused_node_ids: Retrieved nodes left out.
        confidence: The last step's confidence, or None.
        ttft_s: Seconds from the request to the first token.
        recomputed_ratio: Recomputed prompt tokens over the final prompt's tokens.
    """

    stop_reason: str
    node_ids: list[str]
    unused_node_ids: list[str]
    confidence: float | None = None
    ttft_s: float
    recomputed_ratio: float

    @classmethod
    def class_name(cls) -> str:
        """Name of the event class."""
        return "AdaptiveStopEvent"
