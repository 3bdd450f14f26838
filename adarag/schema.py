"""Shared value types: chunks, prompt layouts, generation parameters and traces."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Tier = Literal["hard", "soft", "alternative", "variant", "fused", "independent", "miss"]
"""Where a chunk's KV came from: exact prefix, same effective prefix, a shorter run of the chunks
before it (FusionRAG's alternative path), a stored variant (Cache-Craft), computed after its
similar chunks (FusionRAG's fused entry), alone, or nowhere."""

StopReason = Literal["confident", "exhausted", "static", "no_context", "gain"]
"""Why augmentation stopped: confidence passed τ, all k chunks used, augmentation was off,
retrieval found nothing, or the chunks kept by information gain were prefilled at once."""


@dataclass(frozen=True)
class Chunk:
    """A piece of retrieved text.

    Attributes:
        text: The chunk's text as it goes into the prompt.
        chunk_id: Stable identifier from the knowledge base, when there is one.
        score: Retrieval similarity, higher is better, when known.
        metadata: Free-form source information (file, title, offsets).
    """

    text: str
    chunk_id: str | None = None
    score: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PromptLayout:
    """A prompt as token segments: ``[system prefix][chunk 1]...[chunk k][query suffix]``.

    Each segment is tokenized on its own, so a chunk's ids never depend on its neighbours. In
    a conversation the earlier turns follow the chunks as segments of their own (one per turn),
    so their KV is cached and reused like a chunk's; with citations each chunk is preceded by
    its number label (``[1] ``), a segment of its own so the chunk's ids stay those of its text.

    Attributes:
        system_ids: The system prefix.
        chunk_ids: Each chunk with its separator, best first.
        query_ids: The question and the template tail (assistant turn start).
        history_ids: Each earlier turn of a conversation, oldest first.
        chunk_labels: Each chunk's citation label, or empty without citations.
    """

    system_ids: tuple[int, ...]
    chunk_ids: tuple[tuple[int, ...], ...]
    query_ids: tuple[int, ...]
    history_ids: tuple[tuple[int, ...], ...] = ()
    chunk_labels: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        assert not self.chunk_labels or len(self.chunk_labels) == len(self.chunk_ids), (
            f"{len(self.chunk_labels)} labels for {len(self.chunk_ids)} chunks"
        )

    @property
    def cached_segments(self) -> tuple[tuple[int, ...], ...]:
        """The segments between the system prefix and the query suffix, whose KV is cached.

        Each chunk (after its label, with citations), then each earlier turn.
        """
        if self.chunk_labels:
            labelled = tuple(
                segment
                for label, chunk in zip(self.chunk_labels, self.chunk_ids, strict=True)
                for segment in (label, chunk)
            )
        else:
            labelled = self.chunk_ids
        return (*labelled, *self.history_ids)

    @property
    def chunk_segment_idx(self) -> tuple[int, ...]:
        """The index in :attr:`cached_segments` of each chunk."""
        stride = 2 if self.chunk_labels else 1
        return tuple(idx * stride + stride - 1 for idx in range(len(self.chunk_ids)))

    @property
    def segments(self) -> tuple[tuple[int, ...], ...]:
        """All segments in prompt order."""
        return (self.system_ids, *self.cached_segments, self.query_ids)

    @property
    def token_ids(self) -> list[int]:
        """The concatenated prompt."""
        return [token for segment in self.segments for token in segment]

    @property
    def cu_segments(self) -> list[int]:
        """Cumulative segment offsets, length ``num_segments + 1``."""
        offsets = [0]
        for segment in self.segments:
            offsets.append(offsets[-1] + len(segment))
        return offsets

    @property
    def num_tokens(self) -> int:
        """Prompt length in tokens."""
        return self.cu_segments[-1]

    def with_chunks(self, num_chunks: int) -> PromptLayout:
        """The same prompt keeping only the first ``num_chunks`` chunks (and every turn)."""
        return PromptLayout(
            self.system_ids,
            self.chunk_ids[:num_chunks],
            self.query_ids,
            self.history_ids,
            self.chunk_labels[:num_chunks],
        )

    def with_bridge(self, bridge_ids: tuple[int, ...], replaces: int = 0) -> PromptLayout:
        """The same prompt with ``bridge_ids`` (packet tokens) opening the query suffix.

        The bridge stands between the context and the question and is computed with the
        query, so the cached segments and their offsets are those of this prompt. It takes the
        place of the query suffix's first ``replaces`` tokens (0: it is inserted before them).
        """
        return replace(self, query_ids=(*bridge_ids, *self.query_ids[replaces:]))

    def with_trailers(self, trailer_ids: tuple[int, ...]) -> PromptLayout:
        """The same prompt with ``trailer_ids`` (packet tokens) closing every chunk.

        A trailer is part of its chunk's segment: cached, keyed and reused with it.
        """
        if not trailer_ids:
            return self
        return replace(self, chunk_ids=tuple((*ids, *trailer_ids) for ids in self.chunk_ids))


Seed = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]
"""A sampling seed: any value a 64-bit engine takes (signed or unsigned)."""


class GenerationParams(BaseModel):
    """Per-request decoding options."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_new_tokens: int = Field(default=64, ge=1, le=8192, description="Tokens to generate.")
    temperature: float = Field(default=0.0, ge=0.0, le=10.0, description="0 means greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    stop: tuple[str, ...] = Field(default=(), description="Strings that end the answer.")
    seed: Seed | None = Field(default=None, description="Sampling seed; None is nondeterministic.")


@dataclass(frozen=True)
class StepTrace:
    """One step of adaptive context augmentation (or the single step of a static prompt).

    Attributes:
        num_chunks: Chunks in the prompt at this step.
        confidence: Combined confidence in [0, 1], or None when it was not computed.
        kl_score: Normalised mean KL part of the uncertainty, in [0, 1].
        entropy_score: Normalised entropy part of the uncertainty, in [0, 1].
        num_processed_tokens: Prompt tokens run through at least one layer at this step.
        num_recomputed_tokens: Prompt tokens recomputed through every layer at this step.
        tiers: Tier of each chunk in the prompt at this step.
        prefill_s: Wall time of this step's prefill.
        confidence_s: Wall time of this step's confidence check.
        mean_kl: Raw mean logit-lens KL to the final layer (nats), before normalising.
        entropy: Raw entropy of the final next-token distribution (nats), before normalising.
        margin: Probability of the most likely first answer token minus the second's.
        answer_prefix: The first answer tokens decoded at this step (stop rules that compare
            steps' answers), else None.
        is_stable: Whether ``answer_prefix`` equals the previous step's (None without one).
        probability: Calibrated P(this step's answer equals the static top-k answer), or None.
        rungs: The recomputation ratios the step's fused prefill stood on under the routing
            ladder, its own first; more than one means it was routed up. Empty without a ladder.
        agreement_probability: The ladder's P(the answer equals full recomputation's) at the
            last rung it decided on, or None.
        reused_entropy: Entropy (nats) of the next-token distribution over the reused KV before
            any recomputation (what the ladder reads), or None.
    """

    num_chunks: int
    confidence: float | None
    kl_score: float | None
    entropy_score: float | None
    num_processed_tokens: int
    num_recomputed_tokens: int
    tiers: tuple[Tier, ...]
    prefill_s: float
    confidence_s: float
    mean_kl: float | None = None
    entropy: float | None = None
    margin: float | None = None
    answer_prefix: str | None = None
    is_stable: bool | None = None
    probability: float | None = None
    rungs: tuple[float, ...] = ()
    agreement_probability: float | None = None
    reused_entropy: float | None = None

    @property
    def routed(self) -> bool:
        """Whether the routing ladder recomputed more than the step's own ratio."""
        return len(self.rungs) > 1


@dataclass(frozen=True)
class QueryTrace:
    """What happened while answering one question.

    Attributes:
        steps: One entry per augmentation step (one for a static prompt).
        stop_reason: Why augmentation stopped.
        ttft_s: Seconds from the request to the first token (retrieval included).
        num_prompt_tokens: Tokens of the prompt the answer was decoded from.
        retrieval_s: Seconds spent retrieving.
        num_dropped_chunks: Retrieved chunks left out, lowest-ranked first, because the prompt
            would not fit the model's context with them.
        order_hint: The hint put before the question when the chunks were not listed in the
            retriever's order (``experimental.arrangement``); empty otherwise.
        chunk_gains: With ``augment.stop_rule = "gain"``, each scored chunk's information gain,
            in the order they were scored (the context as arranged and fitted); None otherwise.
        gain_s: Seconds the gains took (the chunks' KV, computed when absent, and the batched
            pass); None without them.
    """

    steps: tuple[StepTrace, ...]
    stop_reason: StopReason
    ttft_s: float
    num_prompt_tokens: int
    retrieval_s: float = 0.0
    num_dropped_chunks: int = 0
    order_hint: str = ""
    chunk_gains: tuple[float, ...] | None = None
    gain_s: float | None = None

    @property
    def num_chunks_used(self) -> int:
        """Chunks in the prompt the answer was decoded from."""
        return self.steps[-1].num_chunks if self.steps else 0

    @property
    def num_processed_tokens(self) -> int:
        """Prompt tokens processed over all steps."""
        return sum(step.num_processed_tokens for step in self.steps)

    @property
    def num_recomputed_tokens(self) -> int:
        """Prompt tokens recomputed over all steps."""
        return sum(step.num_recomputed_tokens for step in self.steps)

    @property
    def recomputed_ratio(self) -> float:
        """Recomputed tokens over the final prompt's tokens."""
        return self.num_recomputed_tokens / max(self.num_prompt_tokens, 1)


@dataclass(frozen=True)
class Answer:
    """An answer with the chunks it was conditioned on and its trace."""

    text: str
    chunks: tuple[Chunk, ...]
    trace: QueryTrace
    num_completion_tokens: int
    num_cached_tokens: int
