"""Which tokens a fused prefill recomputes: the user's rule, the research levers, one request's.

:class:`RecomputeSettings` is what a user sets (``cache.recompute``), :class:`RecomputeLevers` the
levers from the literature that are off by default (``experimental.recompute``), and
:class:`RecomputeConfig` both together: the selection one request carries to the engine
(``ForwardBatch.selection``), which also admits the benchmarks' controls.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from adarag.config.base import _Frozen

SelectionPolicy = Literal[
    "cross_attention",
    "kv_deviation",
    "query_attention",
    "query_deviation",
    "learned",
    "stored_rank",
]
"""The selection rules a user chooses from."""

ControlPolicy = Literal["random", "oracle", "output_oracle"]
"""Benchmark controls: reachable per request (:class:`RecomputeConfig`), not from the config."""


class RecomputeSettings(_Frozen):
    """How the tokens to recompute are chosen in a fused prefill (``cache.recompute``)."""

    selection_policy: SelectionPolicy = Field(
        default="query_deviation",
        description="'query_deviation' (the default, chosen on the fidelity calibration split "
        "by exact agreement with full recomputation and gold F1): CacheBlend's value deviation "
        "at the check layer weighted by the attention the query suffix pays each token (the "
        "first-order effect of a token's stale V on the query); 'kv_deviation': the value "
        "deviation alone (CacheBlend); 'cross_attention': AdaCache's first-layer cross-chunk "
        "attention ratio; 'query_attention': the query suffix's attention over the cached KV "
        "(A3, ProphetKV, FusionRAG); 'learned': a scorer fitted per model by `adarag "
        "calibrate --selector` on the output-aware oracle's choices, over each token's "
        "deviation at the check layer, the query's attention in every layer and its place in "
        "its chunk (read from the model's profile; query_deviation for a model without one); "
        "'stored_rank': the ranking stored with each cached chunk variant (Cache-Craft: its "
        "tokens' attention to the chunks before it when it was computed; other chunks score "
        "zero).",
    )
    target_agreement: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="Routing ladder: a request whose fused prefill is unlikely to answer as full "
        "recomputation would recomputes more, rung by rung, paying only the difference (the "
        "rungs, the agreement model and the thresholds that met this share of exact agreement "
        "with full recomputation on calibration questions come from the model's profile, fitted "
        "by `adarag calibrate --selector`). None: off. A model without a fitted ladder answers "
        "at its own ratio and says so once in the log.",
    )
    packet: Literal["auto", "on", "off"] = Field(
        default="off",
        description="Packet tokens (KV Packet's learned soft tokens): a prompt that reuses chunk "
        "KV computed elsewhere carries the model's fitted bridge, a few learned embeddings "
        "between the context and the question, computed with the query, so the reused path "
        "answers closer to full recomputation (fitted per model by `adarag calibrate --packet`, "
        "read from its profile). A prompt whose context is all its own (hard hits, full "
        "recomputation) never carries it. 'auto': use it when the profile has one and the "
        "engine is adarag's torch engine; 'on': the same, but refuse to start without one; "
        "'off' (the default, chosen on a selection split: SmolLM2's bridge lowers the "
        "first-token KL, but does not raise exact agreement): never.",
    )


class RecomputeLevers(_Frozen):
    """Research levers on top of any selection rule, off by default (``experimental.recompute``)."""

    deviation_check_layer: int = Field(
        default=1,
        ge=0,
        description="Layer whose V deviation ranks tokens (kv_deviation, query_deviation).",
    )
    query_layers: tuple[int, int] | None = Field(
        default=None,
        description="[first, last) layers whose query attention ranks tokens (query_attention); "
        "None reads every layer.",
    )
    query_last_layers: int | None = Field(
        default=None,
        ge=1,
        description="Score query_attention with only the model's last n layers (FusionRAG: 1, "
        "the final layer), whatever its depth; None uses query_layers. Set at most one of them.",
    )
    focus_window: int | None = Field(
        default=None,
        ge=1,
        description="Cache-Craft's focused-chunk early stop: once the chunks the query suffix "
        "attends to (entropy change point of its cumulative attention per chunk) have stayed "
        "the same for this many layers, the tokens of the other cached chunks are no longer "
        "recomputed in the layers above; None: recompute every layer.",
    )
    budget: Literal["per_chunk", "global"] = Field(
        default="global",
        description="'per_chunk': each cached chunk recomputes ceil(ratio x its tokens); "
        "'global' (the default, CacheBlend's choice and better on the calibration split): the "
        "same total goes to the best-scored tokens of all chunks together.",
    )
    max_chunk_ratio: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="With the global budget, the largest share of one chunk's tokens it may "
        "take (never below the chunk's own ratio); None: no cap.",
    )
    seed: int = Field(default=0, ge=0, description="Seed of the 'random' control.")
    chunk_start_tokens: int = Field(
        default=0,
        ge=0,
        le=256,
        description="Always recompute the first s tokens of each reused chunk, inside its "
        "budget (EPIC's LegoLink: a chunk encoded alone makes its first tokens attention sinks "
        "that a fused prompt does not have); 0: the rule alone decides.",
    )
    chunk_allocation: Literal["rule", "query"] = Field(
        default="rule",
        description="How the budget is split between reused chunks. 'rule': by the budget mode "
        "(per_chunk or global). 'query' (two-stage, ProphetKV/QCFuse): the query suffix's "
        "attention over the cached KV (at query_layers / query_last_layers) shares the total "
        "out between chunks, then each chunk keeps its best-scored tokens.",
    )
    layer_schedule: Literal["flat", "gradual"] = Field(
        default="flat",
        description="'flat': the chosen tokens run through every layer above the scoring "
        "layer. 'gradual' (CacheBlend's gradual filtering): layer l recomputes "
        "ratio x (1 + spread x (1 - 2l / (L - 1))) of the tokens, from more in the lower layers "
        "to fewer above (the mean over layers is the ratio); at each layer the tokens whose "
        "fresh V deviates least from the cached V stop being recomputed.",
    )
    layer_spread: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Slope of the gradual schedule: 0 is flat, 1 goes from twice the ratio at "
        "the first layer to none at the last.",
    )
    context_temperature: float = Field(
        default=1.0,
        gt=0.0,
        le=4.0,
        description="APE's attention temperature on reused chunk KV: keys of reused "
        "(not recomputed) positions are divided by it, so every later token attends to them at "
        "softmax scale 1 / (sqrt(d) x T); 1.0: off.",
    )
    context_scale: float = Field(
        default=1.0,
        gt=0.0,
        le=4.0,
        description="APE's scale on the attention mass of reused chunk KV (log(scale) added to "
        "the logits of reused positions, i.e. their log-sum-exp scaled before merging); 1.0: "
        "off. Other than 1.0 attention takes the torch path.",
    )

    span_tokens: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Recompute windows of this many tokens around the best-scored ones instead "
        "of isolated tokens (CacheClip's grouped windows): a token scores the best score within "
        "its window inside its chunk, ties going to the higher own score. 1: tokens alone.",
    )
    uncertain_entropy: float | None = Field(
        default=None,
        gt=0.0,
        description="Uncertainty routing: the query suffix first runs through every layer over "
        "the reused KV, and when the entropy (nats) of its next-token distribution exceeds this "
        "the request recomputes its reused chunks at uncertain_ratio instead of their own ratio "
        "(a model unsure of its answer is the one a small budget changes). None: off.",
    )
    uncertain_ratio: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="Recomputation ratio of every reused chunk of a request uncertain_entropy "
        "routes up (a chunk keeps its own ratio when that is higher); 1.0: full recomputation.",
    )

    @model_validator(mode="after")
    def _check_layers(self) -> RecomputeLevers:
        if self.query_layers is not None and self.query_last_layers is not None:
            raise ValueError(
                "set query_layers or query_last_layers, not both (query_last_layers counts from "
                "the model's last layer)"
            )
        if self.query_layers is not None and not 0 <= self.query_layers[0] < self.query_layers[1]:
            raise ValueError(
                f"query_layers must be [first, last) with 0 <= first < last, got "
                f"{list(self.query_layers)}"
            )
        return self


class RecomputeConfig(RecomputeSettings, RecomputeLevers):
    """One request's selection: the user's rule and the levers, as the engine reads them."""

    selection_policy: SelectionPolicy | ControlPolicy = Field(  # type: ignore[assignment]
        default="query_deviation",
        description="A rule of cache.recompute.selection_policy, or a benchmark control: "
        "'random' and 'oracle' (deviation from a full prefill); 'output_oracle' recomputes the "
        "positions a caller scored by how much they change the answer of a full prefill "
        "(adarag.evaluation.output_oracle).",
    )

    @classmethod
    def of(cls, settings: RecomputeSettings, levers: RecomputeLevers) -> RecomputeConfig:
        """The selection of a configuration's ``cache.recompute`` and ``experimental.recompute``."""
        return cls(**settings.model_dump(), **levers.model_dump())
